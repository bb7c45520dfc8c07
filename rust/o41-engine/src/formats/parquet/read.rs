//! Reading rows: a job's row ranges selected by row group and page and decoded into column
//! chunks, and every column of a shard in record batches (`iter_shard`).

use std::fs::File;
use std::ops::Range;
use std::sync::Arc;

use arrow_array::RecordBatch;
use parquet::arrow::arrow_reader::{
    ParquetRecordBatchReader, ParquetRecordBatchReaderBuilder, RowSelectionPolicy,
};
use parquet::arrow::ProjectionMask;
use parquet::errors::ParquetError;
use parquet::file::reader::ChunkReader;

use super::fetch::{load_metadata, ArcReader, Fetched, Prefetched, MERGE_GAP};
use super::footer::{check_codecs, guarded, selection, ParquetIndex};
use super::guard;
use super::metered::metered;
use super::{decode_error, format_error};
use crate::columns::Chunk;
use crate::error::{Error, Result};
use crate::fields::Projection;
use crate::formats::page_cache::PageCache;
use crate::formats::{Prefetch, ReadFailure, ShardReader};
use crate::from_arrow::project_arrow_column;
use crate::storage::{Object, PendingPieces};

/// Reads row ranges of one Parquet file.
pub struct Reader {
    pub(super) path: String,
    pub(super) object: Arc<Object>,
    /// A local shard's file: a job the pipeline planned reads its pages from it into memory
    /// ([`super::fetch::prefetch`]); other reads go through it page by page.
    pub(super) file: Option<Arc<File>>,
    pub(super) index: Arc<ParquetIndex>,
    /// Where a remote shard's reusable pages are kept, with the shard's key there.
    pub(super) pages: Option<(Arc<PageCache>, String)>,
}

impl Reader {
    pub fn open(object: Arc<Object>, index: Arc<ParquetIndex>) -> Self {
        Reader {
            path: object.uri().to_owned(),
            file: object.local_file().cloned(),
            object,
            index,
            pages: None,
        }
    }

    /// Takes pages from `cache` and keeps there the pages later jobs may read again.
    pub fn with_pages(mut self, cache: Option<&Arc<PageCache>>) -> Self {
        self.pages = cache.map(|c| (c.clone(), PageCache::key_of(&self.object)));
        self
    }
}

impl ShardReader for Reader {
    fn read_ranges(
        &mut self,
        ranges: &[Range<u64>],
        projection: &Projection,
        chunk: &mut Chunk,
        prefetched: Option<Prefetch>,
    ) -> std::result::Result<(), ReadFailure> {
        let path = self.path.clone();
        let first = ranges.first().map(|r| r.start);
        guarded(&path, first, || {
            self.read_ranges_unguarded(ranges, projection, chunk, prefetched)
        })?
    }
}

