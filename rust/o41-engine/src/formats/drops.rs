//! Rows a field's overflow rule `drop` leaves out of a shard.
//!
//! Open scans each shard of such a stream once (`scan`), reading only the fields whose rule is
//! `drop`, and keeps the shard rows too long for them. From then on the shard is its kept rows:
//! its count, the order planned over it and the checkpoints taken of it hold those, so every
//! rank and every resume agrees on the stream without reading a row again. Reads map kept rows
//! back to the shard's own (`Dropped::file_ranges`).

use std::ops::Range;
use std::sync::Arc;

use crate::columns::{Chunk, ColumnBuf};
use crate::config::Overflow;
use crate::dtype::{DType, Scalar};
use crate::error::Result;
use crate::fields::{ProjectedColumn, Projection};
use crate::storage::Storage;

use super::{Prefetch, ReadFailure, ShardMeta, ShardReader};

/// Bytes of projected rows a scan decodes at once.
const SCAN_CHUNK_BYTES: usize = 4 << 20;
/// Rows a scan decodes at once at most.
const SCAN_CHUNK_ROWS: usize = 4096;

/// The shard rows left out, sorted; empty for almost every shard.
#[derive(Debug, Clone, Default)]
pub struct Dropped(Arc<[u64]>);

impl Dropped {
    /// Rows left out.
    pub fn len(&self) -> u64 {
        self.0.len() as u64
    }

    /// Whether no row is left out.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// Left-out rows before kept row `kept`'s place in the shard: the `i`th left-out row has
    /// `row - i` kept rows before it, which never decreases, so a binary search finds them.
    fn before(&self, kept: u64) -> usize {
        let mut lo = 0;
        let mut hi = self.0.len();
        while lo < hi {
            let mid = usize::midpoint(lo, hi);
            if self.0[mid] - mid as u64 <= kept {
                lo = mid + 1;
            } else {
                hi = mid;
            }
        }
        lo
    }

    /// The shard row of kept row `kept`.
    pub fn file_row(&self, kept: u64) -> u64 {
        kept + self.before(kept) as u64
    }

    /// The shard rows of kept rows `ranges` (sorted, disjoint), as sorted, disjoint ranges.
    pub fn file_ranges(&self, ranges: &[Range<u64>]) -> Vec<Range<u64>> {
        if self.0.is_empty() {
            return ranges.to_vec();
        }
        let mut out: Vec<Range<u64>> = Vec::with_capacity(ranges.len());
        for range in ranges {
            let mut kept = range.start;
            while kept < range.end {
                let j = self.before(kept);
                let start = kept + j as u64;
                // Up to the next left-out row, or the range's end.
                let run = self.0.get(j).map_or(range.end - kept, |&next| {
                    (next - start).min(range.end - kept)
                });
                match out.last_mut() {
                    Some(last) if last.end == start => last.end += run,
                    _ => out.push(start..start + run),
                }
                kept += run;
            }
        }
        out
    }
}

impl From<Vec<u64>> for Dropped {
    fn from(rows: Vec<u64>) -> Self {
        Dropped(rows.into())
    }
}

/// Whether any of `projection`'s columns leaves out rows too long for it.
pub fn drops_rows(projection: &Projection) -> bool {
    projection
        .columns
        .iter()
        .any(|c| c.overflow == Overflow::Drop)
}

/// `projection` with its `drop` rules read as truncation (for checks of a record that may be
/// left out); `None` when no field drops rows.
pub(super) fn kept_as_truncated(projection: &Projection) -> Option<Projection> {
    drops_rows(projection).then(|| Projection {
        columns: projection
            .columns
            .iter()
            .map(|c| {
                let mut c = c.clone();
                if c.overflow == Overflow::Drop {
                    c.overflow = Overflow::Truncate;
                }
                c
            })
            .collect(),
    })
}

