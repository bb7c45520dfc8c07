//! A buffered forward reader over an [`Object`] that can jump to a byte offset: the byte source
//! of the line- and frame-based shard readers, for local files and remote objects alike.

use std::io::{BufRead, BufReader, Read};
use std::sync::Arc;

use crate::error::{Error, Result};
use crate::storage::{self, Object};

/// Remote skips shorter than this read through the bytes already in flight; longer ones start a
/// new ranged request at the target.
const SKIP_BY_READING: u64 = 4 << 20;

pub struct ObjectCursor {
    object: Arc<Object>,
    inner: BufReader<Box<dyn Read + Send>>,
    /// Offset of the next byte `read` returns.
    pos: u64,
    capacity: usize,
}

impl ObjectCursor {
    pub fn new(object: Arc<Object>, offset: u64, capacity: usize) -> Result<Self> {
        let inner = BufReader::with_capacity(capacity, object.reader(offset)?);
        Ok(ObjectCursor {
            object,
            inner,
            pos: offset,
            capacity,
        })
    }

    pub fn position(&self) -> u64 {
        self.pos
    }

    /// Bytes of the object after the current position.
    pub fn remaining(&self) -> u64 {
        self.object.size().saturating_sub(self.pos)
    }

    pub fn seek_to(&mut self, offset: u64) -> Result<()> {
        if offset == self.pos {
            return Ok(());
        }
        let buffered = self.inner.buffer().len() as u64;
        if offset > self.pos && offset - self.pos <= buffered {
            self.inner.consume((offset - self.pos) as usize);
        } else {
            self.inner = BufReader::with_capacity(self.capacity, self.object.reader(offset)?);
        }
        self.pos = offset;
        Ok(())
    }

    /// Moves `n` bytes forward without returning them.
    pub fn skip(&mut self, n: u64) -> Result<()> {
        if self.object.local_file().is_some() || n >= SKIP_BY_READING {
            return self.seek_to(self.pos + n);
        }
        let copied = std::io::copy(&mut self.by_ref().take(n), &mut std::io::sink())
            .map_err(|e| storage::from_io(e, |e| Error::io(self.object.uri(), e)))?;
        if copied < n {
            // Past the end: the next read reports it, as a seek past the end of a file would.
            self.pos += n - copied;
        }
        Ok(())
    }
}

impl ObjectCursor {
    /// Fails once the object's reads are cancelled; looked at before every refill, so a long
    /// scan of a local file stops as promptly as a remote read.
    fn check_cancel(&self) -> std::io::Result<()> {
        if self.inner.buffer().is_empty() {
            self.object
                .cancel()
                .check(self.object.uri())
                .map_err(storage::carry)?;
        }
        Ok(())
    }
}

impl Read for ObjectCursor {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        self.check_cancel()?;
        let n = self.inner.read(buf)?;
        self.pos += n as u64;
        Ok(n)
    }
}

impl BufRead for ObjectCursor {
    fn fill_buf(&mut self) -> std::io::Result<&[u8]> {
        self.check_cancel()?;
        self.inner.fill_buf()
    }

    fn consume(&mut self, amount: usize) {
        self.inner.consume(amount);
        self.pos += amount as u64;
    }
}
