//! Shard encodings: their readers and writers, one module each (`parquet`, `jsonl`, `msgpack`,
//! `tokens` for `.bin`), each implementing [`ShardFormat`] and bound to its [`Encoding`] in
//! `registry.rs`, the one place a new format is listed.
//!
//! A stream opens each shard in two steps. [`inspect`] runs once at stream open: it counts rows,
//! builds whatever index lets later reads start mid-shard, and projects the first record so a
//! bad field fails at open. A [`ShardReader`] then decodes row ranges into column chunks.
//! [`ShardRecords`] reads whole records instead (`iter_shard`), and [`write_shard`] writes a
//! shard (the dataset saver), each through the same encoding modules.

mod array_record;
mod arrow_ipc;
mod cursor;
mod drops;
mod format;
pub mod identity;
mod jsonl;
mod mds;
mod megatron;
mod msgpack;
mod npy;
mod page_cache;
mod parquet;
mod records;
mod registry;
mod token_ids;
mod tokens;
mod value;

use std::fs::File;
use std::io::{BufWriter, Write};
use std::ops::Range;
use std::sync::Arc;

use arrow_array::RecordBatch;
use arrow_schema::SchemaRef;

use crate::columns::Chunk;
pub use crate::encoding::Encoding;
use crate::error::Error;
use crate::error::Result;
use crate::fields::Projection;
use crate::storage::{Object, Pin, Storage};

pub use crate::storage::promise::{Promise, PromiseOrigin};
pub use arrow_ipc::dataset_files;
pub use drops::{drops_rows, Dropped};
pub use format::{
    EachTokens, RecordInspection, RecordSource, ShardFormat, ShardIndex, TokenRecords,
};
pub use mds::dataset_files as mds_files;
pub use msgpack::FRAME_HEADER_BYTES;
pub use page_cache::PageCache;
pub use records::{RecordChunk, ShardRecords};
pub use registry::{format_of, token_encodings};
pub use tokens::lengths::store as store_list_lengths;
pub use tokens::{
    fill_window, LocatedPiece, TokenIndex, WindowColumn, META_FILE as TOKEN_META_FILE,
};
pub use value::{Record, Value};

/// The longest JSON line or `MessagePack` frame any reader holds, whatever the memory limit
/// allows: a record longer than this is an error, not an allocation.
pub const MAX_RECORD_BYTES: u64 = 256 << 20;

/// Buffers a JSON Lines or `MessagePack` reader holds besides its record (read and
/// decompression buffers).
pub const READER_BUFFER_BYTES: u64 = 2 << 20;

/// Records per entry of the sparse row index kept for JSON Lines and `MessagePack` shards.
pub const INDEX_STRIDE: u64 = 64;

/// What [`inspect`] learns about a shard: its row count and the index later reads use.
#[derive(Debug, Clone)]
pub struct ShardMeta {
    /// Records in the shard.
    pub rows: u64,
    /// Most bytes one read job's decoder holds besides the projected rows: a Parquet job's
    /// column chunks (compressed, decompressed and decoded; two row groups at most), the
    /// longest JSON line, the longest `MessagePack` frame, plus read buffers.
    pub scratch_bytes: u64,
    /// What identified the shard at inspection (size, version, inode); later reads are pinned
    /// to it and fail closed on anything else.
    pub pin: Pin,
    /// The longest line or frame of a JSON Lines or `MessagePack` shard: readers refuse a longer
    /// one (the shard changed) before buffering it.
    pub longest_record: u64,
    /// Rows a field's overflow rule `drop` leaves out ([`drops`]); `rows` counts the others.
    pub dropped: Dropped,
    index: Arc<dyn ShardIndex>,
}

impl ShardMeta {
    /// The storage block (a Parquet row group) holding `row`; 0 for encodings without blocks.
    /// Read jobs do not straddle blocks, so each fetches and decodes only the blocks it needs.
    pub fn block_of(&self, row: u64) -> u64 {
        self.index.block_of(self.dropped.file_row(row))
    }

