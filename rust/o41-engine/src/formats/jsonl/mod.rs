//! JSON Lines shards, plain or gzip-compressed, read and written. One object per line; blank
//! lines are not records. Plain files keep a sparse byte-offset index so a read can seek near
//! its first row. Gzip shards this engine wrote carry a member index (`gz_members`), so a read
//! decompresses only the members holding its rows; gzip streams from other writers get an
//! access index on their first inspection (`gz_access`, kept in the inspection cache), so a
//! read inflates from the access point before its rows, skipping lines without parsing them.

use std::io::{BufRead, BufReader, Write};
use std::sync::Arc;

use flate2::Decompress;

// The format's own parts: gzip members this engine writes, access points into any gzip stream,
// the fast path from JSON text to columns, and line splitting.
mod gz_access;
mod gz_members;
mod json_fast;
mod lines;

use super::cursor::ObjectCursor;
use super::format::{wrong_data, EachRecord, RecordInspection, RecordSource, ShardFormat};
use super::value::{read_record, Record, RecordRef};
use super::{
    Encoding, PageCache, RecordCursor, ShardData, ShardIndex, ShardMeta, ShardReader, INDEX_STRIDE,
};
use crate::columns::Chunk;
use crate::error::{Error, Result};
use crate::fields::Projection;
use crate::record::project_record;
use crate::storage::{self, Object};
use crate::storage::{Pin, Storage};
use gz_access::{AccessIndex, GzStream, ACCESS_FILE};
use gz_members::MemberIndex;
use lines::{first_newline, for_each_newline, is_blank, too_long};

const BUF_BYTES: usize = 1 << 20;
/// The output a gzip stream's reader inflates at a time.
const GZ_BUF_BYTES: usize = 64 << 10;

/// JSON Lines, plain ([`JSONL`]) or gzip-compressed ([`JSONL_GZ`]).
pub struct JsonLines(Encoding);

/// Plain JSON Lines.
pub const JSONL: JsonLines = JsonLines(Encoding::Jsonl);

/// Gzip-compressed JSON Lines.
pub const JSONL_GZ: JsonLines = JsonLines(Encoding::JsonlGz);

impl ShardFormat for JsonLines {
    fn encoding(&self) -> Encoding {
        self.0
    }

    fn inspect(&self, object: Arc<Object>, how: RecordInspection<'_>) -> Result<ShardMeta> {
        inspect(object, self.0, &how)
    }

    fn records(
        &self,
        _storage: &Storage,
        object: Arc<Object>,
        _chunk_rows: usize,
    ) -> Result<Box<dyn RecordSource>> {
        let reader = Reader::open(
            object,
            self.0,
            Lines::Forward,
            (super::MAX_RECORD_BYTES, None),
        )?;
        Ok(Box::new(EachRecord::new(reader, Reader::next_record)))
    }

    fn write(&self, out: &mut (dyn Write + Send), data: ShardData<'_>, name: &str) -> Result<()> {
        match data {
            ShardData::Records(records) => write(out, self.0, records, name),
            ShardData::Arrow { .. } => Err(wrong_data(self.0)),
        }
    }
}

/// Where a shard's lines are: every `INDEX_STRIDE`-th record's byte offset in a plain file, a
/// gzip stream's access points, or nothing (read forward).
#[derive(Debug, Clone)]
pub enum Lines {
    Forward,
    Offsets(Arc<Vec<u64>>),
    Access(Arc<AccessIndex>),
}

#[derive(Debug)]
struct LineIndex {
    encoding: Encoding,
    lines: Lines,
}

impl ShardIndex for LineIndex {
    fn block_of(&self, row: u64) -> u64 {
        match &self.lines {
            Lines::Access(index) => index.span_of(row),
            Lines::Forward | Lines::Offsets(_) => 0,
        }
    }

    fn open(
        self: Arc<Self>,
        object: Arc<Object>,
        meta: &ShardMeta,
        pages: Option<&Arc<PageCache>>,
    ) -> Result<Box<dyn ShardReader>> {
        // A gzip stream's jobs read its compressed blocks through the stream's cache.
        let pages = pages
            .filter(|_| self.encoding == Encoding::JsonlGz)
            .cloned();
        let reader = Reader::open(
            object,
            self.encoding,
            self.lines.clone(),
            (meta.longest_record, pages),
        )?;
        Ok(Box::new(reader))
    }
}

