//! Remote reads: the byte ranges a job needs, merged and fetched ahead of decoding, and served to
//! the Parquet reader as if they were the file.

use std::ops::Range;
use std::sync::{Arc, Mutex};

use bytes::{Buf, Bytes};

use parquet::arrow::arrow_reader::{ArrowReaderMetadata, ArrowReaderOptions};
use parquet::errors::ParquetError;
use parquet::file::metadata::{PageIndexPolicy, ParquetMetaData, ParquetMetaDataReader};
use parquet::file::reader::{ChunkReader, Length};

use super::footer::{check_layout, check_schema, selection, ParquetIndex};
use super::guard;
use super::metered::metered;
use super::{decode_error, format_error, ENCODING, REMOTE_TAIL_BYTES};
use crate::cancel::Cancel;
use crate::error::{Error, Result};
use crate::fields::Projection;
use crate::formats::page_cache::{held, Lookup, PageCache, Promised};
use crate::storage::{Object, PendingPieces, Pieces};

/// Byte ranges of a remote object fetched ahead of decoding, served to the Parquet reader as if
/// they were the file. A read outside them is fetched on demand; its failure is kept so the
/// caller reports the storage error rather than a decoding error.
pub(super) struct Fetched {
    pub(super) object: Arc<Object>,
    pub(super) parts: Vec<(u64, Bytes)>,
    pub(super) failure: Mutex<Option<Error>>,
}

impl Fetched {
    pub(in crate::formats) fn new(object: Arc<Object>, ranges: &[Range<u64>]) -> Result<Self> {
        let pieces = object.read_pieces(ranges)?;
        Ok(Self::from_pieces(object, pieces))
    }

    pub(in crate::formats) fn from_pieces(
        object: Arc<Object>,
        mut parts: Vec<(u64, Bytes)>,
    ) -> Self {
        parts.sort_by_key(|(at, _)| *at);
        Fetched {
            parts,
            object,
            failure: Mutex::new(None),
        }
    }

