//! How a stage's rows are cut into global batches: one size throughout, or a batch ramp that
//! grows the size in whole increments over the stage's first rows (`docs/order.md#batch-ramps`).
//!
//! The sizes are a pure function of the batch's number within its segment, and so of the rows
//! read before it: a resumed stream continues the ramp from its position with nothing else
//! saved. A ramp with `k = (batch_size - start) / increment` steps holds step `i` (size
//! `b_i = start + i * increment`) for `ceil(rows / (k * b_i))` batches, so each step reads about
//! `rows / k` rows; the sizes are exact integers, no floating point decides a boundary.

use crate::config::RampSpec;

/// One run of equal batches: from batch `batch` (counted within the segment), which starts at
/// row `row`, every batch holds `size` rows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Step {
    batch: u64,
    row: u64,
    size: u64,
}

/// Global batches one round of local batches covers on `world_size` ranks: `world_size` (each
/// rank takes whole global batches in turn), or one in a ramp (whose global batches the ranks
/// share, each taking its part of every one).
pub fn batches_per_round(ramped: bool, world_size: u64) -> u64 {
    if ramped {
        1
    } else {
        world_size
    }
}

/// The batch sizes of a stage.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Batching {
    /// Runs in order; the last one lasts forever.
    steps: Vec<Step>,
}

impl Batching {
    /// Batches of `batch_size` rows, grown to that size by `ramp` when there is one. The ramp
    /// was validated with the config (`start < batch_size`, whole increments, bounded steps).
    pub fn new(batch_size: u64, ramp: Option<RampSpec>) -> Self {
        let mut steps = Vec::new();
        let (mut batch, mut row) = (0u64, 0u64);
        if let Some(ramp) = ramp {
            let k = (batch_size - ramp.start) / ramp.increment;
            for i in 0..k {
                let size = ramp.start + i * ramp.increment;
                // u128: k * size may pass 64 bits for absurd batch sizes; the count stays small.
                let per = u128::from(k) * u128::from(size);
                let batches = u128::from(ramp.rows).div_ceil(per) as u64;
                steps.push(Step { batch, row, size });
                // Saturating: only absurd sizes get near 64 bits, and positions that far are
                // refused by the cursor checks rather than wrapped.
                batch = batch.saturating_add(batches);
                row = row.saturating_add(batches.saturating_mul(size));
            }
        }
        steps.push(Step {
            batch,
            row,
            size: batch_size,
        });
        Batching { steps }
    }

    fn step(&self, t: u64) -> &Step {
        let i = self.steps.partition_point(|s| s.batch <= t);
        &self.steps[i - 1]
    }

    /// True when the sizes change (a ramp).
    pub fn is_ramp(&self) -> bool {
        self.steps.len() > 1
    }

    /// Every size a global batch of the stage has, smallest first: the ramp's steps, then
    /// `batch_size`.
    pub fn sizes(&self) -> Vec<u64> {
        self.steps.iter().map(|s| s.size).collect()
    }

    /// The largest batch: the stage's `batch_size`.
    pub fn max_size(&self) -> u64 {
        self.steps.last().expect("at least one step").size
    }

    /// Rows of batch `t` of the segment.
    pub fn size(&self, t: u64) -> u64 {
        self.step(t).size
    }

    /// Rows before batch `t` of the segment; `None` past 64 bits.
    pub fn start(&self, t: u64) -> Option<u64> {
        let s = self.step(t);
        (t - s.batch).checked_mul(s.size)?.checked_add(s.row)
    }

    /// Global batches one round of local batches covers on `world_size` ranks
    /// ([`batches_per_round`]).
    pub fn batches_per_round(&self, world_size: u64) -> u64 {
        batches_per_round(self.is_ramp(), world_size)
    }

    /// Every row count a rank's batch can have on `world_size` ranks, smallest first: the
    /// stage's `batch_size` (each rank takes whole global batches in turn), or in a ramp each
    /// size's share (`size / world_size`; a size that does not split is left out, as open
    /// refuses it).
    pub fn local_rows(&self, world_size: u64) -> Vec<u64> {
        if !self.is_ramp() {
            return vec![self.max_size()];
        }
        let world = world_size.max(1);
        self.sizes()
            .into_iter()
            .filter(|size| size % world == 0)
            .map(|size| size / world)
            .collect()
    }

    /// Complete batches within the first `rows` rows of the segment.
    pub fn whole_batches(&self, rows: u64) -> u64 {
        let i = self.steps.partition_point(|s| s.row <= rows);
        let s = &self.steps[i - 1];
        s.batch + (rows - s.row) / s.size
    }

    /// The segment's batches that `rows` rows fill, a final partial batch included.
    pub fn batches_covering(&self, rows: u64) -> u64 {
        let whole = self.whole_batches(rows);
        let start = self.start(whole).unwrap_or(u64::MAX);
        whole + u64::from(start < rows)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_ramp_is_shared_by_the_ranks_and_a_stage_without_one_is_not() {
        let ramp = RampSpec {
            start: 8,
            increment: 8,
            rows: 100,
        };
        let ramped = Batching::new(32, Some(ramp));
        assert_eq!(ramped.local_rows(4), [2, 4, 6, 8]);
        assert_eq!(ramped.local_rows(16), [1, 2]); // 8 and 24 do not split over 16
        assert_eq!(ramped.batches_per_round(4), 1);
        let plain = Batching::new(32, None);
        assert_eq!(
            (plain.local_rows(4), plain.batches_per_round(4)),
            (vec![32], 4)
        );
    }

    #[test]
    fn a_ramp_reads_about_rows_over_k_rows_per_step() {
        // 3 steps (8, 16, 24) to 32 over 1000 rows: ceil(1000 / 24) = 42 batches of 8, ...
        let b = Batching::new(
            32,
            Some(RampSpec {
                start: 8,
                increment: 8,
                rows: 1000,
            }),
        );
        let sizes: Vec<u64> = [0, 41, 42, 62, 63, 76, 77, 1000]
            .iter()
            .map(|&t| b.size(t))
            .collect();
        assert_eq!(sizes, [8, 8, 16, 16, 24, 24, 32, 32]);
        assert_eq!(b.start(42), Some(42 * 8));
        assert_eq!(b.start(77), Some(42 * 8 + 21 * 16 + 14 * 24));
        for t in 0..200 {
            let start = b.start(t).unwrap();
            assert_eq!(b.start(t + 1).unwrap(), start + b.size(t));
            assert_eq!(b.whole_batches(start), t);
            assert_eq!(b.whole_batches(start + b.size(t) - 1), t);
            assert_eq!(b.batches_covering(start + 1), t + 1);
            assert_eq!(b.batches_covering(start), t);
        }
    }

    #[test]
    fn no_ramp_is_one_size() {
        let b = Batching::new(5, None);
        assert!(!b.is_ramp());
        assert_eq!(
            (b.size(9), b.start(9), b.whole_batches(11)),
            (5, Some(45), 2)
        );
        assert_eq!(b.batches_covering(11), 3);
    }
}
