//! Parquet shards: row counts from the footer, projected columns only, row-group and page
//! level seeking through a row selection.

use std::fs::File;
use std::ops::Range;
use std::sync::Arc;

use parquet::arrow::arrow_reader::{
    ArrowReaderMetadata, ArrowReaderOptions, ParquetRecordBatchReaderBuilder, RowSelection,
    RowSelector,
};
use parquet::arrow::ProjectionMask;
use parquet::file::metadata::PageIndexPolicy;

use super::{ShardIndex, ShardMeta, ShardReader};
use crate::columns::Chunk;
use crate::error::{Error, Result};
use crate::projection::{project_arrow_column, Projection};

const ENCODING: &str = "parquet";

/// Footer metadata kept from inspection so units do not re-read it.
#[derive(Debug)]
pub struct ParquetIndex {
    metadata: ArrowReaderMetadata,
    /// Index of each projected source among the file's root columns.
    roots: Vec<usize>,
    /// First row of each row group, plus the total at the end.
    group_starts: Vec<u64>,
}

fn format_error(path: &str, row: Option<u64>, e: impl std::fmt::Display) -> Error {
    Error::Format {
        path: path.to_owned(),
        encoding: ENCODING,
        row,
        message: e.to_string(),
    }
}

fn open_file(path: &str) -> Result<File> {
    File::open(path).map_err(|e| Error::io(path, e))
}

pub fn inspect(path: &str, projection: &Projection) -> Result<ShardMeta> {
    let file = open_file(path)?;
    let options = ArrowReaderOptions::new().with_offset_index_policy(PageIndexPolicy::Optional);
    let metadata =
        ArrowReaderMetadata::load(&file, options).map_err(|e| format_error(path, None, e))?;
    let schema = metadata.schema().clone();
    let mut roots = Vec::with_capacity(projection.columns.len());
    for column in &projection.columns {
        let idx = schema.index_of(&column.source).map_err(|_| {
            let names: Vec<&str> = schema.fields().iter().map(|f| f.name().as_str()).collect();
            Error::Projection {
                path: path.to_owned(),
                row: 0,
                field: column.name.clone(),
                source_field: column.source.clone(),
                message: format!(
                    "the shard has no such column (columns: {})",
                    names.join(", ")
                ),
            }
        })?;
        roots.push(idx);
    }
    let mut group_starts = vec![0u64];
    for group in metadata.metadata().row_groups() {
        let last = *group_starts.last().expect("starts with 0");
        group_starts.push(last + group.num_rows() as u64);
    }
    let rows = *group_starts.last().expect("starts with 0");
    let sources: Vec<&str> = projection
        .columns
        .iter()
        .map(|c| c.source.as_str())
        .collect();
    let largest_group = metadata
        .metadata()
        .row_groups()
        .iter()
        .map(|group| {
            group
                .columns()
                .iter()
                .filter(|c| sources.contains(&c.column_path().parts()[0].as_str()))
                // Compressed pages, decompressed pages, and the Arrow arrays decoded from them.
                .map(|c| (c.compressed_size() + 2 * c.uncompressed_size()).max(0) as u64)
                .sum::<u64>()
        })
        .max()
        .unwrap_or(0);
    let index = Arc::new(ParquetIndex {
        metadata,
        roots,
        group_starts,
    });
    let meta = ShardMeta {
        rows,
        // A job spans at most two row groups (it holds at most one group's worth of rows).
        scratch_bytes: 2 * largest_group,
        index: ShardIndex::Parquet(index.clone()),
    };
    if rows > 0 {
        // Decoding the first record checks every projected column's type now, not mid-run.
        let mut reader = Reader {
            path: path.to_owned(),
            file,
            index,
        };
        let mut chunk = Chunk::padded(projection, 1);
        reader.read_ranges(std::slice::from_ref(&(0..1)), projection, &mut chunk)?;
    }
    Ok(meta)
}

/// Reads row ranges of one Parquet file.
pub struct Reader {
    path: String,
    file: File,
    index: Arc<ParquetIndex>,
}

impl Reader {
    pub fn open(path: &str, index: Arc<ParquetIndex>) -> Result<Self> {
        Ok(Reader {
            path: path.to_owned(),
            file: open_file(path)?,
            index,
        })
    }
}

impl ShardReader for Reader {
    fn read_ranges(
        &mut self,
        ranges: &[Range<u64>],
        projection: &Projection,
        chunk: &mut Chunk,
    ) -> Result<()> {
        // The builder takes its reader by value; a cloned handle shares the open file.
        let file = self
            .file
            .try_clone()
            .map_err(|e| Error::io(&self.path, e))?;
        read_ranges(file, &self.index, ranges, projection, chunk, &self.path)
    }
}

/// The row groups overlapping `ranges`, and a selection of exactly those rows within them.
fn selection(starts: &[u64], ranges: &[Range<u64>]) -> (Vec<usize>, RowSelection) {
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

fn read_ranges(
    file: File,
    index: &ParquetIndex,
    ranges: &[Range<u64>],
    projection: &Projection,
    chunk: &mut Chunk,
    path: &str,
) -> Result<()> {
    let wanted: u64 = ranges.iter().map(|r| r.end - r.start).sum();
    if wanted == 0 {
        return Ok(());
    }
    let (groups, selection) = selection(&index.group_starts, ranges);
    let first_row = ranges[0].start;
    let mask = ProjectionMask::roots(
        index.metadata.metadata().file_metadata().schema_descr(),
        index.roots.iter().copied(),
    );
    let reader = ParquetRecordBatchReaderBuilder::new_with_metadata(file, index.metadata.clone())
        .with_row_groups(groups)
        .with_row_selection(selection)
        .with_projection(mask)
        .with_batch_size(wanted.min(8192) as usize)
        .build()
        .map_err(|e| format_error(path, Some(first_row), e))?;
    // Rows arrive in file order; errors name the shard row, found through this table.
    let shard_rows: Vec<u64> = ranges.iter().flat_map(Clone::clone).collect();
    let at = |out_row: usize| shard_rows.get(out_row).copied().unwrap_or(first_row);
    let mut out_row = 0usize;
    for batch in reader {
        let batch = batch.map_err(|e| format_error(path, Some(at(out_row)), e))?;
        let n = batch.num_rows();
        for (k, column) in projection.columns.iter().enumerate() {
            let array = batch
                .column_by_name(&column.source)
                .expect("projected root columns are in the batch");
            project_arrow_column(
                array.as_ref(),
                column,
                0..n,
                &mut chunk.columns[k],
                out_row,
                path,
                0,
            )
            .map_err(|e| match e {
                Error::Projection {
                    path,
                    row,
                    field,
                    source_field,
                    message,
                } => Error::Projection {
                    path,
                    row: at(out_row + row as usize),
                    field,
                    source_field,
                    message,
                },
                other => other,
            })?;
        }
        out_row += n;
    }
    if out_row as u64 != wanted {
        return Err(format_error(
            path,
            Some(first_row),
            format!("expected {wanted} rows, decoded {out_row}"),
        ));
    }
    Ok(())
}
