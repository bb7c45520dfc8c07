//! The footer: its metadata read and checked against the file before the Parquet reader trusts
//! it, the projected columns' roots and row groups ([`ParquetIndex`]), and row-group selection.

use std::ops::Range;

use parquet::arrow::arrow_reader::{RowSelection, RowSelector};

use parquet::arrow::arrow_reader::ArrowReaderMetadata;
use parquet::basic::Compression;
use parquet::file::metadata::ParquetMetaData;

use super::{format_error, DECODE_BATCH_BYTES, ENCODING, MAX_DECODE_BATCH_ROWS};
use crate::error::{Error, Result};

/// Footer metadata kept from inspection so units do not re-read it.
#[derive(Debug)]
pub struct ParquetIndex {
    pub(super) metadata: ArrowReaderMetadata,
    /// Index of each projected source among the file's root columns.
    pub(super) roots: Vec<usize>,
    /// First row of each row group, plus the total at the end.
    pub(super) group_starts: Vec<u64>,
    /// Rows decoded together: [`DECODE_BATCH_BYTES`] of the widest row group's projected rows.
    pub(super) batch_rows: u64,
}

/// Refuses a footer whose sizes and offsets cannot describe this file: negative or past its end.
/// The Parquet reader trusts them (and asserts on some), so they are checked before it runs.
/// Deepest nesting of a column (its path from the root, groups included) read or written here.
/// arrow-rs builds readers, writers and Arrow types by recursion over the schema, one stack frame
/// or more per level: a forged 1,000-level column overflows a thread's stack (the process dies),
/// so deeper schemas are refused before arrow-rs sees them. Training data nests a few levels.
#[allow(clippy::cast_possible_truncation)] // 64
pub const MAX_SCHEMA_DEPTH: usize = crate::limits::MAX_NESTING as usize;

/// Refuses a footer whose schema nests deeper than [`MAX_SCHEMA_DEPTH`], before any Arrow type
/// or reader is built from it.
pub(super) fn check_schema(metadata: &ParquetMetaData, path: &str) -> Result<()> {
    let schema = metadata.file_metadata().schema_descr();
    for column in schema.columns() {
        let depth = column.path().parts().len();
        if depth > MAX_SCHEMA_DEPTH {
            return Err(Error::Unsupported {
                path: path.to_owned(),
                encoding: ENCODING,
                message: format!(
                    "column '{}' nests {depth} levels deep, more than the {MAX_SCHEMA_DEPTH} supported",
                    column.path().parts()[..2].join(".")
                ),
            });
        }
    }
    Ok(())
}

pub(super) fn check_layout(metadata: &ParquetMetaData, file_size: u64, path: &str) -> Result<()> {
    let bad =
        |what: String| format_error(path, None, format!("the footer is inconsistent: {what}"));
    let mut rows = 0u64;
    for (g, group) in metadata.row_groups().iter().enumerate() {
        let group_rows = u64::try_from(group.num_rows())
            .map_err(|_| bad(format!("row group {g} has {} rows", group.num_rows())))?;
        rows = rows
            .checked_add(group_rows)
            .ok_or_else(|| bad("its row count overflows 64 bits".to_owned()))?;
        for column in group.columns() {
            let start = column
                .dictionary_page_offset()
                .unwrap_or_else(|| column.data_page_offset());
            let (Ok(start), Ok(len), Ok(_)) = (
                u64::try_from(start),
                u64::try_from(column.compressed_size()),
                u64::try_from(column.uncompressed_size()),
            ) else {
                return Err(bad(format!(
                    "column '{}' of row group {g} has a negative offset or size",
                    column.column_path()
                )));
            };
            if start.checked_add(len).is_none_or(|end| end > file_size) {
                return Err(bad(format!(
                    "column '{}' of row group {g} lies past the end of the {file_size}-byte file",
                    column.column_path()
                )));
            }
        }
    }
    Ok(())
}

