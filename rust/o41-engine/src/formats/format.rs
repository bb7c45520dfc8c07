//! The one trait a shard format implements ([`ShardFormat`]), and what it keeps about each shard
//! it inspected ([`ShardIndex`]).
//!
//! A format is a module under `formats/` holding a type that implements [`ShardFormat`], listed
//! once in `registry.rs`. Its inspection returns a [`ShardIndex`], and the index opens the
//! shard's readers: nothing outside the format's module knows how its shards are laid out.

use std::any::Any;
use std::fmt::Debug;
use std::io::Write;
use std::ops::Range;
use std::sync::Arc;

use super::value::Record;
use super::{PageCache, Prefetch, Promise, RecordChunk, ShardData, ShardMeta, ShardReader};
use crate::encoding::Encoding;
use crate::error::{Error, Result};
use crate::fields::Projection;
use crate::inspect_cache::InspectCache;
use crate::storage::{Object, Pin, Storage};

/// How a stage of records inspects a shard.
#[derive(Clone, Copy)]
pub struct RecordInspection<'a> {
    /// Where the shard's companion files are (a Megatron dataset's `.idx`).
    pub storage: &'a Storage,
    /// The fields the stage projects.
    pub projection: &'a Projection,
    /// The longest line or frame a reader may hold, in bytes.
    pub max_record: u64,
    /// Whether the first record is projected now, so a bad field fails at open.
    pub first_record: bool,
    /// Where what inspecting a shard learns is kept between streams (a gzip stream's access
    /// index), if anywhere.
    pub cache: Option<&'a InspectCache>,
}

