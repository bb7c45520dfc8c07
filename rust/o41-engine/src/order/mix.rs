//! The weighted interleave of a stage's sources: which source mixed row `p` comes from, and
//! which row of that source it is, computed in O(1) for any `p` (no replay).
//!
//! Weights become small integers (scaled so the smallest is 1000 units, then divided by their
//! greatest common divisor). A smooth weighted round-robin over integer weights is periodic with
//! period `sum(weights)`: after one period every source was picked exactly its weight and the
//! round-robin state is back to zero. One period is tabulated at open, with running counts every
//! 64 positions, so `p` maps to (period, offset) and then to a table lookup. Every prefix holds
//! each source's share to within one row.
//!
//! In a finite stage a source that runs out leaves the mix: the schedule is a list of segments,
//! each a fresh round-robin over the sources still active, at most one segment per source.

use crate::error::{Error, Result};

const WEIGHT_SCALE: f64 = 1000.0;
const MAX_PERIOD: u64 = 1 << 22;
const PREFIX_STRIDE: usize = 64;

/// One period of a smooth weighted round-robin.
#[derive(Debug, Clone)]
struct MixTable {
    weights: Vec<u64>,
    period: u64,
    picks: Vec<u32>,
    occurrences: Vec<Vec<u32>>,
    /// `prefix[c * n + i]`: picks of source `i` in `picks[..c * PREFIX_STRIDE]`.
    prefix: Vec<u32>,
}

/// Greatest common divisor (of the weights here; of unit and batch sizes in `stage`).
pub(super) fn gcd(a: u64, b: u64) -> u64 {
    if b == 0 {
        a
    } else {
        gcd(b, a % b)
    }
}

/// Integer weights with the same ratios, as small as the scale allows.
fn integer_weights(weights: &[f64], option: &str) -> Result<Vec<u64>> {
    let min = weights.iter().copied().fold(f64::INFINITY, f64::min);
    let scaled: Vec<u64> = weights
        .iter()
        .map(|w| ((w / min) * WEIGHT_SCALE).round().max(1.0) as u64)
        .collect();
    let g = scaled.iter().copied().fold(0, gcd);
    let reduced: Vec<u64> = scaled.iter().map(|w| w / g).collect();
    let period: u64 = reduced.iter().sum();
    if period > MAX_PERIOD {
        return Err(Error::config(
            option,
            format!(
                "weights {weights:?} are too far apart to interleave exactly (period {period} > {MAX_PERIOD}); \
                 round them to simpler ratios"
            ),
        ));
    }
    Ok(reduced)
}

impl MixTable {
    fn new(weights: Vec<u64>) -> Self {
        let n = weights.len();
        let period: u64 = weights.iter().sum();
        let total = period as i64;
        let mut current = vec![0i64; n];
        let mut picks = Vec::with_capacity(period as usize);
        let mut occurrences = vec![Vec::new(); n];
        let mut prefix = Vec::with_capacity((period as usize / PREFIX_STRIDE + 1) * n);
        let mut counts = vec![0u32; n];
        for m in 0..period as usize {
            if m % PREFIX_STRIDE == 0 {
                prefix.extend_from_slice(&counts);
            }
            let mut best = 0;
            for i in 0..n {
                current[i] += weights[i] as i64;
                if current[i] > current[best] {
                    best = i;
                }
            }
            current[best] -= total;
            picks.push(best as u32);
            occurrences[best].push(m as u32);
            counts[best] += 1;
        }
        debug_assert!(
            current.iter().all(|&c| c == 0),
            "one period returns to the start"
        );
        if (period as usize).is_multiple_of(PREFIX_STRIDE) {
            prefix.extend_from_slice(&counts);
        }
        MixTable {
            weights,
            period,
            picks,
            occurrences,
            prefix,
        }
    }

    /// Picks of source `i` among the first `m` positions of a period (`m <= period`).
    fn count_before(&self, i: usize, m: u64) -> u64 {
        if m == self.period {
            return self.weights[i];
        }
        let n = self.weights.len();
        let c = m as usize / PREFIX_STRIDE;
        let from = c * PREFIX_STRIDE;
        let walked = self.picks[from..m as usize]
            .iter()
            .filter(|&&s| s as usize == i)
            .count();
        u64::from(self.prefix[c * n + i]) + walked as u64
    }

    /// Picks of source `i` among the first `x` positions of the endless sequence.
    fn count(&self, i: usize, x: u64) -> u64 {
        (x / self.period) * self.weights[i] + self.count_before(i, x % self.period)
    }

    /// Position just after the `k`-th pick (1-based) of source `i`.
    fn end_of_pick(&self, i: usize, k: u64) -> u64 {
        let w = self.weights[i];
        let (full, rem) = ((k - 1) / w, (k - 1) % w);
        full * self.period + u64::from(self.occurrences[i][rem as usize]) + 1
    }
}

#[derive(Debug, Clone)]
struct MixSegment {
    start: u64,
    end: Option<u64>,
    /// Stage source index of each local source.
    sources: Vec<usize>,
    /// Rows taken from every stage source before `start`.
    base: Vec<u64>,
    table: MixTable,
}

/// Where each mixed row of a stage comes from.
#[derive(Debug, Clone)]
pub struct MixSchedule {
    segments: Vec<MixSegment>,
    total: Option<u64>,
    /// Sources mixed, so that every count lists each, also for a mix of no rows at all.
    sources: usize,
}

