//! A source's own order: an endless sequence of epochs (one epoch in a finite stage), each a
//! pass over the source's shards, in listed order or, with shuffle, in an order permuted per
//! epoch from (seed, stage, source, epoch). Rows within a shard keep their order; the shuffle
//! window mixes them.
//!
//! With blocks, an epoch instead permutes the source's blocks: runs of `block_rows` rows from
//! each shard's start, so that a block is a shard's row groups or pages when `block_rows` is
//! theirs. The whole blocks of every shard are permuted by a keyed bijection (O(1) memory at any
//! size); each shard's last, shorter run follows them at the epoch's end, in listed order.

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
    /// When an epoch permutes blocks rather than shards: the rows per block and, by listed
    /// shard, the whole blocks and the tail rows of the shards before it.
    blocks: Option<Blocks>,
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
        let blocks = block_rows
            .filter(|_| permute)
            .map(|b| Blocks::new(&rows, b.max(1)));
        SourceOrder {
            total: rows.iter().sum(),
            rows,
            permute,
            blocks,
            key: key(&[seed, tag, stage as u64, source as u64]),
            listed,
        }
    }

    /// Where row `r` of `epoch` lives when epochs permute blocks; `None` when they do not.
    pub fn block_row(&self, epoch: u64, r: u64) -> Option<SourceRow> {
        let blocks = self.blocks.as_ref()?;
        let b = blocks.rows;
        let whole = *blocks.whole_before.last().unwrap_or(&0);
        let (shard, row) = if r < whole * b {
            let k = Permutation::new(whole, key(&[self.key, epoch])).apply(r / b);
            let shard = blocks.whole_before.partition_point(|&n| n <= k) - 1;
            (shard, (k - blocks.whole_before[shard]) * b + r % b)
        } else {
            let t = r - whole * b;
            let shard = blocks.tail_before.partition_point(|&n| n <= t) - 1;
            let full = (self.rows[shard] / b) * b;
            (shard, full + t - blocks.tail_before[shard])
        };
        Some(SourceRow { epoch, shard, row })
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
        self.permute && self.blocks.is_none() && self.rows.len() > 1
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

/// A source's shards cut into blocks from each shard's start.
#[derive(Debug, Clone)]
struct Blocks {
    rows: u64,
    /// `whole_before[i]`: whole blocks of the shards listed before shard `i` (one more entry,
    /// the total, at the end).
    whole_before: Vec<u64>,
    /// `tail_before[i]`: the rows after the whole blocks of the shards before shard `i`.
    tail_before: Vec<u64>,
}

impl Blocks {
    fn new(rows: &[u64], b: u64) -> Self {
        let (mut whole, mut tail) = (0u64, 0u64);
        let mut whole_before = Vec::with_capacity(rows.len() + 1);
        let mut tail_before = Vec::with_capacity(rows.len() + 1);
        for &n in rows {
            whole_before.push(whole);
            tail_before.push(tail);
            whole += n / b;
            tail += n % b;
        }
        whole_before.push(whole);
        tail_before.push(tail);
        Blocks {
            rows: b,
            whole_before,
            tail_before,
        }
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