    /// Bytes `start..start + len`: what the pieces hold ([`held`]), else (outside what was
    /// fetched) a remote read.
    pub(in crate::formats) fn slice(&self, start: u64, len: u64) -> parquet::errors::Result<Bytes> {
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
    pub(in crate::formats) fn take_failure(&self) -> Option<Error> {
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

/// What one job reads of a remote shard.
pub(in crate::formats) struct FetchPlan {
    /// Pages the page cache held, as pieces.
    pub(super) cached: Pieces,
    /// Pages another job's fetch is bringing, taken from the cache when this job decodes (read
    /// on demand should they not be there).
    pub(super) expected: Vec<Range<u64>>,
    /// Ranges to fetch, merged.
    pub(super) fetch: Vec<Range<u64>>,
    /// Pages among those fetched to keep for later jobs.
    pub(super) keep: Vec<Range<u64>>,
}

impl FetchPlan {
    /// The pieces of this plan besides those it fetched: the cached ones, and the expected
    /// ones once their fetch kept them (the reader reads any it did not keep itself).
    pub(in crate::formats) fn into_cached_pieces(
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

/// A job's bytes: those being fetched (a remote shard's) or to read when it decodes (a local
/// shard's, with the pages later jobs want promised), and the pages the page cache held.
pub struct Prefetched {
    pub(super) pending: Option<PendingPieces>,
    pub(super) plan: FetchPlan,
    /// A local shard's promise, kept by the job once it has read `plan.fetch`.
    pub(super) promised: Option<Promised>,
}

/// Starts fetching what decoding `ranges` of the remote shard `object` will read, less the
/// pages `cache` holds. A local shard's job is planned alike and reads when it decodes: the
/// pages that several jobs of a row group read (dictionaries, a page two jobs share, column
/// chunks read whole where there is no page index) are then read from storage once.
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
    let local = object.local_file().is_some();
    if local && cache.is_none() {
        return None;
    }
    let cache = cache.map(|c| (c.clone(), PageCache::key_of(object)));
    let gap = if local { 0 } else { MERGE_GAP };
    let mut plan = index.fetch_plan(ranges, projection, cache.as_ref(), gap);
    if local {
        let promised = cache.map(|(cache, key)| cache.promise(&key, plan.keep.clone()));
        return Some(Prefetched {
            pending: None,
            plan,
            promised,
        });
    }
    let fetch = std::mem::take(&mut plan.fetch);
    if fetch.is_empty() {
        return Some(Prefetched {
            pending: None,
            plan,
            promised: None,
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
    Some(Prefetched {
        pending,
        plan,
        promised: None,
    })
}

/// Remote byte ranges closer than this are fetched in one request. A request costs about as
/// much as transferring a megabyte on object stores (and on `SeaweedFS` here), so reading a
/// short gap is cheaper than asking twice; 1 MiB is also `object_store`'s coalescing default.
pub(super) const MERGE_GAP: u64 = 1 << 20;

/// Sorts byte ranges and merges those at most `gap` apart.
pub(super) fn merge_ranges(mut ranges: Vec<Range<u64>>, gap: u64) -> Vec<Range<u64>> {
    ranges.sort_by_key(|r| r.start);
    let mut merged: Vec<Range<u64>> = Vec::with_capacity(ranges.len());
    for range in ranges {
        match merged.last_mut() {
            Some(last) if range.start <= last.end + gap => last.end = last.end.max(range.end),
            _ => merged.push(range),
        }
    }
    merged
}

/// Shares one [`Fetched`] between the reader that decodes from it and the caller that asks it
/// for a storage failure afterwards.
pub(super) struct ArcReader(pub(super) Arc<Fetched>);

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

impl ParquetIndex {
    /// Byte ranges to fetch before decoding the rows of `ranges` in `groups`: for each
    /// projected column, its dictionary page and the data pages holding those rows (whole
    /// column chunks where the shard has no page index), with nearby ranges merged.
    pub(in crate::formats) fn fetch_ranges(
        &self,
        ranges: &[Range<u64>],
        projection: &Projection,
    ) -> Vec<Range<u64>> {
        merge_ranges(self.pages(ranges, projection).0, MERGE_GAP)
    }

    /// The byte ranges decoding the rows of `ranges` reads, unmerged (see
    /// [`ParquetIndex::fetch_ranges`]), and among them the pages a later job of the same row
    /// groups is likely to read again: each column chunk's dictionary page, each page holding
    /// rows besides those `ranges` select, and a chunk read whole (no page index), which every
    /// job of its row group reads.
    pub(in crate::formats) fn pages(
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
                if !projects(projection, column) {
                    continue;
                }
                let (start, len) = column.byte_range();
                let Some(locations) = pages.and_then(|p| p.offset_index(g, c)).map(
                    parquet::file::page_index::offset_index::OffsetIndexMetaData::page_locations,
                ) else {
                    out.push(start..start + len);
                    reused.push(start..start + len);
                    continue;
                };
                if let Some(first_page) = locations.first() {
                    if (first_page.offset as u64) > start {
                        let dictionary = start..first_page.offset as u64;
                        out.push(dictionary.clone());
                        reused.push(dictionary);
                    }
                }
                for (k, page) in locations.iter().enumerate() {
                    let from = page.first_row_index as u64;
                    let to = locations
                        .get(k + 1)
                        .map_or(end - first, |next| next.first_row_index as u64);
                    let overlap: u64 = wanted
                        .iter()
                        .map(|w| w.end.min(to).saturating_sub(w.start.max(from)))
                        .sum();
                    if overlap > 0 {
                        let offset = page.offset as u64;
                        let bytes = offset..offset + page.compressed_page_size as u64;
                        // A page holding rows this job does not decode is one another job of
                        // the row group (the rest of a shuffle window, the next planned group)
                        // reads: at a job's ends, or between its scattered rows.
                        if overlap < to - from {
                            reused.push(bytes.clone());
                        }
                        out.push(bytes);
                    }
                }
            }
        }
        (out, reused)
    }

    /// What decoding the rows of `ranges` fetches, after taking what it can from `cache`
    /// (with the shard's key there), with ranges at most `gap` apart merged.
    pub(in crate::formats) fn fetch_plan(
        &self,
        ranges: &[Range<u64>],
        projection: &Projection,
        cache: Option<&(Arc<PageCache>, String)>,
        gap: u64,
    ) -> FetchPlan {
        let (needed, reused) = self.pages(ranges, projection);
        let Some((cache, key)) = cache else {
            return FetchPlan {
                cached: Vec::new(),
                expected: Vec::new(),
                fetch: merge_ranges(needed, gap),
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
        let fetch = merge_ranges(fetch, gap);
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

/// Whether `column` belongs to a projected root column.
fn projects(
    projection: &Projection,
    column: &parquet::file::metadata::ColumnChunkMetaData,
) -> bool {
    let root = &column.column_path().parts()[0];
    projection.columns.iter().any(|p| &p.source == root)
}

pub(super) fn load_metadata(object: &Arc<Object>) -> Result<ArrowReaderMetadata> {
    let metadata = read_metadata(object)?;
    check_layout(metadata.metadata(), object.size(), object.uri())?;
    for (g, group) in metadata.metadata().row_groups().iter().enumerate() {
        for column in group.columns() {
            guard::check_chunk_sizes(column, g).map_err(|m| format_error(object.uri(), None, m))?;
        }
    }
    Ok(metadata)
}

/// Refuses a footer arrow-rs would crash on or misread ([`guard::check_footer`]), on its raw
/// bytes, before it parses it. A footer that cannot be read here is left to arrow-rs to report.
fn check_raw_footer(reader: &impl ChunkReader, size: u64, path: &str) -> Result<()> {
    let Some(tail) = size
        .checked_sub(8)
        .and_then(|at| reader.get_bytes(at, 8).ok())
    else {
        return Ok(());
    };
    let len = u64::from(u32::from_le_bytes(tail[..4].try_into().expect("8 bytes")));
    if &tail[4..] != b"PAR1" || len > size - 8 {
        return Ok(());
    }
    let Ok(footer) = reader.get_bytes(size - 8 - len, len as usize) else {
        return Ok(());
    };
    guard::check_footer(&footer).map_err(|refusal| match refusal {
        guard::Refusal::Unsupported(message) => Error::Unsupported {
            path: path.to_owned(),
            encoding: ENCODING,
            message,
        },
        guard::Refusal::Malformed(message) => format_error(path, None, message),
    })
}

pub(super) fn read_metadata(object: &Arc<Object>) -> Result<ArrowReaderMetadata> {
    let path = object.uri();
    let options = ArrowReaderOptions::new().with_offset_index_policy(PageIndexPolicy::Optional);
    let metadata = if let Some(file) = object.local_file() {
        check_raw_footer(file.as_ref(), object.size(), path)?;
        let result = match object.meter() {
            Some(meter) => parse_footer(&metered(file, meter)?, &options),
            None => parse_footer(file.as_ref(), &options),
        };
        result.map_err(|e| decode_error(path, None, &e))?
    } else {
        let size = object.size();
        let tail_range = size.saturating_sub(REMOTE_TAIL_BYTES)..size;
        let tail = Fetched::new(object.clone(), std::slice::from_ref(&tail_range))?;
        check_raw_footer(&tail, size, path)?;
        parse_footer(&tail, &options).map_err(|e| {
            tail.take_failure()
                .unwrap_or_else(|| decode_error(path, None, &e))
        })?
    };
    // Before arrow-rs builds Arrow types from the schema (by recursion, see MAX_SCHEMA_DEPTH); the
    // raw footer check above has seen the schema already unless it could not read the footer.
    check_schema(&metadata, path)?;
    ArrowReaderMetadata::try_new(Arc::new(metadata), options)
        .map_err(|e| decode_error(path, None, &e))
}

/// The footer (and offset index) as `ArrowReaderMetadata::load` reads them, without yet
/// converting the schema to Arrow.
fn parse_footer<R: ChunkReader>(
    reader: &R,
    options: &ArrowReaderOptions,
) -> std::result::Result<ParquetMetaData, ParquetError> {
    ParquetMetaDataReader::new()
        .with_column_index_policy(options.column_index_policy())
        .with_offset_index_policy(options.offset_index_policy())
        .with_column_index_mask(options.column_index_mask().clone())
        .with_offset_index_mask(options.offset_index_mask().clone())
        .with_metadata_options(Some(options.metadata_options().clone()))
        .parse_and_finish(reader)
}
