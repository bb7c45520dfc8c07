//! A local shard's file that counts what the decoder reads.

use std::fs::File;
use std::sync::Arc;

use bytes::Bytes;

use parquet::file::reader::{ChunkReader, Length};

use crate::error::{Error, Result};
use crate::metrics::Meter;
use crate::storage::Tallied;

/// A local shard's file that counts what the decoder reads into a [`Meter`].
pub(super) struct MeteredFile {
    pub(super) file: File,
    pub(super) meter: Arc<Meter>,
}

pub(super) fn metered(file: &File, meter: &Arc<Meter>) -> Result<MeteredFile> {
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
