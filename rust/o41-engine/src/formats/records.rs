//! Whole records of one shard of any encoding, in order and in chunks: what `iter_shard` yields.
//! Rows are numbered exactly as a stream numbers them (a blank JSON line is not a record), and
//! errors name the shard and row.

use std::sync::Arc;

use arrow_array::RecordBatch;

use super::value::Record;
use super::{jsonl, msgpack, parquet, MAX_RECORD_BYTES};
use crate::encoding::Encoding;
use crate::error::{Error, Result};
use crate::storage::Storage;

/// Consecutive records of a shard.
pub enum RecordChunk {
    /// Records of a self-describing shard (JSON Lines, `MessagePack`), each a map.
    Records(Vec<Record>),
    /// Rows of a Parquet shard, with every column.
    Arrow(RecordBatch),
}

enum Source {
    Lines(jsonl::Reader),
    Frames(msgpack::Reader),
    Parquet(parquet::Batches),
}

/// A forward reader of a shard's whole records.
pub struct ShardRecords {
    source: Source,
    /// An error met after some records of a chunk: those are returned first, it comes next.
    failed: Option<Error>,
}

impl ShardRecords {
    /// Opens `path` at its first record; Parquet shards are read `chunk_rows` rows at a time.
    pub fn open(
        storage: &Storage,
        path: &str,
        encoding: Encoding,
        chunk_rows: usize,
    ) -> Result<Self> {
        let object = Arc::new(storage.open(path)?);
        let source = match encoding {
            Encoding::Parquet => {
                Source::Parquet(parquet::Batches::open(&object, chunk_rows.max(1))?)
            }
            Encoding::Jsonl | Encoding::JsonlGz => Source::Lines(jsonl::Reader::open(
                object,
                encoding,
                None,
                MAX_RECORD_BYTES,
            )?),
            Encoding::Msgpack => Source::Frames(msgpack::Reader::open(
                object,
                Arc::new(vec![0]),
                MAX_RECORD_BYTES,
            )?),
            Encoding::Bin => {
                return Err(Error::Unsupported {
                    path: path.to_owned(),
                    encoding: encoding.name(),
                    message: "a .bin shard is a stream of token ids, not records; read it with \
                              a stage's packing or windows"
                        .to_owned(),
                })
            }
        };
        Ok(ShardRecords {
            source,
            failed: None,
        })
    }

    /// The next records, up to `max_rows` (Parquet: the reader's chunk); `None` at the end.
    /// A record that cannot be read fails only after every record before it was returned.
    pub fn next_chunk(&mut self, max_rows: usize) -> Result<Option<RecordChunk>> {
        if let Some(e) = self.failed.take() {
            return Err(e);
        }
        let mut records = Vec::new();
        while records.len() < max_rows.max(1) {
            let next = match &mut self.source {
                Source::Parquet(batches) => {
                    return Ok(batches.next_batch()?.map(RecordChunk::Arrow))
                }
                Source::Lines(reader) => reader.next_record(),
                Source::Frames(reader) => reader.next_record(),
            };
            match next {
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
