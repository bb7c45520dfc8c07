//! Whole records of one shard of any encoding, in order and in chunks: what `iter_shard` yields.
//! Rows are numbered exactly as a stream numbers them (a blank JSON line is not a record), and
//! errors name the shard and row.

use std::sync::Arc;

use arrow_array::RecordBatch;

use super::format::RecordSource;
use super::registry::format_of;
use super::value::Record;
use crate::encoding::Encoding;
use crate::error::Result;
use crate::storage::Storage;

/// Consecutive records of a shard.
pub enum RecordChunk {
    /// Records of a self-describing shard (JSON Lines, `MessagePack`), each a map.
    Records(Vec<Record>),
    /// Rows of a Parquet shard, with every column.
    Arrow(RecordBatch),
}

/// A forward reader of a shard's whole records.
pub struct ShardRecords {
    source: Box<dyn RecordSource>,
}

impl ShardRecords {
    /// Opens `path` at its first record; Parquet shards are read `chunk_rows` rows at a time.
    pub fn open(
        storage: &Storage,
        path: &str,
        encoding: Encoding,
        chunk_rows: usize,
    ) -> Result<Self> {
        let format = format_of(encoding);
        let object = Arc::new(storage.open(&format.shard_location(path))?);
        let source = format.records(storage, object, chunk_rows)?;
        Ok(ShardRecords { source })
    }

    /// The next records, up to `max_rows` (Parquet: the reader's chunk); `None` at the end.
    /// A record that cannot be read fails only after every record before it was returned.
    pub fn next_chunk(&mut self, max_rows: usize) -> Result<Option<RecordChunk>> {
        self.source.next_chunk(max_rows)
    }
}