/// Refuses, before any page is decoded, a shard whose columns among `roots` (all when `None`)
/// use a codec this build cannot decompress, naming the column and the codec.
pub(super) fn check_codecs(
    metadata: &ParquetMetaData,
    roots: Option<&[usize]>,
    path: &str,
) -> Result<()> {
    let wanted = |column_root: &str| {
        roots.is_none_or(|roots| {
            let fields = metadata
                .file_metadata()
                .schema_descr()
                .root_schema()
                .get_fields();
            roots.iter().any(|&r| fields[r].name() == column_root)
        })
    };
    for group in metadata.row_groups() {
        for column in group.columns() {
            let codec = column.compression();
            if matches!(codec, Compression::LZO) && wanted(&column.column_path().parts()[0]) {
                return Err(Error::Unsupported {
                    path: path.to_owned(),
                    encoding: ENCODING,
                    message: format!(
                        "column '{}' is compressed with {codec}, which no Parquet reader here \
                         decodes; rewrite the shard with Snappy, gzip, Brotli, LZ4 or zstd",
                        column.column_path()
                    ),
                });
            }
        }
    }
    Ok(())
}

/// Runs `f`, which drives the Parquet decoder over the shard at `path`. The decoder asserts on
/// some malformed pages instead of returning an error: such a panic is the shard's fault, and is
/// reported as a malformed shard, not as a crash, nor printed as one.
pub(super) fn guarded<T>(
    path: &str,
    row: Option<u64>,
    f: impl FnOnce() -> T,
) -> std::result::Result<T, Error> {
    crate::error::catch_quietly(f).map_err(|panic| {
        format_error(
            path,
            row,
            format!("the Parquet decoder failed on it: {panic}"),
        )
    })
}

/// Rows per decode batch: as many of the widest row group's rows (encoded bytes of the columns
/// named in `sources`, per row) as fit [`DECODE_BATCH_BYTES`], at least one.
pub(super) fn decode_batch_rows(metadata: &ParquetMetaData, sources: &[&str]) -> u64 {
    let widest = metadata
        .row_groups()
        .iter()
        .filter(|group| group.num_rows() > 0)
        .map(|group| {
            let bytes: u64 = group
                .columns()
                .iter()
                .filter(|c| sources.contains(&c.column_path().parts()[0].as_str()))
                .map(|c| c.uncompressed_size().max(0) as u64)
                .sum();
            bytes.div_ceil(group.num_rows() as u64)
        })
        .max()
        .unwrap_or(0);
    (DECODE_BATCH_BYTES / widest.max(1)).clamp(1, MAX_DECODE_BATCH_ROWS)
}

/// The row groups overlapping `ranges`, and a selection of exactly those rows within them.
pub(super) fn selection(starts: &[u64], ranges: &[Range<u64>]) -> (Vec<usize>, RowSelection) {
    let group_of = |row: u64| starts.partition_point(|&s| s <= row) - 1;
    let mut groups: Vec<usize> = Vec::new();
    for range in ranges {
        for g in group_of(range.start)..=group_of(range.end - 1) {
            if groups.last() != Some(&g) {
                groups.push(g);
            }
        }
    }
    // Rows of the selected groups, concatenated, are what the selection addresses.
    let mut concat_start = Vec::with_capacity(groups.len());
    let mut acc = 0u64;
    for &g in &groups {
        concat_start.push(acc);
        acc += starts[g + 1] - starts[g];
    }
    let to_concat = |row: u64| {
        let k = groups.partition_point(|&g| starts[g] <= row) - 1;
        concat_start[k] + (row - starts[groups[k]])
    };
    let mut selectors = Vec::with_capacity(ranges.len() * 2 + 1);
    let mut at = 0u64;
    for range in ranges {
        let (from, to) = (to_concat(range.start), to_concat(range.end - 1) + 1);
        if from > at {
            selectors.push(RowSelector::skip((from - at) as usize));
        }
        selectors.push(RowSelector::select((to - from) as usize));
        at = to;
    }
    if acc > at {
        selectors.push(RowSelector::skip((acc - at) as usize));
    }
    (groups, RowSelection::from(selectors))
}
