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

impl ParquetIndex {
    /// Units never cross a row group, so each decodes one group's pages only.
    pub fn unit_ranges(&self, unit_rows: u64) -> Vec<Range<u64>> {
        let mut out = Vec::new();
        for w in self.group_starts.windows(2) {
            let mut start = w[0];
            while start < w[1] {
                let end = (start + unit_rows).min(w[1]);
                out.push(start..end);
                start = end;
            }
        }
        out
    }
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
    let index = Arc::new(ParquetIndex {
        metadata,
        roots,
        group_starts,
    });
    let meta = ShardMeta {
        rows,
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
        reader.read_into(0..1, projection, &mut chunk)?;
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
    fn read_into(
        &mut self,
        range: Range<u64>,
        projection: &Projection,
        chunk: &mut Chunk,
    ) -> Result<()> {
        // The builder takes its reader by value; a cloned handle shares the open file.
        let file = self
            .file
            .try_clone()
            .map_err(|e| Error::io(&self.path, e))?;
        read_range(file, &self.index, range, projection, chunk, &self.path)
    }
}

fn read_range(
    file: File,
    index: &ParquetIndex,
    range: Range<u64>,
    projection: &Projection,
    chunk: &mut Chunk,
    path: &str,
) -> Result<()> {
    let starts = &index.group_starts;
    // Row groups overlapping the range, and the selection within them.
    let first = starts.partition_point(|&s| s <= range.start) - 1;
    let mut groups = Vec::new();
    let mut g = first;
    while g + 1 < starts.len() && starts[g] < range.end {
        groups.push(g);
        g += 1;
    }
    let base = starts[first];
    let covered_end = starts[g];
    let mut selectors = Vec::with_capacity(3);
    if range.start > base {
        selectors.push(RowSelector::skip((range.start - base) as usize));
    }
    selectors.push(RowSelector::select((range.end - range.start) as usize));
    if covered_end > range.end {
        selectors.push(RowSelector::skip((covered_end - range.end) as usize));
    }
    let mask = ProjectionMask::roots(
        index.metadata.metadata().file_metadata().schema_descr(),
        index.roots.iter().copied(),
    );
    let reader = ParquetRecordBatchReaderBuilder::new_with_metadata(file, index.metadata.clone())
        .with_row_groups(groups)
        .with_row_selection(RowSelection::from(selectors))
        .with_projection(mask)
        .with_batch_size((range.end - range.start) as usize)
        .build()
        .map_err(|e| format_error(path, Some(range.start), e))?;
    let mut out_row = 0usize;
    for batch in reader {
        let batch = batch.map_err(|e| format_error(path, Some(range.start + out_row as u64), e))?;
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
                range.start + out_row as u64,
            )?;
        }
        out_row += n;
    }
    if out_row as u64 != range.end - range.start {
        return Err(format_error(
            path,
            Some(range.start),
            format!(
                "expected {} rows, decoded {out_row}",
                range.end - range.start
            ),
        ));
    }
    Ok(())
}