    /// A token shard's index (its stream and windows); `None` for a shard of records.
    pub fn tokens(&self) -> Option<&TokenIndex> {
        self.index_as()
    }

    /// The shard's index, if the format that inspected it keeps a `T`.
    fn index_as<T: ShardIndex>(&self) -> Option<&T> {
        // Through `dyn ShardIndex`: `as_any` on the `Arc` itself would give the `Arc`.
        let index: &dyn ShardIndex = &*self.index;
        index.as_any().downcast_ref()
    }
}

/// How a stage that packs or windows tokens inspects its shards: its layout, and the cache of
/// list lengths that can spare decoding a Parquet token column.
#[derive(Clone, Copy)]
pub struct TokenInspection<'a> {
    /// The stage's token layout.
    pub layout: &'a crate::config::TokenLayout,
    /// Where list lengths are looked up and stored.
    pub cache: Option<&'a crate::inspect_cache::InspectCache>,
}

/// What an inspection holds a shard to, beyond being readable and within the limits.
#[derive(Debug, Clone, Copy, Default)]
pub struct Checks<'a> {
    /// What the shard was promised to be: a shard that breaks it fails closed, its size and
    /// version before any byte is read, its rows after.
    pub promise: Option<&'a Promise<'a>>,
    /// Whether the projection is checked against the shard's first record now. Open checks
    /// one shard of every source this way. A shard inspected at its first read is not: the read
    /// that follows decodes its rows and reports a projection error at its batch, and decoding
    /// the first record as well would cost object storage a request or more per column.
    pub first_record: bool,
    /// The object as the stream already saw it, when open looked at it moments before: a
    /// remote one is then not asked for again ([`Storage::open_pinned`]).
    pub seen: Option<&'a Pin>,
    /// The inspection cache, where a shard's format keeps more than its count (a gzip
    /// stream's access index).
    pub cache: Option<&'a crate::inspect_cache::InspectCache>,
}

/// Inspects a shard as a stage reads it: [`inspect`] for records, or, in a stage that packs or
/// windows tokens (`tokens`), the shard's windows; their plan may hold at most `max_plan` bytes.
pub fn inspect_shard(
    storage: &Storage,
    path: &str,
    encoding: Encoding,
    tokens: Option<TokenInspection<'_>>,
    projection: &Projection,
    limits: (u64, u64),
    checks: Checks<'_>,
) -> Result<ShardMeta> {
    let (max_record, max_plan) = limits;
    let Some(TokenInspection { layout, cache }) = tokens else {
        return inspect(storage, path, encoding, projection, max_record, checks);
    };
    let promise = checks.promise;
    let (object, pin) = open_held(storage, path, encoding, checks)?;
    if !format_of(encoding).reads_tokens() {
        return Err(Error::config(
            "encoding",
            format!(
                "{path}: stages that pack or window tokens read {} shards, not {}",
                token_encodings(),
                encoding.name()
            ),
        ));
    }
    let how = TokenInspection { layout, cache };
    let records = format_of(encoding).token_records(storage, &object, layout.field())?;
    // The stream's other record fields are read beside the tokens, element for element.
    let mut aligned: Vec<String> = Vec::new();
    for column in &projection.columns {
        if column.source != layout.field()
            && !column.source.starts_with('@')
            && !aligned.contains(&column.source)
        {
            aligned.push(column.source.clone());
        }
    }
    let mut meta = tokens::inspect(
        storage,
        &object,
        (encoding, records),
        how,
        (&aligned, max_plan),
    )?;
    // A manifest counts records; a checkpoint or an open stream, the windows they became.
    if let Some(promise) = promise.filter(|p| !p.origin.counts_records()) {
        promise.check_rows(path, encoding, meta.rows)?;
    }
    meta.pin = pin;
    Ok(meta)
}

