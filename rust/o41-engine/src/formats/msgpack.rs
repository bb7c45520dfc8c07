//! Framed `MessagePack` shards, read and written: each record is a `MessagePack` map preceded by
//! its length as a little-endian u32 (`docs/formats.md`). Frames before a read's first row are
//! skipped by their length alone, never decoded.

use std::io::{Read, Write};
use std::sync::Arc;

use super::cursor::ObjectCursor;
use super::format::{wrong_data, EachRecord, RecordInspection, RecordSource, ShardFormat};
use super::value::{read_record, Record, RecordRef};
use super::{
    Encoding, PageCache, RecordCursor, ShardData, ShardIndex, ShardMeta, ShardReader, INDEX_STRIDE,
    MAX_RECORD_BYTES,
};
use crate::columns::Chunk;
use crate::error::{Error, Result};
use crate::fields::Projection;
use crate::record::project_record;
use crate::storage::{self, Object};
use crate::storage::{Pin, Storage};

/// Bytes of the length prefix before every frame.
pub const FRAME_HEADER_BYTES: usize = 4;
const ENCODING: &str = "msgpack";
// Small enough that landing on a new position does not read far past what is needed.
const BUF_BYTES: usize = 64 << 10;

fn format_error(path: &str, row: u64, message: impl Into<String>) -> Error {
    Error::Format {
        path: path.to_owned(),
        encoding: ENCODING,
        row: Some(row),
        message: message.into(),
    }
}

/// Framed `MessagePack`.
pub struct Msgpack;

impl ShardFormat for Msgpack {
    fn encoding(&self) -> Encoding {
        Encoding::Msgpack
    }

    fn inspect(&self, object: Arc<Object>, how: RecordInspection<'_>) -> Result<ShardMeta> {
        inspect(object, how.projection, how.max_record)
    }

    fn records(
        &self,
        _storage: &Storage,
        object: Arc<Object>,
        _chunk_rows: usize,
    ) -> Result<Box<dyn RecordSource>> {
        let reader = Reader::open(object, Arc::new(vec![0]), MAX_RECORD_BYTES)?;
        Ok(Box::new(EachRecord::new(reader, Reader::next_record)))
    }

    fn write(&self, out: &mut (dyn Write + Send), data: ShardData<'_>, name: &str) -> Result<()> {
        match data {
            ShardData::Records(records) => write(out, records, name),
            ShardData::Arrow { .. } => Err(wrong_data(Encoding::Msgpack)),
        }
    }
}

/// Byte offset of every `INDEX_STRIDE`-th frame.
#[derive(Debug)]
struct FrameIndex(Arc<Vec<u64>>);

impl ShardIndex for FrameIndex {
    fn open(
        self: Arc<Self>,
        object: Arc<Object>,
        meta: &ShardMeta,
        _pages: Option<&Arc<PageCache>>,
    ) -> Result<Box<dyn ShardReader>> {
        let reader = Reader::open(object, self.0.clone(), meta.longest_record)?;
        Ok(Box::new(reader))
    }
}

/// Reads frames of one shard, tracking the record number of the next frame.
pub struct Reader {
    path: String,
    offsets: Arc<Vec<u64>>,
    file: ObjectCursor,
    next_row: u64,
    frame: Vec<u8>,
    /// Largest frame payload read: a length prefix that claims more is an error before any
    /// buffer is sized from it.
    max_frame: u64,
}

/// Whether `marker`, a `MessagePack` payload's first byte, starts a map.
fn is_map_marker(marker: u8) -> bool {
    matches!(marker, 0x80..=0x8f | 0xde | 0xdf)
}

impl Reader {
    pub fn open(object: Arc<Object>, offsets: Arc<Vec<u64>>, max_frame: u64) -> Result<Self> {
        Ok(Reader {
            path: object.uri().to_owned(),
            offsets,
            file: ObjectCursor::new(object, 0, BUF_BYTES)?,
            next_row: 0,
            frame: Vec::new(),
            max_frame,
        })
    }

