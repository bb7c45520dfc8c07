//! Parquet shards, read and written: row counts from the footer, projected columns only,
//! row-group and page level seeking through a row selection. Every standard codec reads; a
//! codec this build lacks (LZO) is an unsupported feature, not a malformed shard.

use std::fs::File;
use std::io::Write;
use std::ops::Range;
use std::sync::{Arc, Mutex};

use bytes::{Buf, Bytes};

use arrow_array::cast::AsArray;
use arrow_array::types::{
    Int16Type, Int32Type, Int64Type, Int8Type, UInt16Type, UInt32Type, UInt64Type, UInt8Type,
};
use arrow_array::{Array, OffsetSizeTrait, RecordBatch};
use arrow_schema::{DataType, SchemaRef};
use parquet::arrow::arrow_reader::{
    ArrowReaderMetadata, ArrowReaderOptions, ParquetRecordBatchReader,
    ParquetRecordBatchReaderBuilder, RowSelection, RowSelectionPolicy, RowSelector,
};
use parquet::arrow::{ArrowWriter, ProjectionMask};
use parquet::basic::{Compression, ZstdLevel};
use parquet::errors::ParquetError;
use parquet::file::metadata::{KeyValue, PageIndexPolicy, ParquetMetaData};
use parquet::file::properties::WriterProperties;
use parquet::file::reader::{ChunkReader, Length};

use super::page_cache::{Lookup, PageCache};
use super::{Prefetch, ReadFailure, ShardIndex, ShardMeta, ShardReader};
use crate::cancel::Cancel;
use crate::columns::Chunk;
use crate::error::{Error, Result};
use crate::fields::Projection;
use crate::from_arrow::project_arrow_column;
use crate::metrics::Meter;
use crate::storage::Pin;
use crate::storage::{Object, PendingPieces, Pieces, Tallied};

/// Bytes fetched from the end of a remote shard at open: the footer and, for shards written by
/// the saver, the page index before it, in one request.
const REMOTE_TAIL_BYTES: u64 = 256 << 10;

const ENCODING: &str = "parquet";

/// Encoded bytes of the projected columns one decode batch holds at most. A job is decoded in
/// batches of about this size rather than all at once, so a decode thread's transient Arrow
/// arrays and level buffers stay a few MiB whatever the job's length (rows with a 1,500-token
/// list and its mask: about 300 rows a batch).
const DECODE_BATCH_BYTES: u64 = 1 << 20;

/// Rows of one decode batch at most, however narrow the rows.
const MAX_DECODE_BATCH_ROWS: u64 = 8192;

/// Footer metadata kept from inspection so units do not re-read it.
#[derive(Debug)]
pub struct ParquetIndex {
    metadata: ArrowReaderMetadata,
    /// Index of each projected source among the file's root columns.
    roots: Vec<usize>,
    /// First row of each row group, plus the total at the end.
    group_starts: Vec<u64>,
    /// Rows decoded together: [`DECODE_BATCH_BYTES`] of the widest row group's projected rows.
    batch_rows: u64,
}

impl ParquetIndex {
    /// Byte ranges to fetch before decoding the rows of `ranges` in `groups`: for each
    /// projected column, its dictionary page and the data pages holding those rows (whole
    /// column chunks where the shard has no page index), with nearby ranges merged.
    fn fetch_ranges(&self, ranges: &[Range<u64>], projection: &Projection) -> Vec<Range<u64>> {
        merge_ranges(self.pages(ranges, projection).0)
    }

    /// The byte ranges decoding the rows of `ranges` reads, unmerged (see
    /// [`ParquetIndex::fetch_ranges`]), and among them the pages a later job of the same row
    /// groups is likely to read again: each column chunk's dictionary page, and its last page
    /// read where more pages follow.
    fn pages(
        &self,
        ranges: &[Range<u64>],
        projection: &Projection,
    ) -> (Vec<Range<u64>>, Vec<Range<u64>>) {
        let (groups, _) = selection(&self.group_starts, ranges);
        let metadata = self.metadata.metadata();
        let starts = &self.group_starts;
        let mut out: Vec<Range<u64>> = Vec::new();
        let mut reused: Vec<Range<u64>> = Vec::new();
        for &g in &groups {
            let (first, end) = (starts[g], starts[g + 1]);
            // The selected rows of this group, relative to its first row.
            let wanted: Vec<Range<u64>> = ranges
                .iter()
                .filter(|r| r.start < end && r.end > first)
                .map(|r| r.start.max(first) - first..r.end.min(end) - first)
                .collect();
            let pages = metadata.page_index();
            for (c, column) in metadata.row_group(g).columns().iter().enumerate() {
                let root = &column.column_path().parts()[0];
                if !projection.columns.iter().any(|p| &p.source == root) {
                    continue;
                }
                let (start, len) = column.byte_range();
                let Some(locations) = pages.and_then(|p| p.offset_index(g, c)).map(
                    parquet::file::page_index::offset_index::OffsetIndexMetaData::page_locations,
                ) else {
                    out.push(start..start + len);
                    continue;
                };
                if let Some(first_page) = locations.first() {
                    if (first_page.offset as u64) > start {
                        let dictionary = start..first_page.offset as u64;
                        out.push(dictionary.clone());
                        reused.push(dictionary);
                    }
                }
                let mut last = None;
                for (k, page) in locations.iter().enumerate() {
                    let from = page.first_row_index as u64;
                    let to = locations
                        .get(k + 1)
                        .map_or(end - first, |next| next.first_row_index as u64);
                    if wanted.iter().any(|w| w.start < to && w.end > from) {
                        let offset = page.offset as u64;
                        out.push(offset..offset + page.compressed_page_size as u64);
                        last = Some(k);
                    }
                }
                if let Some(k) = last.filter(|&k| k + 1 < locations.len()) {
                    let page = &locations[k];
                    reused.push(
                        page.offset as u64..(page.offset as u64 + page.compressed_page_size as u64),
                    );
                }
            }
        }
        (out, reused)
    }

    /// What decoding the rows of `ranges` fetches, after taking what it can from `cache`
    /// (with the shard's key there).
    fn fetch_plan(
        &self,
        ranges: &[Range<u64>],
        projection: &Projection,
        cache: Option<&(Arc<PageCache>, String)>,
    ) -> FetchPlan {
        let (needed, reused) = self.pages(ranges, projection);
        let Some((cache, key)) = cache else {
            return FetchPlan {
                cached: Vec::new(),
                expected: Vec::new(),
                fetch: merge_ranges(needed),
                keep: Vec::new(),
            };
        };
        let mut cached = Vec::new();
        let mut expected = Vec::new();
        let mut fetch = Vec::with_capacity(needed.len());
        for range in needed {
            match cache.get(key, &range) {
                Lookup::Held(bytes) => cached.push((range.start, bytes)),
                Lookup::Coming => expected.push(range),
                Lookup::Missing => fetch.push(range),
            }
        }
        let fetch = merge_ranges(fetch);
        // A page inside a gap that merging closed comes with the request anyway: taking it
        // from the cache too would only overlap the fetched pieces.
        let fetched = |at: &u64| fetch.iter().any(|r| r.contains(at));
        cached.retain(|(at, _)| !fetched(at));
        expected.retain(|r| !fetched(&r.start));
        let keep = reused.into_iter().filter(|r| fetched(&r.start)).collect();
        FetchPlan {
            cached,
            expected,
            fetch,
            keep,
        }
    }