/// Counts a shard's rows, indexes it, and finds the projection's columns in it, held to
/// `checks`. A line or frame longer than `max_record` bytes is an error, not an allocation.
/// (A shard whose rows are counted by reading it, JSON Lines without a member index or framed
/// msgpack, has its first record checked whatever `checks` says: counting reads it anyway.)
pub fn inspect(
    storage: &Storage,
    path: &str,
    encoding: Encoding,
    projection: &Projection,
    max_record: u64,
    checks: Checks<'_>,
) -> Result<ShardMeta> {
    let promise = checks.promise;
    let (object, pin) = open_held(storage, path, encoding, checks)?;
    // The first record may be one the rule leaves out: checked as any other, its length aside.
    let checked = drops::kept_as_truncated(projection);
    let how = RecordInspection {
        storage,
        projection: checked.as_ref().unwrap_or(projection),
        max_record,
        first_record: checks.first_record,
        cache: checks.cache,
    };
    let mut meta = format_of(encoding).inspect(object, how)?;
    meta.pin = pin;
    // A manifest counts the shard's records; a checkpoint or an open stream, those it kept.
    let manifest = promise.is_some_and(|p| p.origin.counts_records());
    let drops = drops_rows(projection);
    if let Some(promise) = promise.filter(|_| manifest || !drops) {
        promise.check_rows(path, encoding, meta.rows)?;
    }
    if drops {
        let dropped = drops::scan(storage, path, &meta, projection)?;
        meta.rows -= dropped.len() as u64;
        meta.dropped = Dropped::from(dropped);
        if let Some(promise) = promise.filter(|_| !manifest) {
            promise.check_rows(path, encoding, meta.rows)?;
        }
    }
    Ok(meta)
}

/// Counts the ids of a token file that holds no records (a `NumPy` array, a `.bin`): what a
/// data manifest lists as its rows, and the pin of the file counted. Reads its header or
/// `meta.json` only.
pub fn count_ids(storage: &Storage, path: &str, encoding: Encoding) -> Result<(u64, Pin)> {
    let object = storage.open(path)?;
    Ok((tokens::count_ids(storage, &object, encoding)?, object.pin()))
}

/// Opens a shard held to its promise: its size, version (a local file's content identity) and
/// stored checksum are checked before any of its bytes is read for records.
fn open_held(
    storage: &Storage,
    path: &str,
    encoding: Encoding,
    checks: Checks<'_>,
) -> Result<(Arc<Object>, Pin)> {
    let object = Arc::new(open_promised(storage, path, checks)?);
    let pin = object.pin();
    if let Some(promise) = checks.promise {
        promise.check_pin(path, encoding, &pin, || {
            identity::of(&object, encoding, checks.cache, promise.version.as_deref())
        })?;
        promise.check_stored_sha256(path, encoding, object.stored_sha256())?;
    }
    Ok((object, pin))
}

/// Opens a shard to inspect it. A remote object this stream has already seen (just now at open,
/// or pinned at open when `promise` comes from the listing, with its `ETag` and size) is not
/// asked for again: every read is pinned to that `ETag`, so an object replaced since fails
/// closed at its first read, as any read of a replaced object does, and the request a second
/// `HEAD` would cost is saved. A promised checksum needs the `HEAD`: it is what reports the
/// stored one.
fn open_promised(storage: &Storage, path: &str, checks: Checks<'_>) -> Result<Object> {
    let promised = match checks.promise {
        Some(Promise {
            sha256: Some(_), ..
        }) => return storage.open(path),
        Some(Promise {
            origin: PromiseOrigin::Listing,
            bytes: Some(size),
            version: Some(version),
            ..
        }) => Some(Pin {
            size: *size,
            version: Some(version.to_string()),
            inode: None,
        }),
        _ => None,
    };
    match checks.seen.cloned().or(promised) {
        Some(pin) if crate::storage::is_remote(path) && pin.version.is_some() => {
            storage.open_pinned(path, &pin)
        }
        _ => storage.open(path),
    }
}

/// A read that failed part way. The first `rows_done` rows of the chunk were decoded whole,
/// so a stream can still deliver every batch that needs only them.
#[derive(Debug)]
pub struct ReadFailure {
    /// Rows of the chunk decoded before the failure, every column.
    pub rows_done: usize,
    /// What failed (with the shard row, when one row is at fault).
    pub error: Error,
}