impl ShardIndex for MemberIndex {
    fn block_of(&self, row: u64) -> u64 {
        self.member_of(row) as u64
    }

    fn open(
        self: Arc<Self>,
        object: Arc<Object>,
        meta: &ShardMeta,
        _pages: Option<&Arc<PageCache>>,
    ) -> Result<Box<dyn ShardReader>> {
        Ok(Box::new(MemberReader::open(
            object,
            self,
            meta.longest_record,
        )))
    }
}

/// Reads lines of one shard, tracking the record number of the next line.
pub struct Reader {
    path: String,
    object: Arc<Object>,
    encoding: Encoding,
    index: Lines,
    lines: Option<Box<dyn BufRead + Send>>,
    /// Record number the next non-blank line holds.
    next_row: u64,
    line: Vec<u8>,
    /// Longest line read, newline included: a longer one is an error before it is buffered
    /// (a compressed stream can inflate to any length).
    max_line: u64,
    /// Where a gzip stream's compressed blocks are kept for the stream's other jobs.
    pages: Option<Arc<PageCache>>,
}

impl Reader {
    /// A reader of `object` positioned at its first record; lines longer than `max_line` are
    /// refused, and a gzip stream's compressed bytes are read through `pages` where given.
    pub fn open(
        object: Arc<Object>,
        encoding: Encoding,
        index: Lines,
        (max_line, pages): (u64, Option<Arc<PageCache>>),
    ) -> Result<Self> {
        let mut reader = Reader {
            path: object.uri().to_owned(),
            object,
            encoding,
            index,
            lines: None,
            next_row: 0,
            line: Vec::new(),
            max_line,
            pages,
        };
        reader.rewind(0)?;
        Ok(reader)
    }

    /// Positions the reader at or before `row`: at the nearest indexed offset of a plain file,
    /// the nearest access point of a gzip stream, or the start.
    fn rewind(&mut self, row: u64) -> Result<()> {
        if self.encoding == Encoding::JsonlGz {
            return self.rewind_gzip(row);
        }
        let (offset, first_row) = match &self.index {
            // The nearest indexed line at or before `row`; a shard of blank lines indexes none.
            Lines::Offsets(offsets) if !offsets.is_empty() => {
                let k = ((row / INDEX_STRIDE) as usize).min(offsets.len() - 1);
                (offsets[k], k as u64 * INDEX_STRIDE)
            }
            _ => (0, 0),
        };
        // The cursor is buffered already: plain lines are read straight from its buffer.
        let file = ObjectCursor::new(self.object.clone(), offset, BUF_BYTES)?;
        self.lines = Some(Box::new(file));
        self.next_row = first_row;
        Ok(())
    }

