//! JSON Lines shards, plain or gzip-compressed, read and written. One object per line; blank
//! lines are not records. Plain files keep a sparse byte-offset index so a read can seek near
//! its first row; gzip streams are read forward, skipping lines before the range without
//! parsing them.

use std::io::{BufRead, BufReader, Write};
use std::ops::Range;
use std::sync::Arc;

use flate2::read::MultiGzDecoder;
use flate2::write::GzEncoder;

use super::cursor::ObjectCursor;
use super::value::{read_record, Record, RecordRef};
use super::{
    read_record_ranges, Encoding, Prefetch, ReadFailure, RecordCursor, ShardIndex, ShardMeta,
    ShardReader, INDEX_STRIDE,
};
use crate::columns::Chunk;
use crate::error::{Error, Result};
use crate::fields::Projection;
use crate::record::project_record;
use crate::storage::Pin;
use crate::storage::{self, Object};

const BUF_BYTES: usize = 1 << 20;

fn is_blank(line: &[u8]) -> bool {
    line.iter().all(u8::is_ascii_whitespace)
}

/// Reads lines of one shard, tracking the record number of the next line.
pub struct Reader {
    path: String,
    object: Arc<Object>,
    encoding: Encoding,
    offsets: Option<Arc<Vec<u64>>>,
    lines: Option<Box<dyn BufRead + Send>>,
    /// Record number the next non-blank line holds.
    next_row: u64,
    line: Vec<u8>,
    /// Longest line read, newline included: a longer one is an error before it is buffered
    /// (a compressed stream can inflate to any length).
    max_line: u64,
}

impl Reader {
    pub fn open(
        object: Arc<Object>,
        encoding: Encoding,
        offsets: Option<Arc<Vec<u64>>>,
        max_line: u64,
    ) -> Result<Self> {
        let mut reader = Reader {
            path: object.uri().to_owned(),
            object,
            encoding,
            offsets,
            lines: None,
            next_row: 0,
            line: Vec::new(),
            max_line,
        };
        reader.rewind(0)?;
        Ok(reader)
    }

    /// Positions the reader at or before `row`: at the nearest indexed offset for plain files,
    /// at the start for compressed ones.
    fn rewind(&mut self, row: u64) -> Result<()> {
        let (offset, first_row) = match &self.offsets {
            // The nearest indexed line at or before `row`; a shard of blank lines indexes none.
            Some(offsets) if !offsets.is_empty() => {
                let k = ((row / INDEX_STRIDE) as usize).min(offsets.len() - 1);
                (offsets[k], k as u64 * INDEX_STRIDE)
            }
            Some(_) | None => (0, 0),
        };
        let file = ObjectCursor::new(self.object.clone(), offset, BUF_BYTES)?;
        // The cursor is buffered already: plain lines are read straight from its buffer, and
        // only decompressed bytes need a buffer of their own.
        self.lines = Some(if self.encoding == Encoding::JsonlGz {
            Box::new(BufReader::with_capacity(
                BUF_BYTES,
                MultiGzDecoder::new(file),
            ))
        } else {
            Box::new(file)
        });
        self.next_row = first_row;
        Ok(())
    }

    /// Reads the next line, blank or not, into `self.line`: its length in bytes, 0 at the end.
    /// `row` names it in errors.
    fn read_line(&mut self, row: u64) -> Result<usize> {
        let lines: &mut (dyn BufRead + Send) = self.lines.as_mut().expect("opened");
        self.line.clear();
        // One byte over the limit tells a line that is too long from one that is exactly it.
        let n = std::io::Read::take(lines, self.max_line.saturating_add(1))
            .read_until(b'\n', &mut self.line)
            .map_err(|e| read_error(&self.path, self.encoding, row, e))?;
        if n as u64 > self.max_line {
            return Err(Error::Format {
                path: self.path.clone(),
                encoding: self.encoding.name(),
                row: Some(row),
                message: format!(
                    "a line is longer than {} bytes, the most this stream holds for one record \
                     (the longest line at open, or the memory limit's share); a shard that \
                     changed since open, or raise memory_limit_bytes",
                    self.max_line
                ),
            });
        }
        Ok(n)
    }

    /// Reads the next non-blank line into `self.line`; false at end of file.
    fn next_line(&mut self) -> Result<bool> {
        loop {
            if self.read_line(self.next_row)? == 0 {
                return Ok(false);
            }
            if !is_blank(&self.line) {
                return Ok(true);
            }
        }
    }

    /// The next whole record and its row number; `None` at the end of the shard.
    pub fn next_record(&mut self) -> Result<Option<(u64, Record)>> {
        if !self.next_line()? {
            return Ok(None);
        }
        let row = self.next_row;
        let mut de = serde_json::Deserializer::from_slice(&self.line);
        let record = read_record(&mut de)
            .and_then(|record| de.end().map(|()| record).map_err(|e| e.to_string()))
            .map_err(|message| Error::Format {
                path: self.path.clone(),
                encoding: self.encoding.name(),
                row: Some(row),
                message,
            })?;
        self.next_row += 1;
        Ok(Some((row, record)))
    }