impl From<Error> for ReadFailure {
    fn from(error: Error) -> Self {
        ReadFailure {
            rows_done: 0,
            error,
        }
    }
}

/// Decodes row ranges of one shard. Readers keep their position, so reading ranges in
/// increasing order never re-reads a compressed stream from its start. A reader that failed is
/// dropped, not used again.
pub trait ShardReader: Send {
    /// Decodes the rows of `ranges` (sorted, disjoint) into consecutive rows of `chunk`.
    /// `prefetched` holds bytes [`prefetch`] started fetching for exactly these ranges;
    /// readers that do not fetch ahead ignore it.
    fn read_ranges(
        &mut self,
        ranges: &[Range<u64>],
        projection: &Projection,
        chunk: &mut Chunk,
        prefetched: Option<Prefetch>,
    ) -> std::result::Result<(), ReadFailure>;
}

/// Bytes of a remote shard being fetched ahead of the reader that will decode them.
pub struct Prefetch(parquet::Prefetched);

/// Starts fetching what reading `ranges` of a remote Parquet shard needs, so the transfer
/// overlaps other decoding, and plans a local Parquet shard's reads, so that pages several
/// jobs read are read once (`pages`); None where reads are not planned ahead (no page cache,
/// and encodings read as a stream, whose readers fetch ahead on their own).
pub fn prefetch(
    storage: &Storage,
    path: &str,
    meta: &ShardMeta,
    ranges: &[Range<u64>],
    projection: &Projection,
    pages: Option<&Arc<PageCache>>,
) -> Option<Prefetch> {
    if !crate::storage::is_remote(path) && pages.is_none() {
        return None;
    }
    let ranges = meta.dropped.file_ranges(ranges);
    meta.index
        .clone()
        .prefetch(storage, (path, &meta.pin), &ranges, projection, pages)
}

/// A reader of self-describing records (one line or frame each) that can seek by record number.
trait RecordCursor {
    /// Positions the cursor so the next record read is `row`.
    fn seek_row(&mut self, row: u64) -> Result<()>;
    /// Reads the next record into row `out_row` of `chunk`; the cursor advances by one record.
    fn project_next(
        &mut self,
        projection: &Projection,
        chunk: &mut Chunk,
        out_row: usize,
    ) -> Result<()>;
}

/// Line- and frame-based readers read their ranges record by record.
impl<T: RecordCursor + Send> ShardReader for T {
    fn read_ranges(
        &mut self,
        ranges: &[Range<u64>],
        projection: &Projection,
        chunk: &mut Chunk,
        _prefetched: Option<Prefetch>,
    ) -> std::result::Result<(), ReadFailure> {
        read_record_ranges(self, ranges, projection, chunk)
    }
}

/// Reads `ranges` (sorted, disjoint) into consecutive rows of a chunk, a range at a time:
/// `read(range, out_row)` projects one range from row `out_row`; a failure's `rows_done` counts
/// from the start of its range, and is returned counted from the chunk's first row.
pub(super) fn each_range(
    ranges: &[Range<u64>],
    mut read: impl FnMut(Range<u64>, usize) -> std::result::Result<(), ReadFailure>,
) -> std::result::Result<(), ReadFailure> {
    let mut out_row = 0usize;
    for range in ranges {
        read(range.clone(), out_row).map_err(|f| ReadFailure {
            rows_done: out_row + f.rows_done,
            error: f.error,
        })?;
        out_row += (range.end - range.start) as usize;
    }
    Ok(())
}

/// Reads `ranges` record by record.
fn read_record_ranges(
    cursor: &mut impl RecordCursor,
    ranges: &[Range<u64>],
    projection: &Projection,
    chunk: &mut Chunk,
) -> std::result::Result<(), ReadFailure> {
    let mut out_row = 0;
    let failed = |rows_done: usize| move |error: Error| ReadFailure { rows_done, error };
    for range in ranges {
        cursor.seek_row(range.start).map_err(failed(out_row))?;
        for _ in range.clone() {
            cursor
                .project_next(projection, chunk, out_row)
                .map_err(failed(out_row))?;
            out_row += 1;
        }
    }
    Ok(())
}