    fn rewind_gzip(&mut self, row: u64) -> Result<()> {
        let point = match &self.index {
            Lines::Access(index) => index
                .point_before(row)
                .map(|(k, point)| (index.clone(), k, *point)),
            _ => None,
        };
        let (stream, first_row, skip) = match point {
            Some((index, k, point)) => {
                match GzStream::at(&self.object, &index, k, self.pages.as_ref())? {
                    (stream, true) => (stream, point.row(), point.skip()),
                    // The window is gone from the cache: from the start, as without an index.
                    (stream, false) => (stream, 0, 0),
                }
            }
            None => (
                GzStream::from_start(&self.object, self.pages.as_ref())?,
                0,
                0,
            ),
        };
        // Small reads: a job ends where its span does, and inflating a MiB past it for the
        // buffer would inflate rows another thread reads.
        let mut lines = BufReader::with_capacity(GZ_BUF_BYTES, stream);
        // From a point, the bytes before the first line that starts there.
        let skipped = std::io::copy(
            &mut std::io::Read::take(&mut lines, skip),
            &mut std::io::sink(),
        )
        .map_err(|e| read_error(&self.path, self.encoding, first_row, e))?;
        if skipped < skip {
            return Err(truncated(&self.path, self.encoding, first_row));
        }
        self.lines = Some(Box::new(lines));
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
            return Err(too_long(&self.path, self.encoding, row, self.max_line));
        }
        Ok(n)
    }

    /// Moves past the next line, blank or not, without copying it: its length in bytes (0 at
    /// the end) and whether it is blank. Skipping and counting lines costs no more than finding
    /// their ends in the read buffer.
    fn skip_line(&mut self, row: u64) -> Result<(usize, bool)> {
        let lines: &mut (dyn BufRead + Send) = self.lines.as_mut().expect("opened");
        let (mut n, mut blank) = (0usize, true);
        loop {
            let buf = lines
                .fill_buf()
                .map_err(|e| read_error(&self.path, self.encoding, row, e))?;
            if buf.is_empty() {
                break;
            }
            let (take, done) = match first_newline(buf) {
                Some(at) => (at + 1, true),
                None => (buf.len(), false),
            };
            blank = blank && is_blank(&buf[..take]);
            n += take;
            lines.consume(take);
            if n as u64 > self.max_line {
                return Err(too_long(&self.path, self.encoding, row, self.max_line));
            }
            if done {
                break;
            }
        }
        Ok((n, blank))
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
        let jump_helps = match &self.index {
            Lines::Offsets(_) => row / INDEX_STRIDE > self.next_row / INDEX_STRIDE,
            Lines::Access(index) => index
                .point_before(row)
                .is_some_and(|(_, point)| point.row() > self.next_row),
            Lines::Forward => false,
        };
        if row < self.next_row || jump_helps {
            self.rewind(row)?;
        }
        while self.next_row < row {
            match self.skip_line(self.next_row)? {
                (0, _) => return Err(truncated(&self.path, self.encoding, self.next_row)),
                (_, true) => {}
                (_, false) => self.next_row += 1,
            }
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
        .map_err(|e| {
            let fields = Some(crate::record::RecordFields::Json(line));
            e.into_error(projection, path, (encoding.name(), fields), row)
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

pub fn inspect(
    object: Arc<Object>,
    encoding: Encoding,
    how: &RecordInspection<'_>,
) -> Result<ShardMeta> {
    let (projection, max_record) = (how.projection, how.max_record);
    let path = &object.uri().to_owned();
    if encoding == Encoding::JsonlGz {
        if let Some(index) = gz_members::read_index(&object)? {
            return inspect_members(object, index, projection, max_record, how.first_record);
        }
        return inspect_stream(object, how);
    }
    let mut reader = Reader::open(object, encoding, Lines::Forward, (max_record, None))?;
    let mut offsets = Vec::new();
    let mut offset = 0u64;
    let mut rows = 0u64;
    let mut longest = 0usize;
    loop {
        // Only the first record is looked at; every other line is counted where it lies in
        // the read buffer.
        let (n, blank) = if rows == 0 {
            let n = reader.read_line(rows)?;
            (n, is_blank(&reader.line))
        } else {
            reader.skip_line(rows)?
        };
        if n == 0 {
            break;
        }
        longest = longest.max(n);
        if !blank {
            if rows.is_multiple_of(INDEX_STRIDE) {
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
    let index = Arc::new(LineIndex {
        encoding,
        lines: Lines::Offsets(Arc::new(offsets)),
    });
    Ok(ShardMeta {
        dropped: crate::formats::Dropped::default(),
        rows,
        pin: Pin::default(),
        scratch_bytes: longest as u64 + 2 * BUF_BYTES as u64,
        longest_record: longest as u64,
        index,
    })
}

/// A cached gzip access index is at most this long (256 points and their windows).
const MAX_ACCESS_FILE: u64 = 16 << 20;
/// What a gzip reader holds besides its line and buffers: the inflater's state and window.
const INFLATER_BYTES: u64 = 256 << 10;

/// Inspects a gzip stream another writer made: from its access index in the inspection cache
/// when one is there (reading only the first record, for `first_record`), or by inflating it
/// once, which counts its rows, checks its first record and builds the access index.
fn inspect_stream(object: Arc<Object>, how: &RecordInspection<'_>) -> Result<ShardMeta> {
    let (encoding, path) = (Encoding::JsonlGz, object.uri().to_owned());
    let pin = object.pin();
    let cached = how
        .cache
        .and_then(|c| c.lookup_companion(ACCESS_FILE, (&path, encoding, &pin, ""), MAX_ACCESS_FILE))
        .and_then(|found| AccessIndex::decode(&found.payload, found.path, found.at));
    let (rows, longest, lines) = if let Some(index) = cached {
        let (rows, longest) = (index.rows(), index.longest_line());
        if longest > how.max_record {
            return Err(too_long(&path, encoding, 0, how.max_record));
        }
        let lines = Lines::Access(Arc::new(index));
        if how.first_record && rows > 0 {
            let mut reader = Reader::open(object, encoding, lines.clone(), (longest, None))?;
            let mut chunk = Chunk::padded(how.projection, 1);
            reader.project_next(how.projection, &mut chunk, 0)?;
        }
        (rows, longest, lines)
    } else {
        let scan = gz_access::scan(&object, how.max_record, how.cache.is_some())?;
        if let Some(line) = &scan.first_line {
            let mut chunk = Chunk::padded(how.projection, 1);
            project_line(line, how.projection, &mut chunk, 0, &path, encoding, 0)?;
        }
        // Without the cache (off, or not writable) the stream is read forward.
        let lines = how
            .cache
            .filter(|_| scan.has_points())
            .and_then(|c| {
                let payload = scan.encode();
                let (file, at) =
                    c.store_companion(ACCESS_FILE, (&path, encoding, &pin, ""), &payload)?;
                AccessIndex::decode(&payload, file, at)
            })
            .map_or(Lines::Forward, |index| Lines::Access(Arc::new(index)));
        (scan.rows, scan.longest_line, lines)
    };
    Ok(ShardMeta {
        dropped: crate::formats::Dropped::default(),
        rows,
        pin: Pin::default(),
        scratch_bytes: longest + 2 * BUF_BYTES as u64 + INFLATER_BYTES,
        longest_record: longest,
        index: Arc::new(LineIndex { encoding, lines }),
    })
}

/// Inspects a seekable `jsonl.gz` shard from its member index: rows are counted by the index,
/// and with `first_record` only the first member is decompressed, to check the projection
/// against the first record.
fn inspect_members(
    object: Arc<Object>,
    index: MemberIndex,
    projection: &Projection,
    max_record: u64,
    first_record: bool,
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
    if rows > 0 && first_record {
        let mut reader = MemberReader::open(object, index.clone(), longest);
        let mut chunk = Chunk::padded(projection, 1);
        reader.project_next(projection, &mut chunk, 0)?;
    }
    Ok(ShardMeta {
        dropped: crate::formats::Dropped::default(),
        rows,
        pin: Pin::default(),
        // A reader holds one member, compressed and decompressed, and where each of its
        // records ends (four bytes per record, and a record takes at least three: `{}\n`).
        scratch_bytes: largest + largest / 3 * 4,
        longest_record: longest,
        index,
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
    /// Where each record's line of member `loaded` ends in `text`; a record starts where the
    /// one before it ends (blank lines between them are whitespace before the object).
    ends: Vec<u32>,
    loaded: Option<usize>,
    next_row: u64,
    /// Longest line, newline included: a longer one means the shard changed since it was
    /// inspected.
    max_line: u64,
}

impl MemberReader {
    /// A reader of the shard `object` whose member index is `index`; lines longer than
    /// `max_line` (the index's longest) are refused. Nothing is read until the first row.
    pub fn open(object: Arc<Object>, index: Arc<MemberIndex>, max_line: u64) -> Self {
        MemberReader {
            path: object.uri().to_owned(),
            object,
            index,
            inflater: Decompress::new(false),
            text: Vec::new(),
            ends: Vec::new(),
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
        // Checked per member as the stream cursor checks per buffer refill, so `close()` stops a
        // long read promptly.
        self.object.cancel().check(self.object.uri())?;
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
        self.ends.clear();
        let want = rows.end - rows.start;
        let (mut start, mut longest, mut count) = (0, 0, 0u64);
        let (text, ends) = (&self.text, &mut self.ends);
        for_each_newline(text, |at| {
            if !is_blank(&text[start..=at]) {
                longest = longest.max(at + 1 - start);
                count += 1;
                // A member holding more records than its index gives fails below; none of the
                // extra ones is kept meanwhile. Members are under 4 GiB (`gz_members`).
                if count <= want {
                    ends.push((at + 1) as u32);
                }
            }
            start = at + 1;
        });
        if longest as u64 > self.max_line {
            return Err(self.error(
                rows.start,
                format!(
                    "member {m} holds a line longer than the {} bytes the member index gives as \
                     the longest",
                    self.max_line
                ),
            ));
        }
        if count != want {
            return Err(self.error(
                rows.start,
                format!("member {m} holds {count} records where the member index gives {want}"),
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
        let k = (row - self.index.rows_of(m).start) as usize;
        let start = if k == 0 { 0 } else { self.ends[k - 1] as usize };
        let end = self.ends[k] as usize;
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

#[cfg(test)]
mod tests {
    use std::io::Write as _;
    use std::ops::Range;

    use super::*;
    use crate::columns::ColumnBuf;
    use crate::config::FieldSpec;
    use crate::dtype::DType;
    use crate::formats::{inspect, open, Checks, ReadFailure};
    use crate::storage::Storage;

    fn projection() -> Projection {
        let field = FieldSpec {
            overflow: crate::config::Overflow::Truncate,
            pad_side: crate::config::PadSide::Right,
            name: "v".to_owned(),
            source: "v".into(),
            dtype: DType::I64,
            shape: vec![],
            pad: serde_json::Value::from(-1),
        };
        Projection::new(&[field]).unwrap()
    }

    fn records(n: i64) -> Vec<Record> {
        (0..n)
            .map(|i| vec![("v".to_owned(), super::super::Value::Int(i))])
            .collect()
    }

    /// A shard file in a directory of its own (tests run in parallel).
    fn shard(name: &str, bytes: &[u8]) -> String {
        let dir = std::env::temp_dir().join(format!("o41-jsonl-{}-{name}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("s.jsonl.gz");
        std::fs::write(&path, bytes).unwrap();
        path.to_string_lossy().into_owned()
    }

    fn seekable(n: i64) -> Vec<u8> {
        let mut out = Vec::new();
        write(&mut out, Encoding::JsonlGz, &records(n), "s").unwrap();
        out
    }

    fn read(uri: &str, range: Range<u64>) -> std::result::Result<Vec<i64>, ReadFailure> {
        let storage = Storage::local();
        let p = projection();
        // As open inspects: member 0 is decoded for its first record.
        let checks = Checks {
            promise: None,
            first_record: true,
            seen: None,
            cache: None,
        };
        let meta = inspect(&storage, uri, Encoding::JsonlGz, &p, 1 << 20, checks)?;
        let mut reader = open(&storage, uri, &meta, None)?;
        let mut chunk = Chunk::padded(&p, (range.end - range.start) as usize);
        reader.read_ranges(std::slice::from_ref(&range), &p, &mut chunk, None)?;
        let ColumnBuf::I64(values) = &chunk.columns[0] else {
            unreachable!("an i64 column")
        };
        Ok(values.to_vec())
    }

    #[test]
    fn the_writer_emits_the_index_and_inspect_uses_it() {
        let uri = shard("index", &seekable(3000));
        let object = Arc::new(Storage::local().open(&uri).unwrap());
        let index = gz_members::read_index(&object).unwrap().expect("an index");
        assert_eq!((index.members(), index.rows()), (3, 3000));
        let meta = inspect(
            &Storage::local(),
            &uri,
            Encoding::JsonlGz,
            &projection(),
            1 << 20,
            Checks::default(),
        )
        .unwrap();
        assert_eq!(meta.rows, 3000);
        assert!(meta.index_as::<MemberIndex>().is_some());
        assert_eq!(meta.block_of(2047), 1);
        assert_eq!(
            read(&uri, 1020..1030).unwrap(),
            (1020..1030).collect::<Vec<_>>()
        );
    }

    #[test]
    fn a_read_decompresses_only_the_members_holding_its_rows() {
        let mut bytes = seekable(3000);
        let uri = shard("corrupt", &bytes);
        let object = Arc::new(Storage::local().open(&uri).unwrap());
        let index = gz_members::read_index(&object).unwrap().unwrap();
        // Break the deflate data of members 0 and 2; member 1 (rows 1024..2048) stays whole.
        for m in [0, 2] {
            let at = index.bytes_of(m).start as usize + 20;
            bytes[at] ^= 0xff;
            bytes[at + 1] ^= 0xff;
        }
        // Inspection checks member 0, so the intact file is inspected and the corrupted bytes
        // then written in its place (re-pinned: a reader refuses a file changed since open).
        let broken = shard("corrupt-broken", &bytes);
        let storage = Storage::local();
        let p = projection();
        let meta = inspect(
            &storage,
            &uri,
            Encoding::JsonlGz,
            &p,
            1 << 20,
            Checks::default(),
        )
        .unwrap();
        std::fs::write(&uri, &bytes).unwrap();
        let meta = ShardMeta {
            dropped: crate::formats::Dropped::default(),
            pin: Storage::local().open(&uri).unwrap().pin(),
            ..meta
        };
        let mut reader = open(&storage, &uri, &meta, None).unwrap();
        let mut chunk = Chunk::padded(&p, 24);
        reader
            .read_ranges(&[1024..1036, 2036..2048], &p, &mut chunk, None)
            .unwrap();
        let ColumnBuf::I64(values) = &chunk.columns[0] else {
            unreachable!()
        };
        let want: Vec<i64> = (1024..1036).chain(2036..2048).collect();
        assert_eq!(values.to_vec(), want);
        // Reading into a corrupted member fails closed, naming the shard and its first row.
        let mut chunk = Chunk::padded(&p, 2);
        let failure = reader
            .read_ranges(std::slice::from_ref(&(2047..2049)), &p, &mut chunk, None)
            .unwrap_err();
        assert_eq!(failure.rows_done, 1);
        let message = failure.error.to_string();
        assert!(
            message.contains("s.jsonl.gz") && message.contains("row 2048"),
            "{message}"
        );
        // A fresh open of the broken file fails at inspection (member 0 is checked there).
        assert!(read(&broken, 1024..1025).is_err());
    }

    #[test]
    fn a_member_whose_line_count_disagrees_with_the_index_fails_closed() {
        let text = b"{\"v\":0}\n{\"v\":1}\n{\"v\":2}\n";
        let ends = [8, 16, 24];
        let mut good = Vec::new();
        gz_members::write(&mut good, text, &ends, "s").unwrap();
        // The same index over a member holding one line fewer (the last line made blank).
        let mut fewer = Vec::new();
        gz_members::write(&mut fewer, b"{\"v\":0}\n{\"v\":1}\n       \n", &ends, "s").unwrap();
        let uri = shard("count", &fewer);
        let err = read(&uri, 0..1).unwrap_err().error.to_string();
        assert!(
            err.contains("s.jsonl.gz") && err.contains("member 0 holds 2 records"),
            "{err}"
        );
        let uri = shard("count-good", &good);
        assert_eq!(read(&uri, 2..3).unwrap(), vec![2]);
    }

    #[test]
    fn gzip_files_without_the_index_are_read_forward() {
        let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
        for i in 0..300 {
            writeln!(gz, "{{\"v\":{i}}}").unwrap();
            if i % 7 == 0 {
                writeln!(gz, "  ").unwrap();
            }
        }
        let uri = shard("plain", &gz.finish().unwrap());
        let meta = inspect(
            &Storage::local(),
            &uri,
            Encoding::JsonlGz,
            &projection(),
            1 << 20,
            Checks::default(),
        )
        .unwrap();
        assert!(meta
            .index_as::<LineIndex>()
            .is_some_and(|index| matches!(index.lines, Lines::Forward)));
        assert_eq!(meta.rows, 300);
        assert_eq!(read(&uri, 250..253).unwrap(), vec![250, 251, 252]);
    }

    #[test]
    fn newline_search_finds_every_newline() {
        let mut text = vec![b'x'; 200];
        for at in [0, 31, 32, 33, 95, 150, 199] {
            text[at] = b'\n';
        }
        let mut found = Vec::new();
        for_each_newline(&text, |at| found.push(at));
        assert_eq!(found, vec![0, 31, 32, 33, 95, 150, 199]);
        assert_eq!(first_newline(&text[1..]), Some(30));
        assert_eq!(first_newline(&text[34..95]), None);
        assert_eq!(first_newline(&text[96..]), Some(54));
    }
}
