//! A source's own order: an endless sequence of epochs (one epoch in a finite stage), each a
//! pass over the source's shards, in listed order or, with shuffle, in an order permuted per
//! epoch from (seed, stage, source, epoch). Rows within a shard keep their order; the shuffle
//! window mixes them.
//!
//! With blocks, an epoch instead permutes runs of `block_rows` consecutive rows of the listed
//! source (a last, shorter run stays in place) by a keyed bijection: O(1) memory at any size,
//! and each run is read in one piece.

use std::sync::Arc;

use super::keyed::{key, shuffled, tag, Permutation};

/// Where a source's `q`-th row lives.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SourceRow {
    /// Pass over the source, from 0.
    pub epoch: u64,
    /// Shard index in the source's listed order.
    pub shard: usize,
    /// Row within the shard.
    pub row: u64,
}

/// The shard order of one epoch with cumulative row starts.
#[derive(Debug)]
pub struct EpochLayout {
    order: Vec<usize>,
    starts: Vec<u64>,
}

/// Order of one source of one stage.
#[derive(Debug, Clone)]
pub struct SourceOrder {
    rows: Vec<u64>,
    total: u64,
    permute: bool,
    /// Rows per block when an epoch permutes blocks rather than shards.
    block_rows: Option<u64>,
    key: u64,
    listed: Arc<EpochLayout>,
}

impl SourceOrder {
    /// A source with shards of `rows` rows each; `permute` shuffles each epoch, by shards or,
    /// with `block_rows`, by blocks of that many rows.
    pub fn new(
        rows: Vec<u64>,
        permute: bool,
        block_rows: Option<u64>,
        (seed, stage, source): (u64, usize, usize),
    ) -> Self {
        let listed = Arc::new(layout(&rows, (0..rows.len()).collect()));
        let tag = if block_rows.is_some() {
            tag::BLOCKS
        } else {
            tag::SHARDS
        };
        SourceOrder {
            total: rows.iter().sum(),
            rows,
            permute,
            block_rows: block_rows.filter(|_| permute).map(|b| b.max(1)),
            key: key(&[seed, tag, stage as u64, source as u64]),
            listed,
        }
    }

    /// The listed row shown at row `r` of `epoch`: `r` itself unless epochs permute blocks.
    pub fn epoch_row(&self, epoch: u64, r: u64) -> u64 {
        let Some(b) = self.block_rows else {
            return r;
        };
        let whole = self.total / b;
        let k = r / b;
        if k >= whole || whole < 2 {
            return r;
        }
        Permutation::new(whole, key(&[self.key, epoch])).apply(k) * b + r % b
    }

    /// Rows in one epoch.
    pub fn total(&self) -> u64 {
        self.total
    }

    /// The shard order of `epoch`.
    pub fn layout(&self, epoch: u64) -> Arc<EpochLayout> {
        if self.varies_by_epoch() {
            Arc::new(layout(
                &self.rows,
                shuffled(self.rows.len(), key(&[self.key, epoch])),
            ))
        } else {
            self.listed.clone()
        }
    }

    /// Whether epochs differ in shard order (so layouts are worth caching per epoch).
    pub fn varies_by_epoch(&self) -> bool {
        self.permute && self.block_rows.is_none() && self.rows.len() > 1
    }

    /// Row `r` of an epoch laid out as `layout`.
    pub fn locate(layout: &EpochLayout, epoch: u64, r: u64) -> SourceRow {
        let pos = layout.starts.partition_point(|&s| s <= r) - 1;
        SourceRow {
            epoch,
            shard: layout.order[pos],
            row: r - layout.starts[pos],
        }
    }

    /// Index of `(shard, row)` in the listed (unpermuted) order: a stable row number.
    pub fn listed_index(&self, shard: usize, row: u64) -> u64 {
        let pos = self
            .listed
            .order
            .iter()
            .position(|&s| s == shard)
            .unwrap_or(shard);
        self.listed.starts[pos] + row
    }
}

fn layout(rows: &[u64], order: Vec<usize>) -> EpochLayout {
    let mut starts = Vec::with_capacity(order.len());
    let mut acc = 0;
    for &s in &order {
        starts.push(acc);
        acc += rows[s];
    }
    EpochLayout { order, starts }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_epoch_covers_every_row_once() {
        let source = SourceOrder::new(vec![3, 0, 5, 2], true, None, (9, 0, 1));
        for epoch in 0..4 {
            let layout = source.layout(epoch);
            let mut seen: Vec<(usize, u64)> = (0..source.total())
                .map(|r| {
                    let at = SourceOrder::locate(&layout, epoch, r);
                    (at.shard, at.row)
                })
                .collect();
            seen.sort_unstable();
            let expected: Vec<(usize, u64)> = [(0, 3), (2, 5), (3, 2)]
                .iter()
                .flat_map(|&(s, n)| (0..n).map(move |r| (s, r)))
                .collect();
            assert_eq!(seen, expected);
        }
    }

    #[test]
    fn shard_order_changes_between_epochs_only_when_shuffled() {
        let shuffled = SourceOrder::new(vec![1; 20], true, None, (1, 0, 0));
        assert_ne!(shuffled.layout(0).order, shuffled.layout(1).order);
        let listed = SourceOrder::new(vec![1; 20], false, None, (1, 0, 0));
        assert_eq!(listed.layout(5).order, (0..20).collect::<Vec<_>>());
    }
}