    /// The row group holding `row`.
    pub fn group_of(&self, row: u64) -> u64 {
        (self.group_starts.partition_point(|&s| s <= row) - 1) as u64
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

/// A decoder's error (from the Parquet reader, or through Arrow, which keeps only its text): a
/// feature this build lacks is unsupported, anything else is a malformed shard.
fn decode_error(path: &str, row: Option<u64>, e: impl std::fmt::Display) -> Error {
    let message = e.to_string();
    if message.contains("NYI") || message.contains("Disabled feature") {
        return Error::Unsupported {
            path: path.to_owned(),
            encoding: ENCODING,
            message,
        };
    }
    format_error(path, row, message)
}

/// Refuses a footer whose sizes and offsets cannot describe this file: negative or past its end.
/// The Parquet reader trusts them (and asserts on some), so they are checked before it runs.
fn check_layout(metadata: &ParquetMetaData, file_size: u64, path: &str) -> Result<()> {
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
fn check_codecs(metadata: &ParquetMetaData, roots: Option<&[usize]>, path: &str) -> Result<()> {
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

/// Bytes `start..start + len` of `parts` (pieces in offset order) where they hold them: a view
/// of one piece when it holds them all, else a copy of the consecutive pieces that do.
pub(super) fn held(parts: &[(u64, Bytes)], start: u64, len: u64) -> Option<Bytes> {
    let end = start + len;
    let k = parts.partition_point(|(at, _)| *at <= start);
    if k == 0 {
        return None;
    }
    let (at, bytes) = &parts[k - 1];
    if end <= at + bytes.len() as u64 {
        let from = (start - at) as usize;
        return Some(bytes.slice(from..from + len as usize));
    }
    let mut out = Vec::with_capacity(len as usize);
    let mut next = start;
    for (at, bytes) in &parts[k - 1..] {
        let piece_end = at + bytes.len() as u64;
        if *at > next || next >= end {
            break;
        }
        if piece_end <= next {
            continue;
        }
        let take = piece_end.min(end);
        out.extend_from_slice(&bytes[(next - at) as usize..(take - at) as usize]);
        next = take;
    }
    (next == end).then(|| Bytes::from(out))
}

/// Byte ranges of a remote object fetched ahead of decoding, served to the Parquet reader as if
/// they were the file. A read outside them is fetched on demand; its failure is kept so the
/// caller reports the storage error rather than a decoding error.
struct Fetched {
    object: Arc<Object>,
    parts: Vec<(u64, Bytes)>,
    failure: Mutex<Option<Error>>,
}

impl Fetched {
    fn new(object: Arc<Object>, ranges: &[Range<u64>]) -> Result<Self> {
        let pieces = object.read_pieces(ranges)?;
        Ok(Self::from_pieces(object, pieces))
    }

    fn from_pieces(object: Arc<Object>, mut parts: Vec<(u64, Bytes)>) -> Self {
        parts.sort_by_key(|(at, _)| *at);
        Fetched {
            parts,
            object,
            failure: Mutex::new(None),
        }
    }

    /// Bytes `start..start + len`: what the pieces hold ([`held`]), else (outside what was
    /// fetched) a remote read.
    fn slice(&self, start: u64, len: u64) -> parquet::errors::Result<Bytes> {
        if let Some(bytes) = held(&self.parts, start, len) {
            return Ok(bytes);
        }
        let end = start + len;
        self.object.read_range(start..end).map_err(|e| {
            let message = e.to_string();
            *self
                .failure
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner) = Some(e);
            ParquetError::General(message)
        })
    }

    /// The storage error behind a decoding failure, if there was one.
    fn take_failure(&self) -> Option<Error> {
        self.failure
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .take()
    }
}

impl Length for Fetched {
    fn len(&self) -> u64 {
        self.object.size()
    }
}

impl ChunkReader for Fetched {
    type T = bytes::buf::Reader<Bytes>;

    fn get_read(&self, start: u64) -> parquet::errors::Result<Self::T> {
        // To the end of the fetched run of consecutive pieces that holds `start`.
        let k = self.parts.partition_point(|(at, _)| *at <= start);
        let mut end = self.object.size();
        if k > 0 && start < self.parts[k - 1].0 + self.parts[k - 1].1.len() as u64 {
            end = self.parts[k - 1].0 + self.parts[k - 1].1.len() as u64;
            for (at, bytes) in &self.parts[k..] {
                if *at != end {
                    break;
                }
                end += bytes.len() as u64;
            }
        }
        Ok(self.slice(start, end - start)?.reader())
    }

    fn get_bytes(&self, start: u64, length: usize) -> parquet::errors::Result<Bytes> {
        self.slice(start, length as u64)
    }
}

fn load_metadata(object: &Arc<Object>) -> Result<ArrowReaderMetadata> {
    let metadata = read_metadata(object)?;
    check_layout(metadata.metadata(), object.size(), object.uri())?;
    Ok(metadata)
}

fn read_metadata(object: &Arc<Object>) -> Result<ArrowReaderMetadata> {
    let path = object.uri();
    let options = ArrowReaderOptions::new().with_offset_index_policy(PageIndexPolicy::Optional);
    if let Some(file) = object.local_file() {
        let result = match object.meter() {
            Some(meter) => ArrowReaderMetadata::load(&metered(file, meter)?, options),
            None => ArrowReaderMetadata::load(file.as_ref(), options),
        };
        return result.map_err(|e| decode_error(path, None, &e));
    }
    let size = object.size();
    let tail_range = size.saturating_sub(REMOTE_TAIL_BYTES)..size;
    let tail = Fetched::new(object.clone(), std::slice::from_ref(&tail_range))?;
    ArrowReaderMetadata::load(&tail, options).map_err(|e| {
        tail.take_failure()
            .unwrap_or_else(|| decode_error(path, None, &e))
    })
}

/// Runs `f`, which drives the Parquet decoder over the shard at `path`. The decoder asserts on
/// some malformed pages instead of returning an error: such a panic is the shard's fault, and is
/// reported as a malformed shard, not as a crash, nor printed as one.
fn guarded<T>(
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

pub fn inspect(
    object: Arc<Object>,
    projection: &Projection,
    first_record: bool,
) -> Result<ShardMeta> {
    let path = object.uri().to_owned();
    guarded(&path, None, || {
        inspect_unguarded(object, projection, first_record)
    })?
}

/// [`inspect`] from the footer alone: the projection's columns are found but no record is
/// decoded, for a caller that checks their types itself (a token stage, which inspects every
/// shard at open and would otherwise read a page of each).
pub fn inspect_footer(object: Arc<Object>, projection: &Projection) -> Result<ShardMeta> {
    let path = object.uri().to_owned();
    guarded(&path, None, || inspect_unguarded(object, projection, false))?
}

fn inspect_unguarded(
    object: Arc<Object>,
    projection: &Projection,
    decode_first: bool,
) -> Result<ShardMeta> {
    let path = &object.uri().to_owned();
    let metadata = load_metadata(&object)?;
    if metadata.metadata().file_metadata().num_rows() == 0 {
        // An empty shard (a writer's output for no records may have no columns at all) holds
        // nothing to project: streams skip it.
        return Ok(ShardMeta {
            rows: 0,
            pin: Pin::default(),
            scratch_bytes: 0,
            longest_record: 0,
            index: ShardIndex::Parquet(Arc::new(ParquetIndex {
                metadata,
                roots: Vec::new(),
                group_starts: vec![0],
                batch_rows: 1,
            })),
        });
    }
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
    check_codecs(metadata.metadata(), Some(&roots), path)?;
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
    let batch_rows = decode_batch_rows(metadata.metadata(), &sources);
    // Merged remote requests also fetch the gaps between the ranges they join: at most one gap
    // per projected column chunk (and its dictionary) in each of a job's two row groups.
    let gap_bytes = if object.local_file().is_some() {
        0
    } else {
        let leaves = metadata.metadata().row_groups().first().map_or(0, |g| {
            g.columns()
                .iter()
                .filter(|c| sources.contains(&c.column_path().parts()[0].as_str()))
                .count() as u64
        });
        2 * 2 * leaves * MERGE_GAP
    };
    let index = Arc::new(ParquetIndex {
        metadata,
        roots,
        group_starts,
        batch_rows,
    });
    let meta = ShardMeta {
        rows,
        pin: Pin::default(),
        // A job spans at most two row groups (it holds at most one group's worth of rows).
        scratch_bytes: 2 * largest_group + gap_bytes,
        longest_record: 0,
        index: ShardIndex::Parquet(index.clone()),
    };
    if rows > 0 && decode_first {
        // Decoding the first record checks every projected column's type now, not mid-run.
        let mut reader = Reader::open(object, index);
        let mut chunk = Chunk::padded(projection, 1);
        reader
            .read_ranges(std::slice::from_ref(&(0..1)), projection, &mut chunk, None)
            .map_err(|failure| failure.error)?;
    }
    Ok(meta)
}

/// Rows per decode batch: as many of the widest row group's rows (encoded bytes of the columns
/// named in `sources`, per row) as fit [`DECODE_BATCH_BYTES`], at least one.
fn decode_batch_rows(metadata: &ParquetMetaData, sources: &[&str]) -> u64 {
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

/// Reads row ranges of one Parquet file.
pub struct Reader {
    path: String,
    object: Arc<Object>,
    /// Local shards are read through the file itself, which the OS caches and reads ahead.
    file: Option<Arc<File>>,
    index: Arc<ParquetIndex>,
    /// Where a remote shard's reusable pages are kept, with the shard's key there.
    pages: Option<(Arc<PageCache>, String)>,
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

    /// Takes pages from `cache` and keeps there the pages later jobs may read again (remote
    /// shards only: local ones are cached by the OS).
    pub fn with_pages(mut self, cache: Option<&Arc<PageCache>>) -> Self {
        if self.file.is_none() {
            self.pages = cache.map(|c| {
                let key = PageCache::key(self.object.uri(), self.object.version());
                (c.clone(), key)
            });
        }
        self
    }
}

/// What one job reads of a remote shard.
struct FetchPlan {
    /// Pages the page cache held, as pieces.
    cached: Pieces,
    /// Pages another job's fetch is bringing, taken from the cache when this job decodes (read
    /// on demand should they not be there).
    expected: Vec<Range<u64>>,
    /// Ranges to fetch, merged.
    fetch: Vec<Range<u64>>,
    /// Pages among those fetched to keep for later jobs.
    keep: Vec<Range<u64>>,
}

impl FetchPlan {
    /// The pieces of this plan besides those it fetched: the cached ones, and the expected
    /// ones once their fetch kept them (the reader reads any it did not keep itself).
    fn into_cached_pieces(
        self,
        cache: Option<&(Arc<PageCache>, String)>,
        cancel: &Cancel,
    ) -> Pieces {
        let mut pieces = self.cached;
        if let Some((cache, key)) = cache {
            for range in &self.expected {
                if let Some(bytes) = cache.wait(key, range, cancel) {
                    pieces.push((range.start, bytes));
                }
            }
        }
        pieces
    }
}

/// A remote job's bytes: those being fetched, and the pages the page cache held.
pub struct Prefetched {
    pending: Option<PendingPieces>,
    plan: FetchPlan,
}

/// Starts fetching what decoding `ranges` of the remote shard `object` will read, less the
/// pages `cache` holds.
pub fn prefetch(
    object: &Object,
    index: &ParquetIndex,
    ranges: &[Range<u64>],
    projection: &Projection,
    cache: Option<&Arc<PageCache>>,
) -> Option<Prefetched> {
    if ranges.iter().all(Range::is_empty) {
        return None;
    }
    let cache = cache.map(|c| (c.clone(), PageCache::key(object.uri(), object.version())));
    let mut plan = index.fetch_plan(ranges, projection, cache.as_ref());
    let fetch = std::mem::take(&mut plan.fetch);
    if fetch.is_empty() {
        return Some(Prefetched {
            pending: None,
            plan,
        });
    }
    // The pages to keep go to the cache as soon as they arrive, and are promised until then:
    // the next job of the same row group is usually dispatched before this one decodes. The
    // promise ends with the task, kept or (failed, cancelled) withdrawn.
    let arrived = cache.map(|(cache, key)| {
        let promised = cache.promise(&key, plan.keep.clone());
        Box::new(move |pieces: &Pieces| promised.keep(pieces)) as _
    });
    let pending = Some(object.spawn_pieces(fetch, arrived)?);
    Some(Prefetched { pending, plan })
}

/// Remote byte ranges closer than this are fetched in one request. A request costs about as
/// much as transferring a megabyte on object stores (and on `SeaweedFS` here), so reading a
/// short gap is cheaper than asking twice; 1 MiB is also `object_store`'s coalescing default.
const MERGE_GAP: u64 = 1 << 20;

/// Sorts byte ranges and merges those less than [`MERGE_GAP`] apart.
fn merge_ranges(mut ranges: Vec<Range<u64>>) -> Vec<Range<u64>> {
    ranges.sort_by_key(|r| r.start);
    let mut merged: Vec<Range<u64>> = Vec::with_capacity(ranges.len());
    for range in ranges {
        match merged.last_mut() {
            Some(last) if range.start <= last.end + MERGE_GAP => last.end = last.end.max(range.end),
            _ => merged.push(range),
        }
    }
    merged
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
    fn read_local<R: ChunkReader + 'static>(
        &self,
        open: impl Fn() -> Result<R>,
        ranges: &[Range<u64>],
        projection: &Projection,
        chunk: &mut Chunk,
    ) -> std::result::Result<(), ReadFailure> {
        let direct = Arc::new(open()?);
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

    fn read_ranges_unguarded(
        &mut self,
        ranges: &[Range<u64>],
        projection: &Projection,
        chunk: &mut Chunk,
        prefetched: Option<Prefetch>,
    ) -> std::result::Result<(), ReadFailure> {
        if ranges.iter().all(Range::is_empty) {
            return Ok(());
        }
        if let Some(file) = &self.file {
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
        let (mut pieces, plan) = if let Some(Prefetch(Prefetched { pending, plan })) = prefetched {
            let pieces = pending.map(PendingPieces::wait).transpose()?;
            (pieces.unwrap_or_default(), plan)
        } else {
            let mut plan = self
                .index
                .fetch_plan(ranges, projection, self.pages.as_ref());
            let pieces = self.object.read_pieces(&std::mem::take(&mut plan.fetch))?;
            if let Some((cache, key)) = &self.pages {
                cache.keep(key, &plan.keep, &pieces);
            }
            (pieces, plan)
        };
        pieces.extend(plan.into_cached_pieces(self.pages.as_ref(), self.object.cancel()));
        let fetched = Arc::new(Fetched::from_pieces(self.object.clone(), pieces));
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
/// (`parquet_direct`); `None` where one is not, or the pages do not read so: arrow-rs then
/// reads them, and reports what is wrong.
fn read_direct<R: ChunkReader + 'static>(
    reader: &Arc<R>,
    index: &ParquetIndex,
    ranges: &[Range<u64>],
    projection: &Projection,
    (chunk, path): (&mut Chunk, &str),
) -> Option<std::result::Result<(), ReadFailure>> {
    super::parquet_direct::read(
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

/// A local shard's file that counts what the decoder reads into a [`Meter`].
struct MeteredFile {
    file: File,
    meter: Arc<Meter>,
}

fn metered(file: &File, meter: &Arc<Meter>) -> Result<MeteredFile> {
    Ok(MeteredFile {
        file: file
            .try_clone()
            .map_err(|e| Error::io("a local shard", e))?,
        meter: meter.clone(),
    })
}

impl Length for MeteredFile {
    fn len(&self) -> u64 {
        self.file.len()
    }
}

impl ChunkReader for MeteredFile {
    // Counted as the decoder takes them (the buffer reads ahead of what a column chunk needs),
    // a few bytes at a time while it parses page headers: tallied, not timed.
    type T = Tallied<std::io::BufReader<File>>;

    fn get_read(&self, start: u64) -> parquet::errors::Result<Self::T> {
        Ok(Tallied::new(self.file.get_read(start)?, self.meter.clone()))
    }

    fn get_bytes(&self, start: u64, length: usize) -> parquet::errors::Result<Bytes> {
        let since = std::time::Instant::now();
        let bytes = self.file.get_bytes(start, length)?;
        self.meter.read(bytes.len() as u64, since);
        Ok(bytes)
    }
}

/// Shares one [`Fetched`] between the reader that decodes from it and the caller that asks it
/// for a storage failure afterwards.
struct ArcReader(Arc<Fetched>);

impl Length for ArcReader {
    fn len(&self) -> u64 {
        self.0.len()
    }
}

impl ChunkReader for ArcReader {
    type T = bytes::buf::Reader<Bytes>;

    fn get_read(&self, start: u64) -> parquet::errors::Result<Self::T> {
        self.0.get_read(start)
    }

    fn get_bytes(&self, start: u64, length: usize) -> parquet::errors::Result<Bytes> {
        self.0.get_bytes(start, length)
    }
}

fn read_ranges<R: ChunkReader + 'static>(
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
fn selected_rows<R: ChunkReader + 'static>(
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

/// The Arrow type of the first column `index` projects; `None` for an empty shard's index.
pub(super) fn projected_type(index: &ParquetIndex) -> Option<&DataType> {
    let &root = index.roots.first()?;
    Some(index.metadata.schema().field(root).data_type())
}

/// The index of a shard inspected with `projection`, for readers of whole lists (token shards).
pub(super) fn index_of(meta: &ShardMeta) -> Option<Arc<ParquetIndex>> {
    match &meta.index {
        ShardIndex::Parquet(index) => Some(index.clone()),
        _ => None,
    }
}

/// A record's token ids as the file stores them: `i32` and `i64` lists are lent as they were
/// decoded, other integer types widened to `i64`.
#[derive(Clone, Copy)]
pub(super) enum Ids<'a> {
    /// 32-bit ids.
    I32(&'a [i32]),
    /// 64-bit ids, stored so or widened.
    I64(&'a [i64]),
}

impl Ids<'_> {
    /// Number of ids.
    pub(super) fn len(&self) -> usize {
        match self {
            Ids::I32(v) => v.len(),
            Ids::I64(v) => v.len(),
        }
    }

    /// Ids `range`.
    pub(super) fn slice(&self, range: Range<usize>) -> Self {
        match self {
            Ids::I32(v) => Ids::I32(&v[range]),
            Ids::I64(v) => Ids::I64(&v[range]),
        }
    }

    /// Every id, as `i64`.
    pub(super) fn iter(&self) -> Box<dyn Iterator<Item = i64> + '_> {
        match self {
            Ids::I32(v) => Box::new(v.iter().map(|&x| i64::from(x))),
            Ids::I64(v) => Box::new(v.iter().copied()),
        }
    }
}

/// What [`for_each_list`] calls with each record: its number, its list's length, and its ids
/// (empty unless they were asked for).
pub(super) type EachList<'a> = dyn FnMut(u64, u64, Ids<'_>) -> Result<()> + 'a;

/// Reads records `ranges` (sorted, disjoint) of the one list column `index` projects, handing
/// `each(record, length, values)` every record's list length and, when `values` is set, its
/// whole list as `i64`s (else nothing), in record order. Token shards read their streams
/// through this; `projection` is the one the index was inspected with.
pub(super) fn for_each_list(
    object: &Arc<Object>,
    index: &ParquetIndex,
    (ranges, values): (&[Range<u64>], bool),
    projection: &Projection,
    each: &mut EachList<'_>,
) -> Result<()> {
    let path = object.uri().to_owned();
    let first = ranges.first().map(|r| r.start);
    guarded(&path, first, || {
        if ranges.iter().all(Range::is_empty) {
            return Ok(());
        }
        if let Some(file) = object.local_file() {
            // Counted like every other read of the shard (`bytes_read`).
            let reads = (index, (ranges, values), path.as_str());
            return match object.meter() {
                Some(meter) => local_lists(|| metered(file, meter), reads, each),
                None => local_lists(
                    || file.try_clone().map_err(|e| Error::io(&path, e)),
                    reads,
                    each,
                ),
            };
        }
        let pieces = object.read_pieces(&index.fetch_ranges(ranges, projection))?;
        let fetched = Arc::new(Fetched::from_pieces(object.clone(), pieces));
        let rest = match lists_direct(&fetched, index, (ranges, values), &path, each) {
            Ok(Some(rest)) => rest,
            Ok(None) => return Ok(()),
            Err(e) => return Err(fetched.take_failure().unwrap_or(e)),
        };
        lists(
            ArcReader(fetched.clone()),
            index,
            (&rest, values),
            &path,
            each,
        )
        .map_err(|e| fetched.take_failure().unwrap_or(e))
    })?
}

/// [`for_each_list`] over a local shard, each reader on its own handle from `open`.
fn local_lists<R: ChunkReader + 'static>(
    open: impl Fn() -> Result<R>,
    (index, (ranges, values), path): (&ParquetIndex, (&[Range<u64>], bool), &str),
    each: &mut EachList<'_>,
) -> Result<()> {
    let direct = Arc::new(open()?);
    let Some(rest) = lists_direct(&direct, index, (ranges, values), path, each)? else {
        return Ok(());
    };
    lists(open()?, index, (&rest, values), path, each)
}

/// Hands `each` the records of `ranges` read page by page (`parquet_direct`), as far as the
/// column reads so; returns the ranges left for arrow-rs to read (`None` when none are).
fn lists_direct<R: ChunkReader + 'static>(
    reader: &Arc<R>,
    index: &ParquetIndex,
    (ranges, values): (&[Range<u64>], bool),
    path: &str,
    each: &mut EachList<'_>,
) -> Result<Option<Vec<Range<u64>>>> {
    let [root] = index.roots[..] else {
        return Ok(Some(ranges.to_vec()));
    };
    // The first record not yet handed over.
    let mut next = ranges.first().map_or(0, |r| r.start);
    let mut scratch: Vec<i64> = Vec::new();
    let done = super::parquet_direct::runs(
        reader,
        index.metadata.metadata(),
        index.metadata.schema().fields(),
        (&index.group_starts, ranges),
        root,
        &mut |array, first| {
            for i in 0..array.len() {
                let record = first + i as u64;
                hand_over(array, (i, record), (values, &mut scratch), path, each)?;
                next = record + 1;
            }
            Ok(())
        },
    );
    if let Ok(Some(result)) = done {
        return result.map(|()| None);
    }
    // The rest through arrow-rs, which reports what stopped this reader, if anything.
    let rest: Vec<Range<u64>> = ranges
        .iter()
        .filter(|r| r.end > next)
        .map(|r| r.start.max(next)..r.end)
        .collect();
    Ok((!rest.is_empty()).then_some(rest))
}

/// Every record's list length of the one list column `index` projects (`rows` records), read
/// from the column's levels without decoding its ids; `None` where the column is not laid out
/// as that reader expects, or its pages do not read so: [`for_each_list`] then decodes the
/// lists, and reports what is wrong with them.
pub(super) fn list_lengths(
    object: &Arc<Object>,
    index: &ParquetIndex,
    rows: u64,
    projection: &Projection,
) -> Result<Option<Vec<u64>>> {
    let path = object.uri().to_owned();
    let [root] = index.roots[..] else {
        return Ok(None);
    };
    let metadata = index.metadata.metadata();
    // A shard the saver wrote lists them in its footer, which open has read already.
    if let Some(lengths) = super::list_lengths::footer_lengths(metadata, root, rows) {
        return Ok(Some(lengths));
    }
    guarded(&path, None, || {
        if let Some(file) = object.local_file() {
            // Counted like every other read of the shard (`bytes_read`).
            fn levels<R: ChunkReader + 'static>(
                file: R,
                (metadata, root, rows): (&ParquetMetaData, usize, u64),
            ) -> Option<Vec<u64>> {
                super::list_lengths::list_lengths(&Arc::new(file), metadata, root, rows)
                    .unwrap_or(None)
            }
            let column = (metadata.as_ref(), root, rows);
            return Ok(match object.meter() {
                Some(meter) => levels(metered(file, meter)?, column),
                None => levels(file.try_clone().map_err(|e| Error::io(&path, e))?, column),
            });
        }
        let all = 0..rows;
        let fetched = Arc::new(Fetched::new(
            object.clone(),
            &index.fetch_ranges(std::slice::from_ref(&all), projection),
        )?);
        match super::list_lengths::list_lengths(&fetched, metadata, root, rows) {
            Ok(found) => Ok(found),
            // A failed read is the storage's error; anything else, the decoder's to report.
            Err(_) => fetched.take_failure().map_or(Ok(None), Err),
        }
    })?
}

fn lists<R: ChunkReader + 'static>(
    file: R,
    index: &ParquetIndex,
    (ranges, want_values): (&[Range<u64>], bool),
    path: &str,
    each: &mut EachList<'_>,
) -> Result<()> {
    let first_row = ranges[0].start;
    let reader = selected_rows(file, index, ranges, index.batch_rows as usize)
        .map_err(|e| decode_error(path, Some(first_row), &e))?;
    let mut records = ranges.iter().flat_map(Clone::clone);
    let mut values: Vec<i64> = Vec::new();
    for batch in reader {
        let batch = batch.map_err(|e| decode_error(path, Some(first_row), e))?;
        let column = batch.column(0);
        for i in 0..batch.num_rows() {
            let record = records.next().ok_or_else(|| {
                format_error(path, None, "the decoder returned more rows than selected")
            })?;
            hand_over(
                column.as_ref(),
                (i, record),
                (want_values, &mut values),
                path,
                each,
            )?;
        }
    }
    if let Some(record) = records.next() {
        return Err(format_error(
            path,
            Some(record),
            "the decoder returned fewer rows than selected",
        ));
    }
    Ok(())
}

/// Hands `each` list `i` of `array`, which is shard record `record` (its ids too when `want`
/// is set, widened into `scratch` where they are not lent).
fn hand_over(
    array: &dyn Array,
    (i, record): (usize, u64),
    (want, scratch): (bool, &mut Vec<i64>),
    path: &str,
    each: &mut EachList<'_>,
) -> Result<()> {
    scratch.clear();
    let (len, ids) = list_ids(array, i, want, scratch)
        .map_err(|message| format_error(path, Some(record), message))?;
    each(record, len, ids.unwrap_or(Ids::I64(scratch)))
}

/// The length of list `i` of `array` and, when `want` is set, its ids: lent when the file
/// stores `i32` or `i64` (`Some`), else widened into `out` (`None`).
pub(super) fn list_ids<'a>(
    array: &'a dyn Array,
    i: usize,
    want: bool,
    out: &mut Vec<i64>,
) -> std::result::Result<(u64, Option<Ids<'a>>), String> {
    if array.is_null(i) {
        return Err("the token list is null".to_owned());
    }
    let (child, range): (&dyn Array, Range<usize>) = match array.data_type() {
        DataType::List(_) => {
            let l = array.as_list::<i32>();
            let o = l.value_offsets();
            (l.values().as_ref(), o[i] as usize..o[i + 1] as usize)
        }
        DataType::LargeList(_) => {
            let l = array.as_list::<i64>();
            let o = l.value_offsets();
            (l.values().as_ref(), o[i] as usize..o[i + 1] as usize)
        }
        DataType::FixedSizeList(_, size) => {
            let size = *size as usize;
            (
                array.as_fixed_size_list().values().as_ref(),
                i * size..(i + 1) * size,
            )
        }
        other => return Err(format!("expected a list of token ids, found {other}")),
    };
    let len = range.len() as u64;
    if !want || range.is_empty() {
        return Ok((len, None));
    }
    if let Some(nulls) = child.logical_nulls() {
        if nulls.slice(range.start, range.len()).null_count() > 0 {
            return Err("a token id is null".to_owned());
        }
    }
    macro_rules! widen {
        ($t:ty) => {
            out.extend(
                child.as_primitive::<$t>().values()[range]
                    .iter()
                    .map(|&v| i64::from(v)),
            )
        };
    }
    match child.data_type() {
        // Stored at a column's own width: lent as decoded.
        DataType::Int32 => {
            let ids = &child.as_primitive::<Int32Type>().values()[range];
            return Ok((len, Some(Ids::I32(ids))));
        }
        DataType::Int64 => {
            let ids = &child.as_primitive::<Int64Type>().values()[range];
            return Ok((len, Some(Ids::I64(ids))));
        }
        DataType::Int8 => widen!(Int8Type),
        DataType::Int16 => widen!(Int16Type),
        DataType::UInt8 => widen!(UInt8Type),
        DataType::UInt16 => widen!(UInt16Type),
        DataType::UInt32 => widen!(UInt32Type),
        DataType::UInt64 => {
            for &v in &child.as_primitive::<UInt64Type>().values()[range] {
                out.push(i64::try_from(v).map_err(|_| format!("token id {v} does not fit i64"))?);
            }
        }
        // Writers infer `list<null>` for a column whose lists are all empty.
        DataType::Null => {}
        other => return Err(format!("expected integer token ids, found {other}")),
    }
    Ok((len, None))
}

/// Every column of a shard, in record batches of up to a given number of rows: what
/// `iter_shard` reads. Remote shards fetch each column chunk when the decoder reaches it.
pub struct Batches {
    path: String,
    reader: ParquetRecordBatchReader,
    /// The remote bytes source, asked for the storage error behind a decoding failure.
    fetched: Option<Arc<Fetched>>,
    next_row: u64,
}

impl Batches {
    /// Opens `object` at its first row.
    pub fn open(object: &Arc<Object>, batch_rows: usize) -> Result<Self> {
        guarded(object.uri(), None, || {
            Self::open_unguarded(object, batch_rows)
        })?
    }

    fn open_unguarded(object: &Arc<Object>, batch_rows: usize) -> Result<Self> {
        let path = object.uri().to_owned();
        let metadata = load_metadata(object)?;
        check_codecs(metadata.metadata(), None, &path)?;
        let (built, fetched) = if let Some(file) = object.local_file() {
            let file = file.try_clone().map_err(|e| Error::io(&path, e))?;
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

    fn next_batch_unguarded(&mut self) -> Result<Option<RecordBatch>> {
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

/// Writes `batches` (all of `schema`) as one Parquet file: zstd-compressed pages with a page
/// index, so that streams select just the pages holding the rows a rank reads, and for each
/// list column of integers without nulls its record lengths in the footer
/// ([`super::list_lengths::footer_value`]), so that a packing stage plans from the footer.
pub fn write(
    out: impl Write + Send,
    schema: SchemaRef,
    batches: &[RecordBatch],
    path: &str,
) -> Result<()> {
    let refused = |e: ParquetError| Error::Data {
        path: path.to_owned(),
        row: None,
        field: None,
        message: format!("cannot be written as Parquet: {e}"),
    };
    let properties = WriterProperties::builder()
        .set_compression(Compression::ZSTD(ZstdLevel::default()))
        .build();
    let footer: Vec<KeyValue> = schema
        .fields()
        .iter()
        .enumerate()
        .filter_map(|(k, field)| {
            let value = super::list_lengths::footer_value(&integer_list_lengths(batches, k)?)?;
            let key = format!("{}{}", super::list_lengths::FOOTER_KEY_PREFIX, field.name());
            Some(KeyValue::new(key, value))
        })
        .collect();
    let mut writer = ArrowWriter::try_new(out, schema, Some(properties)).map_err(refused)?;
    for batch in batches {
        writer.write(batch).map_err(refused)?;
    }
    for entry in footer {
        writer.append_key_value_metadata(entry);
    }
    writer.close().map_err(refused)?;
    Ok(())
}

/// The record lengths of column `k` of `batches` where it is a list of integers holding no
/// null, list or element; `None` otherwise.
fn integer_list_lengths(batches: &[RecordBatch], k: usize) -> Option<Vec<u64>> {
    fn append<O: OffsetSizeTrait>(column: &dyn Array, lengths: &mut Vec<u64>) -> Option<()> {
        let list = column.as_list::<O>();
        let values = list.values();
        if column.null_count() > 0 || values.null_count() > 0 || !values.data_type().is_integer() {
            return None;
        }
        lengths.extend(
            list.offsets()
                .windows(2)
                .map(|w| (w[1] - w[0]).as_usize() as u64),
        );
        Some(())
    }
    let mut lengths = Vec::new();
    for batch in batches {
        let column = batch.column(k).as_ref();
        match column.data_type() {
            DataType::List(_) => append::<i32>(column, &mut lengths)?,
            DataType::LargeList(_) => append::<i64>(column, &mut lengths)?,
            _ => return None,
        }
    }
    Some(lengths)
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use arrow_array::{ArrayRef, Int64Array, RecordBatch};
    use parquet::basic::{BrotliLevel, Compression, GzipLevel, ZstdLevel};
    use parquet::file::properties::{WriterProperties, WriterVersion};

    use super::*;
    use crate::columns::ColumnBuf;
    use crate::config::FieldSpec;
    use crate::dtype::DType;
    use crate::storage::Storage;

    fn projection() -> Projection {
        Projection::new(&[FieldSpec {
            name: "v".into(),
            source: "v".into(),
            dtype: DType::I64,
            shape: vec![],
            pad: serde_json::Value::from(0),
        }])
        .unwrap()
    }

    /// Writes 1,000 rows with `codec`, page format `version` and dictionaries on or off, then reads
    /// two ranges back through inspection and a reader.
    fn round_trip(codec: Compression, version: WriterVersion, dictionary: bool) {
        let path = std::env::temp_dir().join(format!(
            "o41-codec-{}-{codec:?}-{version:?}-{dictionary}.parquet",
            std::process::id()
        ));
        let values: ArrayRef = Arc::new(Int64Array::from_iter_values((0..1000).map(|i| i * 3)));
        let batch = RecordBatch::try_from_iter([("v", values)]).unwrap();
        let properties = WriterProperties::builder()
            .set_compression(codec)
            .set_writer_version(version)
            .set_dictionary_enabled(dictionary)
            .set_data_page_row_count_limit(100)
            .set_max_row_group_row_count(Some(400))
            .build();
        let file = std::fs::File::create(&path).unwrap();
        let mut writer = ArrowWriter::try_new(file, batch.schema(), Some(properties)).unwrap();
        writer.write(&batch).unwrap();
        writer.close().unwrap();

        let uri = path.to_string_lossy().into_owned();
        let object = Arc::new(Storage::local().open(&uri).unwrap());
        let projection = projection();
        let meta = inspect(object.clone(), &projection, true).unwrap();
        assert_eq!(meta.rows, 1000);
        let ShardIndex::Parquet(index) = meta.index else {
            panic!("a Parquet index")
        };
        let mut reader = Reader::open(object, index);
        let mut chunk = Chunk::padded(&projection, 30);
        reader
            .read_ranges(&[5..15, 390..410], &projection, &mut chunk, None)
            .map_err(|failure| failure.error)
            .unwrap();
        let expected: Vec<i64> = (5..15).chain(390..410).map(|i| i * 3).collect();
        assert!(
            matches!(&chunk.columns[0], ColumnBuf::I64(v) if v[..] == expected[..]),
            "{codec:?}"
        );
        std::fs::remove_file(path).unwrap();
    }

    /// Elements of row `i`'s list: its length varies so record boundaries fall mid-page.
    fn list_row(i: u64) -> Vec<i64> {
        (0..20 + i % 7).map(|k| (i * 1000 + k) as i64).collect()
    }

    const LIST_WIDTH: usize = 32;

    fn list_projection() -> Projection {
        Projection::new(&[FieldSpec {
            name: "tokens".into(),
            source: "tokens".into(),
            dtype: DType::I64,
            shape: vec![LIST_WIDTH],
            pad: serde_json::Value::from(-1),
        }])
        .unwrap()
    }

    /// Writes `rows` list rows in row groups of 200 and pages of 10 rows, with a page index, as
    /// the benchmark corpus is laid out (many pages per row group); returns the open object.
    fn write_lists(name: &str, rows: u64) -> (std::path::PathBuf, Arc<Object>) {
        use arrow_array::builder::{Int64Builder, ListBuilder};
        let path = std::env::temp_dir().join(format!("o41-{name}-{}.parquet", std::process::id()));
        let mut lists = ListBuilder::new(Int64Builder::new());
        for i in 0..rows {
            lists.values().append_slice(&list_row(i));
            lists.append(true);
        }
        let column: ArrayRef = Arc::new(lists.finish());
        let batch = RecordBatch::try_from_iter([("tokens", column)]).unwrap();
        let properties = WriterProperties::builder()
            .set_dictionary_enabled(false)
            .set_write_batch_size(10)
            .set_data_page_row_count_limit(10)
            .set_max_row_group_row_count(Some(200))
            .build();
        let file = std::fs::File::create(&path).unwrap();
        let mut writer = ArrowWriter::try_new(file, batch.schema(), Some(properties)).unwrap();
        writer.write(&batch).unwrap();
        writer.close().unwrap();
        let uri = path.to_string_lossy().into_owned();
        (path, Arc::new(Storage::local().open(&uri).unwrap()))
    }

    /// The index inspection builds for the Parquet shard `object`.
    fn parquet_index(object: &Arc<Object>, projection: &Projection) -> Arc<ParquetIndex> {
        let meta = inspect(object.clone(), projection, true).unwrap();
        let ShardIndex::Parquet(index) = meta.index else {
            panic!("a Parquet index")
        };
        index
    }

    fn expected_rows(ranges: &[Range<u64>]) -> Vec<i64> {
        let mut out = Vec::new();
        for row in ranges.iter().flat_map(Clone::clone) {
            let mut values = list_row(row);
            values.resize(LIST_WIDTH, -1);
            out.extend(values);
        }
        out
    }

    fn read_i64(reader: &mut Reader, ranges: &[Range<u64>], projection: &Projection) -> Vec<i64> {
        let rows: u64 = ranges.iter().map(|r| r.end - r.start).sum();
        let mut chunk = Chunk::padded(projection, rows as usize);
        reader
            .read_ranges(ranges, projection, &mut chunk, None)
            .map_err(|failure| failure.error)
            .unwrap();
        let ColumnBuf::I64(values) = &chunk.columns[0] else {
            panic!("an i64 column")
        };
        values.to_vec()
    }

    /// A file reader that records the byte ranges the decoder asks for.
    struct Recording {
        file: std::fs::File,
        asked: Arc<Mutex<Vec<Range<u64>>>>,
    }

    impl Length for Recording {
        fn len(&self) -> u64 {
            self.file.len()
        }
    }

    impl ChunkReader for Recording {
        type T = <std::fs::File as ChunkReader>::T;

        fn get_read(&self, start: u64) -> parquet::errors::Result<Self::T> {
            self.asked.lock().unwrap().push(start..self.file.len());
            self.file.get_read(start)
        }

        fn get_bytes(&self, start: u64, length: usize) -> parquet::errors::Result<Bytes> {
            self.asked
                .lock()
                .unwrap()
                .push(start..start + length as u64);
            self.file.get_bytes(start, length)
        }
    }

    #[test]
    fn an_inspection_that_skips_the_first_record_reads_only_the_metadata() {
        let (path, _) = write_lists("metadata-only", 1000);
        let uri = path.to_string_lossy().into_owned();
        let projection = list_projection();
        let bytes_read = |look: &dyn Fn(Arc<Object>)| {
            let meter = Arc::new(crate::metrics::Meter::default());
            let storage = crate::storage::Storage::local().with_meter(meter.clone());
            look(Arc::new(storage.open(&uri).unwrap()));
            meter.reading().bytes_read
        };
        let metadata = bytes_read(&|object| {
            load_metadata(&object).unwrap();
        });
        let skipped = bytes_read(&|object| {
            inspect(object, &projection, false).unwrap();
        });
        let checked = bytes_read(&|object| {
            inspect(object, &projection, true).unwrap();
        });
        assert!(metadata > 0);
        assert_eq!(skipped, metadata, "the footer and page index alone");
        assert!(checked > metadata, "the first record's pages as well");
        std::fs::remove_file(path).unwrap();
    }

    #[test]
    fn a_job_takes_the_pages_its_predecessor_kept_and_fetches_only_the_rest() {
        let (path, object) = write_lists("page-cache", 400);
        let projection = list_projection();
        let index = parquet_index(&object, &projection);
        let locations = index
            .metadata
            .metadata()
            .page_index()
            .and_then(|p| p.offset_index(0, 0))
            .expect("the writer wrote a page index")
            .page_locations()
            .clone();
        let page = |k: usize| {
            let at = locations[k].offset as u64;
            at..at + locations[k].compressed_page_size as u64
        };
        let cache = (Arc::new(PageCache::new(1 << 20)), PageCache::key("s", None));
        // Pages hold 10 rows: a job of rows 0..15 ends inside page 1, which the next job of
        // the row group starts in, so it is kept (no dictionary: the writer wrote none).
        let first = index.fetch_plan(std::slice::from_ref(&(0..15)), &projection, Some(&cache));
        assert_eq!(first.fetch, vec![page(0).start..page(1).end]);
        assert_eq!(first.keep, vec![page(1)]);
        assert!(first.cached.is_empty() && first.expected.is_empty());

        // While that fetch is under way the page is promised; then kept.
        let promised = cache.0.promise(&cache.1, first.keep.clone());
        let next = index.fetch_plan(std::slice::from_ref(&(15..30)), &projection, Some(&cache));
        assert_eq!((next.expected, next.fetch), (vec![page(1)], vec![page(2)]));
        let bytes = object.read_range(page(0).start..page(1).end).unwrap();
        promised.keep(&[(page(0).start, bytes)]);
        let next = index.fetch_plan(std::slice::from_ref(&(15..30)), &projection, Some(&cache));
        assert_eq!(next.fetch, vec![page(2)]);
        assert_eq!(next.cached.len(), 1);
        assert_eq!(next.cached[0].0, page(1).start);
        assert_eq!(
            next.cached[0].1,
            object.read_range(page(1)).unwrap(),
            "the kept page's bytes"
        );

        // A kept page inside a gap that merging closes comes with the request, not the cache.
        let around = index.fetch_plan(&[5..6, 15..16, 25..26], &projection, Some(&cache));
        assert_eq!(around.fetch, vec![page(0).start..page(2).end]);
        assert!(around.cached.is_empty() && around.expected.is_empty());
        std::fs::remove_file(path).unwrap();
    }

    #[test]
    fn short_runs_spread_over_row_groups_read_only_their_own_pages() {
        let (path, object) = write_lists("short-runs", 1000);
        let projection = list_projection();
        let index = parquet_index(&object, &projection);
        // A rank's share at a large world size: runs of 2 to 6 rows, one every 32 rows, in
        // every row group (short enough for the default policy to choose a mask).
        let ranges: Vec<Range<u64>> = (0..31u64)
            .map(|k| k * 32 + k % 9..k * 32 + k % 9 + 2 + k % 5)
            .collect();
        let asked = Arc::new(Mutex::new(Vec::new()));
        let file = std::fs::File::open(&path).unwrap();
        let rows: u64 = ranges.iter().map(|r| r.end - r.start).sum();
        let mut chunk = Chunk::padded(&projection, rows as usize);
        let recording = Recording {
            file,
            asked: asked.clone(),
        };
        read_ranges(recording, &index, &ranges, &projection, &mut chunk, "t")
            .map_err(|failure| failure.error)
            .unwrap();
        assert!(
            matches!(&chunk.columns[0], ColumnBuf::I64(v) if v[..] == expected_rows(&ranges)[..])
        );

        // Every page the decoder fetched holds a selected row: pages between runs are skipped
        // by their offset index, not decoded and filtered.
        let metadata = index.metadata.metadata();
        let offsets = metadata
            .page_index()
            .expect("the writer wrote a page index");
        let mut unwanted = Vec::new();
        for g in 0..metadata.num_row_groups() {
            let (first, end) = (index.group_starts[g], index.group_starts[g + 1]);
            let pages = offsets.offset_index(g, 0).unwrap().page_locations();
            for (k, page) in pages.iter().enumerate() {
                let from = first + page.first_row_index as u64;
                let to = pages
                    .get(k + 1)
                    .map_or(end, |next| first + next.first_row_index as u64);
                if !ranges.iter().any(|r| r.start < to && r.end > from) {
                    let at = page.offset as u64;
                    unwanted.push(at..at + page.compressed_page_size as u64);
                }
            }
        }
        let asked = asked.lock().unwrap();
        assert!(!asked.is_empty());
        for range in asked.iter() {
            assert!(
                !unwanted
                    .iter()
                    .any(|page| range.start < page.end && range.end > page.start),
                "fetched {range:?}, which overlaps a page with no selected row"
            );
        }
        std::fs::remove_file(path).unwrap();
    }

    #[test]
    fn decode_batches_hold_about_a_mebibyte_of_rows() {
        let (path, object) = write_lists("batch-rows", 400);
        let index = parquet_index(&object, &list_projection());
        let metadata = index.metadata.metadata();
        let widest = metadata
            .row_groups()
            .iter()
            .map(|g| (g.column(0).uncompressed_size() as u64).div_ceil(g.num_rows() as u64))
            .max()
            .unwrap();
        assert_eq!(index.batch_rows, (DECODE_BATCH_BYTES / widest).min(8192));
        assert_eq!(decode_batch_rows(metadata, &[]), MAX_DECODE_BATCH_ROWS);
        std::fs::remove_file(path).unwrap();
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(24))]

        /// One pass over many short runs, spanning row groups, pages and decode batches,
        /// yields exactly the rows that reading each run on its own yields.
        #[test]
        fn one_pass_over_short_runs_equals_a_read_per_run(
            picks in proptest::collection::btree_set(0u64..1200, 1..160),
            lens in proptest::collection::vec(1u64..7, 160),
        ) {
            static CASE: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
            let case = CASE.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            let (path, object) = write_lists(&format!("one-pass-{case}"), 1200);
            let mut ranges: Vec<Range<u64>> = Vec::new();
            for (start, len) in picks.into_iter().zip(lens) {
                let start = start.max(ranges.last().map_or(0, |r| r.end + 1));
                let end = (start + len).min(1200);
                if start < end {
                    ranges.push(start..end);
                }
            }
            proptest::prop_assume!(!ranges.is_empty());
            let projection = list_projection();
            let index = parquet_index(&object, &projection);
            let mut reader = Reader::open(object, index);
            let together = read_i64(&mut reader, &ranges, &projection);
            let mut apart = Vec::new();
            for range in &ranges {
                apart.extend(read_i64(&mut reader, std::slice::from_ref(range), &projection));
            }
            std::fs::remove_file(path).unwrap();
            proptest::prop_assert_eq!(&together, &apart);
            proptest::prop_assert_eq!(together, expected_rows(&ranges));
        }
    }

    #[test]
    fn every_standard_codec_and_page_format_reads() {
        let codecs = [
            Compression::UNCOMPRESSED,
            Compression::SNAPPY,
            Compression::GZIP(GzipLevel::default()),
            Compression::BROTLI(BrotliLevel::default()),
            // The legacy LZ4 codec, Hadoop-framed as Parquet's own writers framed it.
            Compression::LZ4,
            Compression::LZ4_RAW,
            Compression::ZSTD(ZstdLevel::default()),
        ];
        for codec in codecs {
            for version in [WriterVersion::PARQUET_1_0, WriterVersion::PARQUET_2_0] {
                for dictionary in [true, false] {
                    round_trip(codec, version, dictionary);
                }
            }
        }
    }
}

#[cfg(test)]
mod direct_tests {
    use std::ops::Range;
    use std::sync::Arc;

    use arrow_array::builder::{
        BooleanBuilder, Int32Builder, Int64Builder, LargeListBuilder, ListBuilder,
    };
    use arrow_array::{ArrayRef, Float32Array, Int64Array, RecordBatch};
    use parquet::arrow::ArrowWriter;
    use parquet::basic::{Compression, ZstdLevel};
    use parquet::file::properties::{WriterProperties, WriterVersion};
    use proptest::prelude::*;

    use super::{read_direct, read_ranges, Chunk, ParquetIndex, ShardIndex};
    use crate::config::FieldSpec;
    use crate::dtype::DType;
    use crate::fields::Projection;
    use crate::storage::Storage;

    #[derive(Debug, Clone)]
    struct Layout {
        version: WriterVersion,
        dictionary: bool,
        codec: Compression,
        page_rows: usize,
        group_rows: usize,
    }

    fn field(name: &str, dtype: DType, shape: Vec<usize>) -> FieldSpec {
        FieldSpec {
            name: name.into(),
            source: name.into(),
            dtype,
            shape,
            pad: serde_json::Value::from(0),
        }
    }

    fn projection() -> Projection {
        Projection::new(&[
            field("i", DType::I64, vec![]),
            field("f", DType::F32, vec![]),
            field("t", DType::I32, vec![6]),
            field("m", DType::Bool, vec![6]),
            field("l", DType::I64, vec![3]),
        ])
        .unwrap()
    }

    /// Rows of every column kind read here; list lengths `lengths[row]` (short ones make the
    /// levels bit-packed), ids from a small set (so dictionaries are used) or not.
    fn write(lengths: &[usize], layout: &Layout, path: &std::path::Path) {
        let rows = lengths.len();
        let mut t = ListBuilder::new(Int32Builder::new());
        let mut m = ListBuilder::new(BooleanBuilder::new());
        let mut l = LargeListBuilder::new(Int64Builder::new());
        for (row, &n) in lengths.iter().enumerate() {
            for k in 0..n {
                t.values()
                    .append_value(((row * 7 + k * 3) % 50) as i32 - 20);
                m.values().append_value((row + k) % 3 == 0);
                l.values().append_value((row * 1000 + k) as i64);
            }
            t.append(true);
            m.append(true);
            l.append(true);
        }
        let i: ArrayRef = Arc::new(Int64Array::from_iter_values(
            (0..rows as i64).map(|r| r * 11),
        ));
        let f: ArrayRef = Arc::new(Float32Array::from_iter_values(
            (0..rows).map(|r| r as f32 / 4.0),
        ));
        let batch = RecordBatch::try_from_iter([
            ("i", i),
            ("f", f),
            ("t", Arc::new(t.finish()) as ArrayRef),
            ("m", Arc::new(m.finish()) as ArrayRef),
            ("l", Arc::new(l.finish()) as ArrayRef),
        ])
        .unwrap();
        let properties = WriterProperties::builder()
            .set_writer_version(layout.version)
            .set_dictionary_enabled(layout.dictionary)
            .set_compression(layout.codec)
            .set_write_batch_size(layout.page_rows)
            .set_data_page_row_count_limit(layout.page_rows)
            .set_max_row_group_row_count(Some(layout.group_rows))
            .build();
        let file = std::fs::File::create(path).unwrap();
        let mut writer = ArrowWriter::try_new(file, batch.schema(), Some(properties)).unwrap();
        writer.write(&batch).unwrap();
        writer.close().unwrap();
    }

    fn index_of(path: &std::path::Path, projection: &Projection) -> Arc<ParquetIndex> {
        let object = Arc::new(Storage::local().open(&path.to_string_lossy()).unwrap());
        let meta = super::inspect(object, projection, true).unwrap();
        let ShardIndex::Parquet(index) = meta.index else {
            panic!("a Parquet index")
        };
        index
    }

    /// Reads `ranges` both ways: page by page (`None` where that reader declined the shard)
    /// and through arrow-rs.
    fn both(path: &std::path::Path, ranges: &[Range<u64>]) -> (Option<String>, String) {
        let projection = projection();
        let index = index_of(path, &projection);
        let rows: u64 = ranges.iter().map(|r| r.end - r.start).sum();
        let mut direct = Chunk::padded(&projection, rows as usize);
        let file = Arc::new(std::fs::File::open(path).unwrap());
        let read = read_direct(&file, &index, ranges, &projection, (&mut direct, "shard"))
            .map(|done| done.map_err(|f| f.error).unwrap());
        let mut arrow = Chunk::padded(&projection, rows as usize);
        read_ranges(
            std::fs::File::open(path).unwrap(),
            &index,
            ranges,
            &projection,
            &mut arrow,
            "shard",
        )
        .map_err(|f| f.error)
        .unwrap();
        (
            read.map(|()| format!("{:?}", direct.columns)),
            format!("{:?}", arrow.columns),
        )
    }

    fn layouts() -> impl Strategy<Value = Layout> {
        (
            prop_oneof![
                Just(WriterVersion::PARQUET_1_0),
                Just(WriterVersion::PARQUET_2_0)
            ],
            any::<bool>(),
            prop_oneof![
                Just(Compression::UNCOMPRESSED),
                Just(Compression::SNAPPY),
                Just(Compression::ZSTD(ZstdLevel::default())),
            ],
            1usize..30,
            1usize..120,
        )
            .prop_map(
                |(version, dictionary, codec, page_rows, group_rows)| Layout {
                    version,
                    dictionary,
                    codec,
                    page_rows,
                    group_rows,
                },
            )
    }

    /// Sorted, disjoint ranges of `0..rows`, from cut points.
    fn ranges_of(rows: u64, cuts: &[(u64, bool)]) -> Vec<Range<u64>> {
        let mut points: Vec<u64> = cuts.iter().map(|&(c, _)| c % (rows + 1)).collect();
        points.push(0);
        points.push(rows);
        points.sort_unstable();
        points.dedup();
        points
            .windows(2)
            .zip(
                cuts.iter()
                    .map(|&(_, keep)| keep)
                    .chain(std::iter::repeat(true)),
            )
            .filter(|(_, keep)| *keep)
            .map(|(w, _)| w[0]..w[1])
            .collect()
    }

    /// Every record of `ranges` of the list column `t`, as `for_each_list` hands them over.
    fn listed(path: &std::path::Path, ranges: &[Range<u64>]) -> Vec<(u64, Vec<i64>)> {
        let projection = Projection::new(&[field("t", DType::I32, vec![4])]).unwrap();
        let object = Arc::new(Storage::local().open(&path.to_string_lossy()).unwrap());
        let index = index_of(path, &projection);
        let mut out = Vec::new();
        super::for_each_list(
            &object,
            &index,
            (ranges, true),
            &projection,
            &mut |record, len, ids| {
                assert_eq!(len as usize, ids.len());
                out.push((record, ids.iter().collect()));
                Ok(())
            },
        )
        .unwrap();
        out
    }

    /// The ids `write` puts in record `row` of `t`.
    fn ids_of(row: usize, len: usize) -> Vec<i64> {
        (0..len)
            .map(|k| ((row * 7 + k * 3) % 50) as i64 - 20)
            .collect()
    }

    /// A token column whose dictionary fills up after a few pages, so later pages are encoded
    /// otherwise (delta, in version 2 pages): the page reader hands over the records it reads
    /// and arrow-rs the rest, each once and in order.
    #[test]
    fn lists_read_past_the_page_reader_once_each() {
        let path =
            std::env::temp_dir().join(format!("o41-direct-lists-{}.parquet", std::process::id()));
        let lengths: Vec<usize> = (0..300).map(|r| 1 + r % 9).collect();
        let mut t = ListBuilder::new(Int32Builder::new());
        for (row, &n) in lengths.iter().enumerate() {
            // Ids past the first pages are new, so the dictionary overflows.
            t.values()
                .append_slice(&(0..n).map(|k| (row * 100 + k) as i32).collect::<Vec<_>>());
            t.append(true);
        }
        let batch = RecordBatch::try_from_iter([("t", Arc::new(t.finish()) as ArrayRef)]).unwrap();
        let properties = WriterProperties::builder()
            .set_writer_version(WriterVersion::PARQUET_2_0)
            .set_dictionary_page_size_limit(256)
            .set_write_batch_size(10)
            .set_data_page_row_count_limit(10)
            .build();
        let file = std::fs::File::create(&path).unwrap();
        let mut writer = ArrowWriter::try_new(file, batch.schema(), Some(properties)).unwrap();
        writer.write(&batch).unwrap();
        writer.close().unwrap();
        // The premise: the page reader reads the first pages and stops at a later one.
        let projection = Projection::new(&[field("t", DType::I32, vec![4])]).unwrap();
        let index = index_of(&path, &projection);
        let mut visited = 0;
        let stopped = super::super::parquet_direct::runs(
            &Arc::new(std::fs::File::open(&path).unwrap()),
            index.metadata.metadata(),
            index.metadata.schema().fields(),
            (&index.group_starts, std::slice::from_ref(&(0..300))),
            0,
            &mut |array, _| {
                visited += array.len();
                Ok(())
            },
        )
        .unwrap();
        assert!(
            stopped.is_none() && visited > 0 && visited < 300,
            "{visited}"
        );
        let all = 0..300;
        for ranges in [vec![all], vec![3..5, 17..120, 250..299]] {
            let expected: Vec<(u64, Vec<i64>)> = ranges
                .iter()
                .flat_map(Clone::clone)
                .map(|r| {
                    (
                        r,
                        (0..lengths[r as usize])
                            .map(|k| (r * 100 + k as u64) as i64)
                            .collect(),
                    )
                })
                .collect();
            assert_eq!(listed(&path, &ranges), expected);
        }
        std::fs::remove_file(&path).unwrap();
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(40))]

        /// Any selection of rows reads page by page as arrow-rs reads it, and a token column's
        /// records are handed over as written, over page versions, codecs, dictionaries, page and
        /// row-group sizes and lists of any length.
        #[test]
        fn pages_read_as_the_decoder_reads(
            layout in layouts(),
            lengths in prop::collection::vec(prop_oneof![3 => 0usize..4, 1 => 0usize..40], 1..200),
            cuts in prop::collection::vec((any::<u64>(), any::<bool>()), 0..12),
        ) {
            let path = std::env::temp_dir().join(format!(
                "o41-direct-{}-{:?}.parquet",
                std::process::id(),
                std::thread::current().id()
            ));
            write(&lengths, &layout, &path);
            let ranges = ranges_of(lengths.len() as u64, &cuts);
            if !ranges.is_empty() {
                let (direct, arrow) = both(&path, &ranges);
                // Version 2 pages without dictionaries hold delta-encoded numbers, which
                // arrow-rs reads; every other layout written here is read page by page.
                let declined = layout.version == WriterVersion::PARQUET_2_0 && !layout.dictionary;
                prop_assert_eq!(direct.is_none(), declined);
                if let Some(direct) = direct {
                    prop_assert_eq!(direct, arrow);
                }
                let expected: Vec<(u64, Vec<i64>)> = ranges
                    .iter()
                    .flat_map(Clone::clone)
                    .map(|r| (r, ids_of(r as usize, lengths[r as usize])))
                    .collect();
                prop_assert_eq!(listed(&path, &ranges), expected);
            }
            std::fs::remove_file(&path).unwrap();
        }
    }
}