impl MixSchedule {
    /// The schedule over sources with `weights` and, for a finite stage, their row counts
    /// (`rows[j]` for source `j`); `None` for an infinite stage. `option` names the stage.
    pub fn new(weights: &[f64], rows: Option<&[u64]>, option: &str) -> Result<Self> {
        let all: Vec<usize> = (0..weights.len()).collect();
        let Some(rows) = rows else {
            let table = MixTable::new(integer_weights(weights, option)?);
            return Ok(MixSchedule {
                segments: vec![MixSegment {
                    start: 0,
                    end: None,
                    sources: all,
                    base: vec![0; weights.len()],
                    table,
                }],
                total: None,
                sources: weights.len(),
            });
        };
        let mut segments = Vec::new();
        let mut active: Vec<usize> = all.into_iter().filter(|&j| rows[j] > 0).collect();
        let mut base = vec![0u64; weights.len()];
        let mut start = 0u64;
        while !active.is_empty() {
            let local: Vec<f64> = active.iter().map(|&j| weights[j]).collect();
            let table = MixTable::new(integer_weights(&local, option)?);
            let len = active
                .iter()
                .enumerate()
                .map(|(i, &j)| table.end_of_pick(i, rows[j] - base[j]))
                .min()
                .expect("active sources");
            let mut next_base = base.clone();
            for (i, &j) in active.iter().enumerate() {
                next_base[j] += table.count(i, len);
            }
            segments.push(MixSegment {
                start,
                end: Some(start + len),
                sources: active.clone(),
                base: base.clone(),
                table,
            });
            start += len;
            base = next_base;
            active.retain(|&j| base[j] < rows[j]);
        }
        Ok(MixSchedule {
            segments,
            total: Some(start),
            sources: weights.len(),
        })
    }

    /// Total mixed rows of a finite stage; `None` for an infinite one.
    pub fn total(&self) -> Option<u64> {
        self.total
    }

    fn segment(&self, p: u64) -> &MixSegment {
        let idx = self.segments.partition_point(|s| s.start <= p) - 1;
        &self.segments[idx]
    }

    /// Source `j` and its row index `q` for mixed row `p`.
    pub fn locate(&self, p: u64) -> (usize, u64) {
        let seg = self.segment(p);
        let x = p - seg.start;
        let i = seg.table.picks[(x % seg.table.period) as usize] as usize;
        let j = seg.sources[i];
        (j, seg.base[j] + seg.table.count(i, x))
    }

    /// Rows taken from every source among mixed rows `[0, p)`.
    pub fn counts(&self, p: u64) -> Vec<u64> {
        let p = self.total.map_or(p, |t| p.min(t));
        let Some(seg) = self.segments.iter().rev().find(|s| s.start <= p) else {
            // A finite mix of no rows (each partition's share of a source smaller than one row).
            return vec![0; self.sources];
        };
        let mut out = seg.base.clone();
        let x = p - seg.start;
        if seg.end.is_some_and(|e| p >= e) {
            // Past the last segment of a finite stage: every source is exhausted.
            for (i, &j) in seg.sources.iter().enumerate() {
                out[j] += seg.table.count(i, seg.end.unwrap_or(p) - seg.start);
            }
            return out;
        }
        for (i, &j) in seg.sources.iter().enumerate() {
            out[j] += seg.table.count(i, x);
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sequence(s: &MixSchedule, n: u64) -> Vec<(usize, u64)> {
        (0..n).map(|p| s.locate(p)).collect()
    }

    #[test]
    fn a_mix_of_no_rows_counts_none_of_each_source() {
        let empty = MixSchedule::new(&[1.0, 3.0], Some(&[0, 0]), "stages[0]").unwrap();
        assert_eq!(empty.counts(0), [0, 0]);
        assert_eq!(empty.counts(5), [0, 0]);
    }

    #[test]
    fn three_to_one_interleaves_smoothly() {
        let s = MixSchedule::new(&[3.0, 1.0], None, "s").unwrap();
        let picks: Vec<usize> = sequence(&s, 8).into_iter().map(|(j, _)| j).collect();
        assert_eq!(picks, vec![0, 0, 1, 0, 0, 0, 1, 0]);
    }

    #[test]
    fn prefixes_hold_each_share_within_one_row() {
        let weights = [5.0, 2.0, 1.5];
        let total: f64 = weights.iter().sum();
        let s = MixSchedule::new(&weights, None, "s").unwrap();
        let mut counts = [0.0; 3];
        for p in 0..10_000u64 {
            let (j, q) = s.locate(p);
            assert_eq!(q, counts[j] as u64);
            counts[j] += 1.0;
            for (k, w) in weights.iter().enumerate() {
                let expected = (p + 1) as f64 * w / total;
                assert!((counts[k] - expected).abs() <= 1.0, "p={p} k={k}");
            }
        }
        assert_eq!(s.counts(10_000), counts.map(|c| c as u64).to_vec());
    }

    #[test]
    fn finite_sources_are_read_exactly_once_and_leave_the_mix() {
        let rows = [10u64, 3, 7];
        let s = MixSchedule::new(&[1.0, 1.0, 2.0], Some(&rows), "s").unwrap();
        assert_eq!(s.total(), Some(20));
        let mut seen: Vec<Vec<u64>> = vec![Vec::new(); 3];
        for p in 0..20 {
            let (j, q) = s.locate(p);
            seen[j].push(q);
        }
        for (j, n) in rows.iter().enumerate() {
            assert_eq!(seen[j], (0..*n).collect::<Vec<_>>());
        }
        assert_eq!(s.counts(20), rows.to_vec());
        assert_eq!(s.counts(5).iter().sum::<u64>(), 5);
    }

    #[test]
    fn extreme_weight_ratios_are_refused() {
        assert!(MixSchedule::new(&[1.0, 1e9], None, "stages[0]").is_err());
    }
}