/// Finds the rows of the shard `meta` describes (all of them, before any is left out) that are
/// too long for a field of `projection` whose rule is `drop`, in one pass: each such field is
/// read (truncated) with its length beside it, as `@length` reads one. Any other fault of those
/// fields fails the scan, as it would fail the read.
pub(super) fn scan(
    storage: &Storage,
    path: &str,
    meta: &ShardMeta,
    projection: &Projection,
) -> Result<Vec<u64>> {
    let limits: Vec<usize> = projection
        .columns
        .iter()
        .filter(|c| c.overflow == Overflow::Drop)
        .map(|c| c.shape[0])
        .collect();
    let truncated = kept_as_truncated(projection).expect("a scan is for fields that drop rows");
    let dropping: Vec<&ProjectedColumn> = truncated
        .columns
        .iter()
        .zip(&projection.columns)
        .filter(|(_, c)| c.overflow == Overflow::Drop)
        .map(|(t, _)| t)
        .collect();
    // The lists, then their lengths (unbounded: the axis is what they are compared with).
    let mut columns: Vec<ProjectedColumn> = dropping.iter().map(|&c| c.clone()).collect();
    columns.extend(dropping.iter().map(|&c| ProjectedColumn {
        dtype: DType::I64,
        shape: Vec::new(),
        width: 1,
        pad: Scalar::Int(0),
        measure: Some(usize::MAX),
        ..c.clone()
    }));
    let scanning = Projection { columns };
    let row_bytes = scanning.row_bytes().max(1);
    let chunk_rows = (SCAN_CHUNK_BYTES / row_bytes).clamp(1, SCAN_CHUNK_ROWS);
    let mut reader = super::open(storage, path, meta, None)?;
    let mut chunk = Chunk::padded(&scanning, chunk_rows);
    let mut dropped = Vec::new();
    let mut row = 0u64;
    while row < meta.rows {
        storage.cancel().check(path)?;
        let end = (row + chunk_rows as u64).min(meta.rows);
        reader
            .read_ranges(
                std::slice::from_ref(&(row..end)),
                &scanning,
                &mut chunk,
                None,
            )
            .map_err(|failure| failure.error)?;
        let lengths = &chunk.columns[limits.len()..];
        for k in 0..(end - row) as usize {
            let too_long = lengths
                .iter()
                .zip(&limits)
                .any(|(column, &limit)| matches!(column, ColumnBuf::I64(v) if v[k] > limit as i64));
            if too_long {
                dropped.push(row + k as u64);
            }
        }
        row = end;
    }
    Ok(dropped)
}

/// Reads a shard's kept rows: the ranges asked for are kept rows, read as the shard's own.
pub(super) struct Kept {
    pub(super) reader: Box<dyn ShardReader>,
    pub(super) dropped: Dropped,
}

impl ShardReader for Kept {
    fn read_ranges(
        &mut self,
        ranges: &[Range<u64>],
        projection: &Projection,
        chunk: &mut Chunk,
        prefetched: Option<Prefetch>,
    ) -> std::result::Result<(), ReadFailure> {
        let ranges = self.dropped.file_ranges(ranges);
        self.reader
            .read_ranges(&ranges, projection, chunk, prefetched)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        #[test]
        fn kept_rows_map_to_the_rows_not_left_out(
            rows in 1u64..200,
            picks in proptest::collection::vec(0u64..200, 0..40),
            cuts in proptest::collection::vec(0u64..200, 0..6),
        ) {
            let mut left: Vec<u64> = picks.into_iter().filter(|&r| r < rows).collect();
            left.sort_unstable();
            left.dedup();
            let kept: Vec<u64> = (0..rows).filter(|r| left.binary_search(r).is_err()).collect();
            let dropped = Dropped(left.into());
            for (k, &file) in kept.iter().enumerate() {
                prop_assert_eq!(dropped.file_row(k as u64), file);
            }
            // Ranges of kept rows cover exactly their rows, in order.
            let mut bounds: Vec<u64> = cuts.into_iter().map(|c| c % (kept.len() as u64 + 1)).collect();
            bounds.push(0);
            bounds.push(kept.len() as u64);
            bounds.sort_unstable();
            bounds.dedup();
            let ranges: Vec<Range<u64>> = bounds.windows(2).step_by(2).map(|w| w[0]..w[1]).collect();
            let want: Vec<u64> = ranges.iter().flat_map(|r| r.clone().map(|k| kept[k as usize])).collect();
            let got: Vec<u64> = dropped.file_ranges(&ranges).into_iter().flatten().collect();
            prop_assert_eq!(got, want);
        }
    }
}