/// A shard a configured name stands for, and what a dataset's listing promises of it.
pub type Listed = (String, Option<Promise<'static>>);

/// A shard format: how its shards are inspected, read whole, and written.
pub trait ShardFormat: Sync {
    /// The encoding configs and manifests name it by.
    fn encoding(&self) -> Encoding;

    /// Whether a stage of records reads it.
    fn reads_records(&self) -> bool {
        true
    }

    /// Whether a stage that packs or windows tokens reads it: its token documents are then
    /// found by `formats::tokens`, which plans the stage's windows over them.
    fn reads_tokens(&self) -> bool {
        false
    }

    /// The location the shard a config names `configured` is known by, whose reads, size and
    /// version belong to it: the name itself, unless the format names a shard by another file
    /// (a Megatron dataset by its `.idx` or common prefix is its `.bin`).
    fn shard_location(&self, configured: &str) -> String {
        configured.to_owned()
    }

    /// Whether `configured` names a dataset directory whose own listing names its shards (a
    /// `datasets` `save_to_disk` directory's `state.json`, an MDS dataset's `index.json`)
    /// rather than one shard.
    fn names_directory(&self, configured: &str) -> bool {
        let _ = configured;
        false
    }

    /// The shards the configured name `configured` stands for: a dataset directory's
    /// ([`ShardFormat::directory_shards`]), else the one shard at its location. Errors name the
    /// config entry `option`. A format whose name stands for another file overrides it to look
    /// for the name given first (a Megatron `.idx`).
    fn expand(&self, storage: &Storage, configured: &str, option: &str) -> Result<Vec<Listed>> {
        if self.names_directory(configured) {
            return self.directory_shards(storage, configured, option);
        }
        Ok(vec![(self.shard_location(configured), None)])
    }

    /// The shards of the dataset directory `dir` (one [`ShardFormat::names_directory`] names)
    /// and what its listing promises of each; errors name the config entry `option`.
    fn directory_shards(&self, storage: &Storage, dir: &str, option: &str) -> Result<Vec<Listed>> {
        let _ = (storage, option);
        Ok(vec![(dir.to_owned(), None)])
    }

    /// Counts the shard's records and indexes it for reads that start mid-shard.
    fn inspect(&self, object: Arc<Object>, how: RecordInspection<'_>) -> Result<ShardMeta>;

    /// A forward reader of the shard's whole records (`iter_shard`); Parquet reads
    /// `chunk_rows` rows at a time.
    fn records(
        &self,
        storage: &Storage,
        object: Arc<Object>,
        chunk_rows: usize,
    ) -> Result<Box<dyn RecordSource>>;

    /// Writes a shard from `data` into `out`; errors call it `name`.
    fn write(&self, out: &mut (dyn Write + Send), data: ShardData<'_>, name: &str) -> Result<()>;

    /// The token lists of a shard of records (each record's list in column `field`), for a
    /// format whose token stages read records (Arrow, MDS); `None` for formats `formats::tokens`
    /// reads itself (flat token files, Parquet).
    fn token_records(
        &self,
        storage: &Storage,
        object: &Arc<Object>,
        field: &str,
    ) -> Result<Option<Arc<dyn TokenRecords>>> {
        let _ = (storage, object, field);
        Ok(None)
    }
}

/// Calls `each(record, len, ids)` for a record and its token list; `ids` is empty unless the
/// caller asked for values.
pub type EachTokens<'a> = dyn FnMut(u64, u64, &[i64]) -> Result<()> + 'a;

/// A shard of records read as token documents: its records' token lists.
pub trait TokenRecords: Debug + Send + Sync {
    /// Records in the shard.
    fn rows(&self) -> u64;

    /// Most bytes one pass over a part of the shard holds while decoding it.
    fn scratch(&self) -> u64;

    /// Calls `each` for every record of `records` (sorted, disjoint) in order, with its ids
    /// when `values` is set (its length alone otherwise).
    fn for_each(
        &self,
        object: &Arc<Object>,
        records: &[Range<u64>],
        values: bool,
        each: &mut EachTokens<'_>,
    ) -> Result<()>;
}

/// A shard index as [`Any`], for the format's own readers; every index has it.
pub trait AsAny: Any + Send + Sync {
    /// The index as [`Any`].
    fn as_any(&self) -> &dyn Any;
    /// The shared index as [`Any`].
    fn into_any(self: Arc<Self>) -> Arc<dyn Any + Send + Sync>;
}

impl<T: Any + Send + Sync> AsAny for T {
    fn as_any(&self) -> &dyn Any {
        self
    }

    fn into_any(self: Arc<Self>) -> Arc<dyn Any + Send + Sync> {
        self
    }
}

/// What a format learnt about one shard at inspection, and the reader of that shard.
pub trait ShardIndex: Debug + AsAny {
    /// The storage block (a Parquet row group, a gzip member) holding `row`: read jobs do not
    /// straddle blocks, so each fetches and decodes only the blocks it needs.
    fn block_of(&self, row: u64) -> u64 {
        let _ = row;
        0
    }

    /// A reader of the shard `object`, which `meta` (holding this index) describes; a remote
    /// reader may share reusable pages through `pages`.
    fn open(
        self: Arc<Self>,
        object: Arc<Object>,
        meta: &ShardMeta,
        pages: Option<&Arc<PageCache>>,
    ) -> Result<Box<dyn ShardReader>>;

    /// Starts fetching what reading `ranges` of the remote shard at `path` (pinned to `pin`)
    /// needs; `None` where the format does not fetch ahead (a reader of a stream fetches ahead
    /// on its own).
    fn prefetch(
        self: Arc<Self>,
        storage: &Storage,
        (path, pin): (&str, &Pin),
        ranges: &[Range<u64>],
        projection: &Projection,
        pages: Option<&Arc<PageCache>>,
    ) -> Option<Prefetch> {
        let _ = (storage, path, pin, ranges, projection, pages);
        None
    }
}

/// A forward reader of a shard's whole records.
pub trait RecordSource: Send {
    /// The next records, at most `max_rows` (a Parquet source: its own chunk); `None` at the end.
    fn next_chunk(&mut self, max_rows: usize) -> Result<Option<RecordChunk>>;
}

/// The error for a writer given the other kind of data (records for Parquet, Arrow batches for
/// the others).
pub(super) fn wrong_data(encoding: Encoding) -> Error {
    Error::config(
        "data_format",
        format!(
            "{} shards are written from {}",
            encoding.name(),
            if encoding == Encoding::Parquet {
                "Arrow batches"
            } else {
                "records"
            }
        ),
    )
}

/// The saver's refusal to write a format read in place (`what`: "Megatron datasets"), for the
/// shard `name`, pointing to `instead`.
pub(super) fn read_in_place(name: &str, what: &str, instead: &str) -> Error {
    Error::config(
        "data_format",
        format!(
            "{name}: {what} are read in place, not written by the dataset saver; save {instead}"
        ),
    )
}

/// The refusal of a stage of records to read `object`, a format only token stages read
/// (`what`: "a .bin token stream").
pub(super) fn tokens_only(object: &Object, what: &str) -> Error {
    Error::config(
        "encoding",
        format!(
            "{} is {what}, read only by stages that pack or window tokens (Stage packing= or \
             windows=)",
            object.uri()
        ),
    )
}

/// The refusal of `iter_shard` to read `object`, of `encoding`, which holds no records.
pub(super) fn no_records(object: &Object, encoding: Encoding, what: &str) -> Error {
    Error::Unsupported {
        path: object.uri().to_owned(),
        encoding: encoding.name(),
        message: format!(
            "{what} is one stream of ids, not records; read it with a stage's packing or windows"
        ),
    }
}

/// Reads a shard's next whole record and its row number; `None` at the end.
pub(in crate::formats) type NextRecord<R> = fn(&mut R) -> Result<Option<(u64, Record)>>;

/// The records of a reader that reads one at a time (`next` gives the next record and its row),
/// gathered into chunks.
pub(in crate::formats) struct EachRecord<R> {
    reader: R,
    next: NextRecord<R>,
    /// An error met after some records of a chunk: those are returned first, it comes next.
    failed: Option<Error>,
}

impl<R> EachRecord<R> {
    pub(in crate::formats) fn new(reader: R, next: NextRecord<R>) -> Self {
        EachRecord {
            reader,
            next,
            failed: None,
        }
    }
}

impl<R: Send> RecordSource for EachRecord<R> {
    fn next_chunk(&mut self, max_rows: usize) -> Result<Option<RecordChunk>> {
        if let Some(e) = self.failed.take() {
            return Err(e);
        }
        let mut records = Vec::new();
        while records.len() < max_rows.max(1) {
            match (self.next)(&mut self.reader) {
                Ok(Some((_, record))) => records.push(record),
                Ok(None) => break,
                Err(e) if records.is_empty() => return Err(e),
                Err(e) => {
                    self.failed = Some(e);
                    break;
                }
            }
        }
        Ok((!records.is_empty()).then_some(RecordChunk::Records(records)))
    }
}