/// Opens a reader over a shard that [`inspect`] has seen; a remote Parquet reader shares
/// reusable pages with the stream's other jobs through `pages`.
pub fn open(
    storage: &Storage,
    path: &str,
    meta: &ShardMeta,
    pages: Option<&Arc<PageCache>>,
) -> Result<Box<dyn ShardReader>> {
    // Reads are pinned to the version inspected, so a replaced object fails at its first read.
    let object = Arc::new(storage.open_pinned(path, &meta.pin)?);
    let mut reader = meta.index.clone().open(object.clone(), meta, pages)?;
    if !meta.dropped.is_empty() {
        reader = Box::new(drops::Kept {
            reader,
            dropped: meta.dropped.clone(),
        });
    }
    Ok(Box::new(Pinned { reader, object }))
}

/// A reader that checks, around every read, that its shard is still the one inspected: a file
/// rewritten while the stream runs fails closed instead of mixing two versions.
struct Pinned {
    reader: Box<dyn ShardReader>,
    object: Arc<crate::storage::Object>,
}

impl ShardReader for Pinned {
    fn read_ranges(
        &mut self,
        ranges: &[Range<u64>],
        projection: &Projection,
        chunk: &mut Chunk,
        prefetched: Option<Prefetch>,
    ) -> std::result::Result<(), ReadFailure> {
        self.object.verify_unchanged()?;
        self.reader
            .read_ranges(ranges, projection, chunk, prefetched)?;
        // After too: no row read while the file was being rewritten counts as decoded.
        Ok(self.object.verify_unchanged()?)
    }
}

/// What a shard is written from: records (JSON Lines, `MessagePack`) or Arrow batches (Parquet).
pub enum ShardData<'a> {
    /// Whole records, each an ordered map.
    Records(&'a [Record]),
    /// Arrow batches of one schema.
    Arrow {
        /// The batches' schema.
        schema: SchemaRef,
        /// The rows.
        batches: &'a [RecordBatch],
    },
}

/// A shard as written: its size and the SHA-256 of its bytes, computed while writing.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WrittenShard {
    /// Size in bytes.
    pub bytes: u64,
    /// Hex SHA-256 of the bytes.
    pub sha256: String,
}

/// Writes the local file `path` in `encoding` from `data`; errors call the shard `name` (where
/// it will be published). The same data always gives the same bytes (no timestamps, no file
/// names inside), so a restarted save reproduces its checksum.
pub fn write_shard(
    path: &str,
    name: &str,
    encoding: Encoding,
    data: ShardData<'_>,
) -> Result<WrittenShard> {
    let file = File::create(path).map_err(|e| Error::io(path, e))?;
    let mut out = Hashing::new(BufWriter::with_capacity(1 << 20, file));
    format_of(encoding).write(&mut out, data, name)?;
    out.flush().map_err(|e| Error::io(path, e))?;
    let (inner, written) = out.finish();
    inner
        .into_inner()
        .map_err(|e| Error::io(path, e.into_error()))?
        .sync_all()
        .map_err(|e| Error::io(path, e))?;
    Ok(written)
}

/// A writer that counts and hashes what passes through it.
struct Hashing<W> {
    inner: W,
    digest: ring::digest::Context,
    bytes: u64,
}

impl<W: Write> Hashing<W> {
    fn new(inner: W) -> Self {
        Hashing {
            inner,
            digest: ring::digest::Context::new(&ring::digest::SHA256),
            bytes: 0,
        }
    }

    fn finish(self) -> (W, WrittenShard) {
        let sha256 = crate::storage::hex(self.digest.finish().as_ref());
        (
            self.inner,
            WrittenShard {
                bytes: self.bytes,
                sha256,
            },
        )
    }
}

impl<W: Write> Write for Hashing<W> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let n = self.inner.write(buf)?;
        self.digest.update(&buf[..n]);
        self.bytes += n as u64;
        Ok(n)
    }

    fn flush(&mut self) -> std::io::Result<()> {
        self.inner.flush()
    }
}