    fn seek_row(&mut self, row: u64) -> Result<()> {
        let jump_helps = self
            .offsets
            .as_ref()
            .is_some_and(|_| row / INDEX_STRIDE > self.next_row / INDEX_STRIDE);
        if row < self.next_row || jump_helps {
            self.rewind(row)?;
        }
        while self.next_row < row {
            if !self.next_line()? {
                return Err(truncated(&self.path, self.encoding, self.next_row));
            }
            self.next_row += 1;
        }
        Ok(())
    }
}

fn read_error(path: &str, encoding: Encoding, row: u64, e: std::io::Error) -> Error {
    // A storage failure is reported as such; anything else is the shard's bytes at fault.
    storage::from_io(e, |e| Error::Format {
        path: path.to_owned(),
        encoding: encoding.name(),
        row: Some(row),
        message: e.to_string(),
    })
}

fn truncated(path: &str, encoding: Encoding, row: u64) -> Error {
    Error::Format {
        path: path.to_owned(),
        encoding: encoding.name(),
        row: Some(row),
        message: "the shard ended before this row; it changed since the stream was opened"
            .to_owned(),
    }
}

fn project_line(
    line: &[u8],
    projection: &Projection,
    chunk: &mut Chunk,
    out_row: usize,
    path: &str,
    encoding: Encoding,
    row: u64,
) -> Result<()> {
    let mut de = serde_json::Deserializer::from_slice(line);
    project_record(&mut de, projection, &mut chunk.columns, out_row)
        .and_then(|()| {
            de.end()
                .map_err(|e| crate::record::RecordError::Malformed(e.to_string()))
        })
        .map_err(|e| e.into_error(projection, path, encoding.name(), row))
}

impl RecordCursor for Reader {
    fn seek_row(&mut self, row: u64) -> Result<()> {
        Reader::seek_row(self, row)
    }

    fn project_next(
        &mut self,
        projection: &Projection,
        chunk: &mut Chunk,
        out_row: usize,
    ) -> Result<()> {
        if !self.next_line()? {
            return Err(truncated(&self.path, self.encoding, self.next_row));
        }
        project_line(
            &self.line,
            projection,
            chunk,
            out_row,
            &self.path,
            self.encoding,
            self.next_row,
        )?;
        self.next_row += 1;
        Ok(())
    }
}

impl ShardReader for Reader {
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

pub fn inspect(
    object: Arc<Object>,
    encoding: Encoding,
    projection: &Projection,
    max_record: u64,
) -> Result<ShardMeta> {
    let path = &object.uri().to_owned();
    let mut reader = Reader::open(object, encoding, None, max_record)?;
    let plain = encoding == Encoding::Jsonl;
    let mut offsets = Vec::new();
    let mut offset = 0u64;
    let mut rows = 0u64;
    let mut longest = 0usize;
    loop {
        let n = reader.read_line(rows)?;
        if n == 0 {
            break;
        }
        longest = longest.max(n);
        if !is_blank(&reader.line) {
            if plain && rows.is_multiple_of(INDEX_STRIDE) {
                offsets.push(offset);
            }
            if rows == 0 {
                let mut chunk = Chunk::padded(projection, 1);
                project_line(&reader.line, projection, &mut chunk, 0, path, encoding, 0)?;
            }
            rows += 1;
        }
        offset += n as u64;
    }
    let index = if plain {
        ShardIndex::Offsets(Arc::new(offsets))
    } else {
        ShardIndex::Sequential
    };
    Ok(ShardMeta {
        rows,
        pin: Pin::default(),
        scratch_bytes: longest as u64 + 2 * BUF_BYTES as u64,
        longest_record: longest as u64,
        index,
    })
}

/// Writes `records` as JSON Lines to `out`, gzip-compressed for `jsonl.gz`. A value JSON cannot
/// represent (NaN, infinity, binary data) is refused naming the record and field, never written
/// as something else.
pub fn write(out: impl Write, encoding: Encoding, records: &[Record], path: &str) -> Result<()> {
    let io = |e: std::io::Error| Error::io(path, e);
    if encoding == Encoding::JsonlGz {
        // No name and a zero mtime in the header: the same records give the same bytes.
        let mut gz = GzEncoder::new(out, flate2::Compression::default());
        write_lines(&mut gz, records, path)?;
        gz.finish().map_err(io)?.flush().map_err(io)
    } else {
        let mut out = out;
        write_lines(&mut out, records, path)?;
        out.flush().map_err(io)
    }
}

fn write_lines(out: &mut impl Write, records: &[Record], path: &str) -> Result<()> {
    let mut line = Vec::new();
    for (row, record) in records.iter().enumerate() {
        if let Some((field, what)) = record.iter().find_map(|(key, value)| value.not_json(key)) {
            return Err(Error::Data {
                path: path.to_owned(),
                row: Some(row as u64),
                field: Some(field),
                message: format!(
                    "{what} not valid JSON; convert the value, or save as parquet or msgpack"
                ),
            });
        }
        line.clear();
        serde_json::to_writer(&mut line, &RecordRef(record)).map_err(|e| Error::Data {
            path: path.to_owned(),
            row: Some(row as u64),
            field: None,
            message: e.to_string(),
        })?;
        line.push(b'\n');
        out.write_all(&line).map_err(|e| Error::io(path, e))?;
    }
    Ok(())
}
