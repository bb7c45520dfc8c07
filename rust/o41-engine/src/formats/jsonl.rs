//! JSON Lines shards, plain or gzip-compressed, read and written. One object per line; blank
//! lines are not records. Plain files keep a sparse byte-offset index so a read can seek near
//! its first row. Gzip shards this engine wrote carry a member index (`gz_members`), so a read
//! decompresses only the members holding its rows; gzip streams from other writers are read
//! forward, skipping lines before the range without parsing them.

use std::io::{BufRead, BufReader, Write};
use std::ops::Range;
use std::sync::Arc;

use flate2::read::MultiGzDecoder;
use flate2::Decompress;

use super::cursor::ObjectCursor;
use super::gz_members::{self, MemberIndex};
use super::json_fast;
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
    if json_fast::project(line, projection, &mut chunk.columns, out_row) {
        return Ok(());
    }
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
    if encoding == Encoding::JsonlGz {
        if let Some(index) = gz_members::read_index(&object)? {
            return inspect_members(object, index, projection, max_record);
        }
    }
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

/// Inspects a seekable `jsonl.gz` shard from its member index: rows are counted by the index,
/// and only the first member is decompressed, to check the projection against the first record.
fn inspect_members(
    object: Arc<Object>,
    index: MemberIndex,
    projection: &Projection,
    max_record: u64,
) -> Result<ShardMeta> {
    let path = object.uri().to_owned();
    if index.longest_line > max_record {
        return Err(Error::Format {
            path,
            encoding: Encoding::JsonlGz.name(),
            row: None,
            message: format!(
                "the member index gives a line of {} bytes, longer than the {max_record} bytes \
                 this stream holds for one record (the memory limit's share); raise \
                 memory_limit_bytes",
                index.longest_line
            ),
        });
    }
    let index = Arc::new(index);
    let (rows, longest, largest) = (index.rows(), index.longest_line, index.largest_member());
    if rows > 0 {
        let mut reader = MemberReader::open(object, index.clone(), longest);
        let mut chunk = Chunk::padded(projection, 1);
        reader.project_next(projection, &mut chunk, 0)?;
    }
    Ok(ShardMeta {
        rows,
        pin: Pin::default(),
        // A reader holds one member, compressed and decompressed, and the line bounds of its
        // records (at most one per two bytes: a record's line holds at least `{}`).
        scratch_bytes: largest + largest / 2 * 16,
        longest_record: longest,
        index: ShardIndex::Members(index),
    })
}

/// Reads a seekable `jsonl.gz` shard one gzip member at a time: a read starting at row k
/// decompresses only the member holding it, and each member's records are counted against the
/// index before any is used.
pub struct MemberReader {
    path: String,
    object: Arc<Object>,
    index: Arc<MemberIndex>,
    inflater: Decompress,
    /// The decompressed lines of member `loaded`.
    text: Vec<u8>,
    /// Byte range in `text` of each record of member `loaded`, blank lines left out.
    lines: Vec<(usize, usize)>,
    loaded: Option<usize>,
    next_row: u64,
    /// Longest line, newline included: a longer one means the shard changed since it was
    /// inspected.
    max_line: u64,
}

impl MemberReader {
    pub fn open(object: Arc<Object>, index: Arc<MemberIndex>, max_line: u64) -> Self {
        MemberReader {
            path: object.uri().to_owned(),
            object,
            index,
            inflater: Decompress::new(false),
            text: Vec::new(),
            lines: Vec::new(),
            loaded: None,
            next_row: 0,
            max_line,
        }
    }

    fn error(&self, row: u64, message: String) -> Error {
        Error::Format {
            path: self.path.clone(),
            encoding: Encoding::JsonlGz.name(),
            row: Some(row),
            message,
        }
    }

    /// Decompresses member `m` and finds its records, which must be as many as the index says.
    fn load(&mut self, m: usize) -> Result<()> {
        self.loaded = None;
        let rows = self.index.rows_of(m);
        let bytes = self.object.read_range(self.index.bytes_of(m))?;
        gz_members::inflate_member(
            &bytes,
            self.index.size_of(m),
            &mut self.inflater,
            &mut self.text,
            &self.path,
            rows.start,
        )?;
        if self.text.last() != Some(&b'\n') {
            return Err(self.error(
                rows.start,
                format!("member {m} does not end at the end of a line"),
            ));
        }
        self.lines.clear();
        let mut start = 0;
        for (at, _) in self.text.iter().enumerate().filter(|(_, &b)| b == b'\n') {
            let line = &self.text[start..=at];
            if !is_blank(line) {
                let row = rows.start + self.lines.len() as u64;
                if line.len() as u64 > self.max_line {
                    return Err(self.error(
                        row,
                        format!(
                            "a line is longer than the {} bytes the member index gives as the \
                             longest",
                            self.max_line
                        ),
                    ));
                }
                self.lines.push((start, at + 1));
            }
            start = at + 1;
        }
        if self.lines.len() as u64 != rows.end - rows.start {
            return Err(self.error(
                rows.start,
                format!(
                    "member {m} holds {} records where the member index gives {}",
                    self.lines.len(),
                    rows.end - rows.start
                ),
            ));
        }
        self.loaded = Some(m);
        Ok(())
    }
}

impl RecordCursor for MemberReader {
    fn seek_row(&mut self, row: u64) -> Result<()> {
        self.next_row = row;
        Ok(())
    }

    fn project_next(
        &mut self,
        projection: &Projection,
        chunk: &mut Chunk,
        out_row: usize,
    ) -> Result<()> {
        let row = self.next_row;
        if row >= self.index.rows() {
            return Err(truncated(&self.path, Encoding::JsonlGz, row));
        }
        let m = match self.loaded {
            Some(m) if self.index.rows_of(m).contains(&row) => m,
            _ => {
                let m = self.index.member_of(row);
                self.load(m)?;
                m
            }
        };
        let (start, end) = self.lines[(row - self.index.rows_of(m).start) as usize];
        project_line(
            &self.text[start..end],
            projection,
            chunk,
            out_row,
            &self.path,
            Encoding::JsonlGz,
            row,
        )?;
        self.next_row += 1;
        Ok(())
    }
}

impl ShardReader for MemberReader {
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

/// Writes `records` as JSON Lines to `out`; `jsonl.gz` is written in the seekable member layout
/// (`gz_members`). A value JSON cannot represent (NaN, infinity, binary data) is refused naming
/// the record and field, never written as something else.
pub fn write(out: impl Write, encoding: Encoding, records: &[Record], path: &str) -> Result<()> {
    let io = |e: std::io::Error| Error::io(path, e);
    let mut out = out;
    if encoding == Encoding::JsonlGz {
        // Members are cut by line sizes, so the lines are serialised first (which also refuses
        // a bad record before a byte is written).
        let mut text = Vec::new();
        let mut ends = Vec::with_capacity(records.len());
        write_lines(&mut text, records, path, |at| ends.push(at))?;
        gz_members::write(&mut out, &text, &ends, path)?;
    } else {
        write_lines(&mut out, records, path, |_| {})?;
    }
    out.flush().map_err(io)
}

/// Writes one line per record; `line_end` hears the total bytes written after each line.
fn write_lines(
    out: &mut impl Write,
    records: &[Record],
    path: &str,
    mut line_end: impl FnMut(usize),
) -> Result<()> {
    let mut line = Vec::new();
    let mut written = 0;
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
        written += line.len();
        line_end(written);
    }
    Ok(())
}