    /// Checks a frame's claimed length against what is left of the file and the frame limit,
    /// before anything is allocated or skipped for it.
    fn check_len(&self, len: usize) -> Result<()> {
        let remaining = self.file.remaining();
        if len as u64 > remaining {
            return Err(format_error(
                &self.path,
                self.next_row,
                format!(
                    "truncated frame: its length prefix claims {len} bytes, {remaining} remain in the file"
                ),
            ));
        }
        if len as u64 > self.max_frame {
            return Err(format_error(
                &self.path,
                self.next_row,
                format!(
                    "a frame of {len} bytes is longer than {} bytes, the most this stream holds \
                     for one record (the longest frame at open, or the memory limit's share)",
                    self.max_frame
                ),
            ));
        }
        Ok(())
    }

    /// Reads the next frame's length; `None` at a clean end of file.
    fn next_len(&mut self) -> Result<Option<usize>> {
        let mut header = [0u8; FRAME_HEADER_BYTES];
        let mut got = 0;
        while got < FRAME_HEADER_BYTES {
            let n = self
                .file
                .read(&mut header[got..])
                .map_err(|e| storage::from_io(e, |e| Error::io(&self.path, e)))?;
            if n == 0 {
                if got == 0 {
                    return Ok(None);
                }
                return Err(format_error(
                    &self.path,
                    self.next_row,
                    "truncated frame header",
                ));
            }
            got += n;
        }
        Ok(Some(u32::from_le_bytes(header) as usize))
    }

    fn skip_frame(&mut self) -> Result<bool> {
        let Some(len) = self.next_len()? else {
            return Ok(false);
        };
        self.check_len(len)?;
        self.file.skip(len as u64)?;
        Ok(true)
    }

    /// Skips a frame after checking that its payload is a map, reading only its first byte: a
    /// frame holding anything else is not a record, and is refused where it is counted.
    fn skip_record_frame(&mut self) -> Result<bool> {
        let Some(len) = self.next_len()? else {
            return Ok(false);
        };
        self.check_len(len)?;
        let mut marker = [0u8; 1];
        if len == 0 || self.file.read_exact(&mut marker).is_err() || !is_map_marker(marker[0]) {
            return Err(format_error(
                &self.path,
                self.next_row,
                "a record must be a map of fields; this frame holds something else",
            ));
        }
        self.file.skip(len as u64 - 1)?;
        Ok(true)
    }

    fn read_frame(&mut self) -> Result<bool> {
        let Some(len) = self.next_len()? else {
            return Ok(false);
        };
        self.check_len(len)?;
        self.frame.resize(len, 0);
        self.file.read_exact(&mut self.frame).map_err(|e| {
            if e.kind() == std::io::ErrorKind::UnexpectedEof {
                format_error(
                    &self.path,
                    self.next_row,
                    format!("truncated frame: expected {len} bytes"),
                )
            } else {
                storage::from_io(e, |e| Error::io(&self.path, e))
            }
        })?;
        Ok(true)
    }

    fn seek_row(&mut self, row: u64) -> Result<()> {
        // The nearest indexed frame at or before `row` (an index may be sparser than the shard).
        let k = ((row / INDEX_STRIDE) as usize).min(self.offsets.len().saturating_sub(1));
        if row < self.next_row || k as u64 * INDEX_STRIDE > self.next_row {
            self.file.seek_to(self.offsets[k])?;
            self.next_row = k as u64 * INDEX_STRIDE;
        }
        while self.next_row < row {
            if !self.skip_frame()? {
                return Err(format_error(
                    &self.path,
                    self.next_row,
                    "the shard ended before this row",
                ));
            }
            self.next_row += 1;
        }
        Ok(())
    }
}