impl Reader {
    /// Reads a local shard page by page where it reads so, else through arrow-rs; `open` gives
    /// each reader its handle on the file.
    pub(in crate::formats) fn read_local<R: ChunkReader + 'static>(
        &self,
        open: impl Fn() -> Result<R>,
        ranges: &[Range<u64>],
        projection: &Projection,
        chunk: &mut Chunk,
    ) -> std::result::Result<(), ReadFailure> {
        let direct = Arc::new(open()?);
        self.check_pages(direct.as_ref(), ranges, projection)?;
        if let Some(done) = read_direct(
            &direct,
            &self.index,
            ranges,
            projection,
            (chunk, &self.path),
        ) {
            return done;
        }
        read_ranges(open()?, &self.index, ranges, projection, chunk, &self.path)
    }

    /// Checks the page headers decoding `ranges` reads ([`guard::check_pages`]): arrow-rs
    /// allocates what they declare before it looks at the bytes.
    fn check_pages(
        &self,
        reader: &impl ChunkReader,
        ranges: &[Range<u64>],
        projection: &Projection,
    ) -> Result<()> {
        let pages = self.index.pages(ranges, projection).0;
        guard::check_pages(reader, self.index.metadata.metadata(), &pages)
            .map_err(|m| format_error(&self.path, ranges.first().map(|r| r.start), m))
    }

    pub(in crate::formats) fn read_ranges_unguarded(
        &mut self,
        ranges: &[Range<u64>],
        projection: &Projection,
        chunk: &mut Chunk,
        prefetched: Option<Prefetch>,
    ) -> std::result::Result<(), ReadFailure> {
        if ranges.iter().all(Range::is_empty) {
            return Ok(());
        }
        if let (Some(file), None) = (&self.file, &prefetched) {
            // Each reader takes its own handle; a cloned handle shares the open file.
            return match self.object.meter() {
                Some(meter) => self.read_local(|| metered(file, meter), ranges, projection, chunk),
                None => self.read_local(
                    || file.try_clone().map_err(|e| Error::io(&self.path, e)),
                    ranges,
                    projection,
                    chunk,
                ),
            };
        }
        let (mut pieces, plan) = if let Some(Prefetch(prefetched)) = prefetched {
            let Prefetched {
                pending,
                mut plan,
                promised,
            } = prefetched;
            let mut pieces = pending
                .map(PendingPieces::wait)
                .transpose()?
                .unwrap_or_default();
            if !plan.fetch.is_empty() {
                // A local shard's pages, read now; those promised at dispatch are kept for the
                // jobs waiting on them.
                let read = self.object.read_pieces(&std::mem::take(&mut plan.fetch))?;
                if let Some(promised) = &promised {
                    promised.keep(&read);
                }
                pieces.extend(read);
            }
            drop(promised);
            (pieces, plan)
        } else {
            let mut plan =
                self.index
                    .fetch_plan(ranges, projection, self.pages.as_ref(), MERGE_GAP);
            let pieces = self.object.read_pieces(&std::mem::take(&mut plan.fetch))?;
            if let Some((cache, key)) = &self.pages {
                cache.keep(key, &plan.keep, &pieces);
            }
            (pieces, plan)
        };
        pieces.extend(plan.into_cached_pieces(self.pages.as_ref(), self.object.cancel()));
        let fetched = Arc::new(Fetched::from_pieces(self.object.clone(), pieces));
        if let Err(e) = self.check_pages(fetched.as_ref(), ranges, projection) {
            return Err(fetched.take_failure().unwrap_or(e).into());
        }
        if let Some(done) = read_direct(
            &fetched,
            &self.index,
            ranges,
            projection,
            (chunk, &self.path),
        ) {
            return done;
        }
        read_ranges(
            ArcReader(fetched.clone()),
            &self.index,
            ranges,
            projection,
            chunk,
            &self.path,
        )
        .map_err(|failure| match fetched.take_failure() {
            // A storage failure behind a decoding error is what the user must see.
            Some(error) => ReadFailure {
                rows_done: failure.rows_done,
                error,
            },
            None => failure,
        })
    }
}

/// Reads `ranges` page by page where every projected column is laid out so
/// (`direct`); `None` where one is not, or the pages do not read so: arrow-rs then
/// reads them, and reports what is wrong.
pub(super) fn read_direct<R: ChunkReader + 'static>(
    reader: &Arc<R>,
    index: &ParquetIndex,
    ranges: &[Range<u64>],
    projection: &Projection,
    (chunk, path): (&mut Chunk, &str),
) -> Option<std::result::Result<(), ReadFailure>> {
    crate::formats::parquet::direct::read(
        reader,
        index.metadata.metadata(),
        index.metadata.schema().fields(),
        (&index.group_starts, ranges),
        projection,
        (chunk, path),
    )
    .ok()
    .flatten()
}

pub(super) fn read_ranges<R: ChunkReader + 'static>(
    file: R,
    index: &ParquetIndex,
    ranges: &[Range<u64>],
    projection: &Projection,
    chunk: &mut Chunk,
    path: &str,
) -> std::result::Result<(), ReadFailure> {
    let wanted: u64 = ranges.iter().map(|r| r.end - r.start).sum();
    if wanted == 0 {
        return Ok(());
    }
    let first_row = ranges[0].start;
    let reader = selected_rows(file, index, ranges, wanted.min(index.batch_rows) as usize)
        .map_err(|e| decode_error(path, Some(first_row), &e))?;
    // Rows arrive in file order; errors name the shard row, found through this table.
    let shard_rows: Vec<u64> = ranges.iter().flat_map(Clone::clone).collect();
    let at = |out_row: usize| shard_rows.get(out_row).copied().unwrap_or(first_row);
    let mut out_row = 0usize;
    for batch in reader {
        let batch = batch.map_err(|e| ReadFailure {
            rows_done: out_row,
            error: decode_error(path, Some(at(out_row)), e),
        })?;
        let n = batch.num_rows();
        // Every column is projected up to its own first bad value, so that the rows before the
        // earliest one are whole in every column and still count as decoded.
        let mut earliest: Option<(usize, Error)> = None;
        for (k, column) in projection.columns.iter().enumerate() {
            let array = batch
                .column_by_name(&column.source)
                .expect("projected root columns are in the batch");
            let projected = project_arrow_column(
                array.as_ref(),
                column,
                0..n,
                &mut chunk.columns[k],
                out_row,
                path,
                0,
            );
            let error = match projected {
                Ok(()) => continue,
                Err(Error::Projection {
                    path,
                    row,
                    field,
                    source_field,
                    message,
                }) => (
                    row as usize,
                    Error::Projection {
                        path,
                        row: at(out_row + row as usize),
                        field,
                        source_field,
                        message,
                    },
                ),
                Err(other) => (0, other),
            };
            if earliest.as_ref().is_none_or(|(row, _)| error.0 < *row) {
                earliest = Some(error);
            }
        }
        if let Some((row, error)) = earliest {
            return Err(ReadFailure {
                rows_done: out_row + row,
                error,
            });
        }
        out_row += n;
    }
    if out_row as u64 != wanted {
        return Err(ReadFailure {
            rows_done: out_row,
            error: format_error(
                path,
                Some(at(out_row)),
                format!("expected {wanted} rows, decoded {out_row}"),
            ),
        });
    }
    Ok(())
}

