//! Parquet as a [`ShardFormat`], and its footer index as the [`ShardIndex`] that opens readers.

use std::io::Write;
use std::ops::Range;
use std::sync::Arc;

use super::{footer::ParquetIndex, inspect, write, Batches, Reader};
use crate::encoding::Encoding;
use crate::error::Result;
use crate::fields::Projection;
use crate::formats::format::{wrong_data, RecordInspection, RecordSource, ShardFormat};
use crate::formats::{
    PageCache, Prefetch, RecordChunk, ShardData, ShardIndex, ShardMeta, ShardReader,
};
use crate::storage::{Object, Pin, Storage};

/// Apache Parquet.
pub struct Parquet;

impl ShardFormat for Parquet {
    fn encoding(&self) -> Encoding {
        Encoding::Parquet
    }

    fn reads_tokens(&self) -> bool {
        true
    }

    fn inspect(&self, object: Arc<Object>, how: RecordInspection<'_>) -> Result<ShardMeta> {
        inspect::inspect(object, how.projection, how.first_record)
    }

    fn records(
        &self,
        _storage: &Storage,
        object: Arc<Object>,
        chunk_rows: usize,
    ) -> Result<Box<dyn RecordSource>> {
        Ok(Box::new(Batches::open(&object, chunk_rows.max(1))?))
    }

    fn write(&self, out: &mut (dyn Write + Send), data: ShardData<'_>, name: &str) -> Result<()> {
        match data {
            ShardData::Arrow { schema, batches } => write::write(out, schema, batches, name),
            ShardData::Records(_) => Err(wrong_data(Encoding::Parquet)),
        }
    }
}

impl RecordSource for Batches {
    fn next_chunk(&mut self, _max_rows: usize) -> Result<Option<RecordChunk>> {
        Ok(self.next_batch()?.map(RecordChunk::Arrow))
    }
}

impl ShardIndex for ParquetIndex {
    fn block_of(&self, row: u64) -> u64 {
        self.group_of(row)
    }

    fn open(
        self: Arc<Self>,
        object: Arc<Object>,
        _meta: &ShardMeta,
        pages: Option<&Arc<PageCache>>,
    ) -> Result<Box<dyn ShardReader>> {
        Ok(Box::new(Reader::open(object, self).with_pages(pages)))
    }

    fn prefetch(
        self: Arc<Self>,
        storage: &Storage,
        (path, pin): (&str, &Pin),
        ranges: &[Range<u64>],
        projection: &Projection,
        pages: Option<&Arc<PageCache>>,
    ) -> Option<Prefetch> {
        let object = storage.open_pinned(path, pin).ok()?;
        super::fetch::prefetch(&object, &self, ranges, projection, pages).map(Prefetch)
    }
}