fn project_frame(
    frame: &[u8],
    projection: &Projection,
    chunk: &mut Chunk,
    out_row: usize,
    path: &str,
    row: u64,
) -> Result<()> {
    let mut de = rmp_serde::Deserializer::from_read_ref(frame);
    project_record(&mut de, projection, &mut chunk.columns, out_row).map_err(|e| {
        let fields = Some(crate::record::RecordFields::Msgpack(frame));
        e.into_error(projection, path, (ENCODING, fields), row)
    })
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
        if !self.read_frame()? {
            return Err(format_error(
                &self.path,
                self.next_row,
                "the shard ended before this row",
            ));
        }
        project_frame(
            &self.frame,
            projection,
            chunk,
            out_row,
            &self.path,
            self.next_row,
        )?;
        self.next_row += 1;
        Ok(())
    }
}

impl Reader {
    /// The next whole record and its row number; `None` at the end of the shard.
    pub fn next_record(&mut self) -> Result<Option<(u64, Record)>> {
        if !self.read_frame()? {
            return Ok(None);
        }
        let row = self.next_row;
        let record = read_record(&mut rmp_serde::Deserializer::from_read_ref(&self.frame))
            .map_err(|message| format_error(&self.path, row, message))?;
        self.next_row += 1;
        Ok(Some((row, record)))
    }
}

/// Writes `records` as framed `MessagePack` to `out`.
pub fn write(mut out: impl Write, records: &[Record], path: &str) -> Result<()> {
    let mut frame = Vec::new();
    for (row, record) in records.iter().enumerate() {
        frame.clear();
        rmp_serde::encode::write_named(&mut frame, &RecordRef(record)).map_err(|e| {
            Error::Data {
                path: path.to_owned(),
                row: Some(row as u64),
                field: None,
                message: e.to_string(),
            }
        })?;
        let len = u32::try_from(frame.len()).map_err(|_| Error::Data {
            path: path.to_owned(),
            row: Some(row as u64),
            field: None,
            message: format!(
                "the record encodes to {} bytes, more than a frame's u32 length can hold",
                frame.len()
            ),
        })?;
        out.write_all(&len.to_le_bytes())
            .and_then(|()| out.write_all(&frame))
            .map_err(|e| Error::io(path, e))?;
    }
    out.flush().map_err(|e| Error::io(path, e))
}

pub fn inspect(object: Arc<Object>, projection: &Projection, max_record: u64) -> Result<ShardMeta> {
    let path = &object.uri().to_owned();
    let size = object.size();
    let mut reader = Reader::open(object, Arc::new(vec![0]), max_record)?;
    let mut offsets = Vec::new();
    let mut offset = 0u64;
    let mut longest = 0u64;
    let mut rows = 0u64;
    loop {
        if rows.is_multiple_of(INDEX_STRIDE) {
            offsets.push(offset);
        }
        let got = if rows == 0 {
            reader.read_frame()?
        } else {
            reader.skip_record_frame()?
        };
        if !got {
            break;
        }
        if rows == 0 {
            project_frame(
                &reader.frame,
                projection,
                &mut Chunk::padded(projection, 1),
                0,
                path,
                0,
            )?;
        }
        rows += 1;
        reader.next_row = rows;
        let end = reader.file.position();
        longest = longest.max(end - offset);
        offset = end;
        if offset > size {
            return Err(format_error(
                path,
                rows - 1,
                "truncated frame: it runs past the end of the file",
            ));
        }
    }
    if rows.is_multiple_of(INDEX_STRIDE) {
        // The loop pushed an entry for a row that does not exist.
        offsets.pop();
        if offsets.is_empty() {
            offsets.push(0);
        }
    }
    Ok(ShardMeta {
        dropped: crate::formats::Dropped::default(),
        rows,
        pin: Pin::default(),
        scratch_bytes: longest + BUF_BYTES as u64,
        longest_record: longest,
        index: Arc::new(FrameIndex(Arc::new(offsets))),
    })
}