/// A decoder of rows `ranges` (sorted, disjoint) of the columns `index` projects, in batches of
/// `batch_rows`.
pub(super) fn selected_rows<R: ChunkReader + 'static>(
    file: R,
    index: &ParquetIndex,
    ranges: &[Range<u64>],
    batch_rows: usize,
) -> std::result::Result<ParquetRecordBatchReader, ParquetError> {
    let (groups, selection) = selection(&index.group_starts, ranges);
    let mask = ProjectionMask::roots(
        index.metadata.metadata().file_metadata().schema_descr(),
        index.roots.iter().copied(),
    );
    ParquetRecordBatchReaderBuilder::new_with_metadata(file, index.metadata.clone())
        .with_row_groups(groups)
        .with_row_selection(selection)
        // Skip and read run by run. The default policy turns a selection of many short runs (a
        // rank's share of shuffled units at a large world size) into a mask over every row from
        // the first run to the last, decoding whole row groups to keep a few rows of each.
        .with_row_selection_policy(RowSelectionPolicy::Selectors)
        .with_projection(mask)
        .with_batch_size(batch_rows)
        .build()
}

/// Every column of a shard, in record batches of up to a given number of rows: what
/// `iter_shard` reads. Remote shards fetch each column chunk when the decoder reaches it.
pub struct Batches {
    pub(super) path: String,
    pub(super) reader: ParquetRecordBatchReader,
    /// The remote bytes source, asked for the storage error behind a decoding failure.
    pub(super) fetched: Option<Arc<Fetched>>,
    pub(super) next_row: u64,
}

impl Batches {
    /// Opens `object` at its first row.
    pub fn open(object: &Arc<Object>, batch_rows: usize) -> Result<Self> {
        guarded(object.uri(), None, || {
            Self::open_unguarded(object, batch_rows)
        })?
    }

    pub(in crate::formats) fn open_unguarded(
        object: &Arc<Object>,
        batch_rows: usize,
    ) -> Result<Self> {
        let path = object.uri().to_owned();
        let metadata = load_metadata(object)?;
        check_codecs(metadata.metadata(), None, &path)?;
        let (built, fetched) = if let Some(file) = object.local_file() {
            let file = file.try_clone().map_err(|e| Error::io(&path, e))?;
            // Remote shards' pages are not checked here: that would be a request per page.
            let chunks: Vec<Range<u64>> = (metadata.metadata().row_groups().iter())
                .flat_map(parquet::file::metadata::RowGroupMetaData::columns)
                .map(parquet::file::metadata::ColumnChunkMetaData::byte_range)
                .map(|(start, len)| start..start + len)
                .collect();
            guard::check_pages(&file, metadata.metadata(), &chunks)
                .map_err(|m| format_error(&path, None, m))?;
            let builder = ParquetRecordBatchReaderBuilder::new_with_metadata(file, metadata);
            (builder.with_batch_size(batch_rows).build(), None)
        } else {
            let fetched = Arc::new(Fetched::from_pieces(object.clone(), Vec::new()));
            let builder = ParquetRecordBatchReaderBuilder::new_with_metadata(
                ArcReader(fetched.clone()),
                metadata,
            );
            (builder.with_batch_size(batch_rows).build(), Some(fetched))
        };
        let reader = built.map_err(|e| decode_error(&path, Some(0), &e))?;
        Ok(Batches {
            path,
            reader,
            fetched,
            next_row: 0,
        })
    }

    /// The next batch of rows; `None` after the last.
    pub fn next_batch(&mut self) -> Result<Option<RecordBatch>> {
        let path = self.path.clone();
        let row = Some(self.next_row);
        guarded(&path, row, || self.next_batch_unguarded())?
    }

    pub(in crate::formats) fn next_batch_unguarded(&mut self) -> Result<Option<RecordBatch>> {
        match self.reader.next() {
            None => Ok(None),
            Some(Ok(batch)) => {
                self.next_row += batch.num_rows() as u64;
                Ok(Some(batch))
            }
            Some(Err(e)) => Err(self
                .fetched
                .as_ref()
                .and_then(|f| f.take_failure())
                .unwrap_or_else(|| decode_error(&self.path, Some(self.next_row), e))),
        }
    }
}
