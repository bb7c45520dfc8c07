//! Random access into the gzip streams other writers make (`gzip`, Python's `gzip`, pigz): the
//! JSON Lines shards that carry no member index of ours. One pass over such a stream counts its
//! lines and notes, every few MiB of output, a deflate block boundary together with the 32 KiB
//! of output before it (all that a back-reference can reach), as zlib's `zran.c` and
//! `indexed_gzip` do. The notes (access points) are kept in the inspection cache, windows
//! included; a reader then starts at the point before its first row, primed with that history,
//! instead of inflating the stream from its start.
//!
//! Points are kept only at boundaries that fall on a byte: a block that starts inside a byte
//! could be read only by shifting every later byte, which breaks the byte alignment of stored
//! blocks and trailers. zlib reports where a block ends only as the bytes it took, some of which
//! it may still hold unread, so a boundary's byte is found by decoding from each byte it can be
//! at and keeping the one that reproduces the output the full pass made there; a boundary inside
//! a byte reproduces it from none, and the next boundary is tried.

use std::io::{self, Read};
use std::os::unix::fs::FileExt;
use std::path::PathBuf;
use std::sync::Arc;

use zlib_rs::{Inflate, InflateFlush, Status};

use super::gz_members::{self, BadHeader};
use super::lines::{for_each_newline, is_blank, too_long};
use crate::encoding::Encoding;
use crate::error::{Error, Result};
use crate::formats::page_cache::{CachedReader, PageCache};
use crate::inspect_cache::CompanionKind;
use crate::storage::{self, Object};

/// The access index's file in the inspection cache (`<digest>.gzindex`): the points and their
/// windows, from which a reader starts near any row without inflating the stream from its
/// start. Its magic carries the layout's version.
pub const ACCESS_FILE: CompanionKind = CompanionKind {
    suffix: "gzindex",
    magic: b"o41gzx01",
};

/// The history a deflate back-reference reaches.
const WINDOW: usize = 32 << 10;
/// Output between two access points at first; doubled whenever the points would pass
/// [`MAX_POINTS`], so a huge stream keeps a bounded index.
const SPACING: u64 = 2 << 20;
/// Access points one stream keeps at most.
const MAX_POINTS: usize = 256;
/// Output compared to find a boundary's byte.
const CHECK_BYTES: usize = 1 << 10;
/// Compressed bytes a trial decode of a boundary is given.
const TRIAL_INPUT: usize = 8 << 10;
/// Compressed bytes read at a time, and output inflated at most per call.
const READ_BYTES: usize = 1 << 20;
/// A gzip header longer than this (its file name or comment) is refused.
const MAX_HEADER: usize = 1 << 20;
/// Bytes per access point in a cached index, its window aside.
const POINT_BYTES: usize = 40;

/// Where a reader can start: a deflate block boundary inside a member.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Point {
    /// The file offset of the byte the block after the boundary starts.
    offset: u64,
    /// Output bytes from the boundary to the first line starting at or after it.
    skip: u64,
    /// The record number of that line.
    row: u64,
    /// Where the trailer of the member holding the boundary starts (a file offset).
    member_end: u64,
}

/// Where a point's history (the output before it) lies in the cached file, and its CRC-32.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Window {
    at: u64,
    len: u32,
    crc: u32,
}

impl Point {
    /// Record number of the first line a reader starting here meets.
    pub fn row(&self) -> u64 {
        self.row
    }

    /// Output bytes before that line.
    pub fn skip(&self) -> u64 {
        self.skip
    }
}

/// A gzip stream's lines and access points; the windows stay in the cache file.
#[derive(Debug)]
pub struct AccessIndex {
    rows: u64,
    longest_line: u64,
    points: Vec<Point>,
    /// Point `k`'s history, in `file`.
    windows: Vec<Window>,
    file: PathBuf,
}

impl AccessIndex {
    /// Records (non-blank lines) in the stream.
    pub fn rows(&self) -> u64 {
        self.rows
    }

    /// The longest line, newline included.
    pub fn longest_line(&self) -> u64 {
        self.longest_line
    }

    /// The span of `row`: how many points start at or before it. Rows of one span are read
    /// from one point, so read jobs are cut where a span ends.
    pub fn span_of(&self, row: u64) -> u64 {
        self.points.partition_point(|p| p.row <= row) as u64
    }

    /// The last point at or before `row`, and its number.
    pub fn point_before(&self, row: u64) -> Option<(usize, &Point)> {
        let k = (self.span_of(row) as usize).checked_sub(1)?;
        Some((k, &self.points[k]))
    }

    /// The history before point `k`, read from the cache file and checked against its CRC-32;
    /// None when the file no longer holds it (a reader then starts from the stream's start).
    fn window(&self, k: usize) -> Option<Vec<u8>> {
        let Window { at, len, crc } = self.windows[k];
        let file = std::fs::File::open(&self.file).ok()?;
        let mut window = vec![0; len as usize];
        file.read_exact_at(&mut window, at).ok()?;
        (zlib_rs::crc32::crc32(0, &window) == crc).then_some(window)
    }

    /// The cached index `payload` holds (its layout is [`encode`]'s), checked whole; `at` is
    /// where the payload starts in `file`. None for anything but a well-formed index.
    pub fn decode(payload: &[u8], file: PathBuf, at: u64) -> Option<AccessIndex> {
        let mut rest = payload;
        let mut take = |n: usize| -> Option<&[u8]> {
            let (head, tail) = rest.split_at_checked(n)?;
            rest = tail;
            Some(head)
        };
        let u64_of = |b: &[u8]| u64::from_le_bytes(b.try_into().expect("eight bytes"));
        let rows = u64_of(take(8)?);
        let longest_line = u64_of(take(8)?);
        let count = u32::from_le_bytes(take(4)?.try_into().ok()?) as usize;
        let table = take(count.checked_mul(POINT_BYTES)?)?;
        let crc = u32::from_le_bytes(take(4)?.try_into().ok()?);
        // The counts and points are checked whole; each window is checked when it is read.
        let described = &payload[..payload.len() - rest.len() - 4];
        if zlib_rs::crc32::crc32(0, described) != crc {
            return None;
        }
        let mut window_at = at + payload.len() as u64 - rest.len() as u64;
        let mut points: Vec<Point> = Vec::with_capacity(count);
        let mut windows: Vec<Window> = Vec::with_capacity(count);
        for entry in table.chunks_exact(POINT_BYTES) {
            let word = |k: usize| u64::from_le_bytes(entry[8 * k..8 * k + 8].try_into().unwrap());
            let point = Point {
                offset: word(0),
                skip: word(1),
                row: word(2),
                member_end: word(3),
            };
            let window = Window {
                at: window_at,
                len: u32::from_le_bytes(entry[32..36].try_into().ok()?),
                crc: u32::from_le_bytes(entry[36..40].try_into().ok()?),
            };
            let ordered = points
                .last()
                .is_none_or(|last| last.offset < point.offset && last.row < point.row);
            if !ordered
                || point.row >= rows
                || point.skip > longest_line
                || window.len as usize > WINDOW
                || point.member_end <= point.offset
            {
                return None;
            }
            window_at += u64::from(window.len);
            points.push(point);
            windows.push(window);
        }
        (window_at == at + payload.len() as u64).then_some(AccessIndex {
            rows,
            longest_line,
            points,
            windows,
            file,
        })
    }
}

/// What one pass over a gzip stream found.
#[derive(Debug)]
pub struct Scan {
    /// Records (non-blank lines).
    pub rows: u64,
    /// The longest line, newline included.
    pub longest_line: u64,
    /// The first record's line, to check the projection against.
    pub first_line: Option<Vec<u8>>,
    /// Access points and their windows (empty when none were asked for).
    points: Vec<(Point, Vec<u8>)>,
}

impl Scan {
    /// The index a cache file keeps after its header (`inspect_cache`'s): the counts and the points,
    /// their CRC-32, then the windows (each point holds its window's CRC-32).
    pub fn encode(&self) -> Vec<u8> {
        let windows: usize = self.points.iter().map(|(_, w)| w.len()).sum();
        let mut out = Vec::with_capacity(24 + self.points.len() * POINT_BYTES + windows);
        out.extend_from_slice(&self.rows.to_le_bytes());
        out.extend_from_slice(&self.longest_line.to_le_bytes());
        out.extend_from_slice(&(self.points.len() as u32).to_le_bytes());
        for (p, window) in &self.points {
            for word in [p.offset, p.skip, p.row, p.member_end] {
                out.extend_from_slice(&word.to_le_bytes());
            }
            out.extend_from_slice(&(window.len() as u32).to_le_bytes());
            out.extend_from_slice(&zlib_rs::crc32::crc32(0, window).to_le_bytes());
        }
        let crc = zlib_rs::crc32::crc32(0, &out);
        out.extend_from_slice(&crc.to_le_bytes());
        for (_, window) in &self.points {
            out.extend_from_slice(window);
        }
        out
    }

    /// Whether the pass found any access point.
    pub fn has_points(&self) -> bool {
        !self.points.is_empty()
    }

    /// Counts one line, its newline included (if it has one).
    fn count(&mut self, line: &[u8]) {
        self.longest_line = self.longest_line.max(line.len() as u64);
        if !is_blank(line) {
            if self.first_line.is_none() {
                self.first_line = Some(line.to_vec());
            }
            self.rows += 1;
        }
    }
}

fn bad(path: &str, row: Option<u64>, message: String) -> Error {
    Error::Format {
        path: path.to_owned(),
        encoding: Encoding::JsonlGz.name(),
        row,
        message,
    }
}

fn bad_io(message: String) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, message)
}

/// Compressed bytes from an offset, with the bytes before the next one kept as long as asked.
struct Input {
    reader: Box<dyn Read + Send>,
    buf: Vec<u8>,
    /// Index in `buf` of the next byte to deliver.
    pos: usize,
    /// The file offset of `buf[0]`.
    start: u64,
    eof: bool,
}

impl Input {
    fn open(object: &Object, offset: u64) -> Result<Self> {
        Ok(Self::from_reader(object.reader(offset)?, offset))
    }

    /// The bytes `reader` gives, which start at file offset `offset`.
    fn from_reader(reader: Box<dyn Read + Send>, offset: u64) -> Self {
        Input {
            reader,
            buf: Vec::new(),
            pos: 0,
            start: offset,
            eof: false,
        }
    }

    fn avail(&self) -> &[u8] {
        &self.buf[self.pos..]
    }

    fn offset(&self) -> u64 {
        self.start + self.pos as u64
    }

    /// Reads until `want` bytes wait past `pos` or the object ends; bytes before the file
    /// offset `keep` may be dropped first.
    fn fill(&mut self, want: usize, keep: u64) -> io::Result<()> {
        if self.buf.len() - self.pos >= want || self.eof {
            return Ok(());
        }
        let drop = (keep.saturating_sub(self.start) as usize).min(self.pos);
        self.buf.drain(..drop);
        self.pos -= drop;
        self.start += drop as u64;
        while self.buf.len() - self.pos < want && !self.eof {
            let old = self.buf.len();
            self.buf.resize(old + READ_BYTES, 0);
            let n = loop {
                match self.reader.read(&mut self.buf[old..]) {
                    Ok(n) => break n,
                    Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                    Err(e) => {
                        self.buf.truncate(old);
                        return Err(e);
                    }
                }
            };
            self.buf.truncate(old + n);
            self.eof = n == 0;
        }
        Ok(())
    }

    /// Reads one gzip member header. False where the input ends instead: at the start of an
    /// empty file, or after the last member (where gzip allows zero bytes of padding).
    fn header(&mut self, first: bool) -> io::Result<bool> {
        let at = self.offset();
        let mut want = 10;
        loop {
            self.fill(want, at)?;
            let head = self.avail();
            if head.is_empty() {
                return Ok(false);
            }
            if !first && head[0] == 0 {
                return self.zero_padding().map(|()| false);
            }
            match gz_members::header_len(head) {
                Ok(Some(len)) => {
                    self.pos += len;
                    return Ok(true);
                }
                Err(BadHeader::NotGzip) => {
                    return Err(bad_io(format!(
                        "byte {at} does not start a gzip member (a gzip stream is one or more \
                         members)"
                    )))
                }
                Err(BadHeader::ReservedFlags) => {
                    return Err(bad_io(format!(
                        "the gzip member at byte {at} sets reserved header flags"
                    )))
                }
                Ok(None) if self.eof || head.len() < want => {
                    return Err(bad_io(format!(
                        "the gzip member header at byte {at} is cut short"
                    )))
                }
                Ok(None) if head.len() > MAX_HEADER => {
                    return Err(bad_io(format!(
                        "the gzip member at byte {at} has a header longer than {MAX_HEADER} bytes"
                    )))
                }
                // A name or comment longer than what is buffered: read on.
                Ok(None) => want = head.len() + 4096,
            }
        }
    }

    /// Checks that nothing but zero bytes is left.
    fn zero_padding(&mut self) -> io::Result<()> {
        loop {
            if let Some(i) = self.avail().iter().position(|&b| b != 0) {
                return Err(bad_io(format!(
                    "byte {} after the last gzip member is neither a member nor padding",
                    self.offset() + i as u64
                )));
            }
            self.pos = self.buf.len();
            if self.eof {
                return Ok(());
            }
            let keep = self.offset();
            self.fill(1, keep)?;
        }
    }

    /// Reads the trailer of the member whose deflate data just ended, and checks it against
    /// the CRC-32 and size of its output where they are known (`check`, the member read from
    /// its start); returns where the trailer starts.
    fn trailer(&mut self, check: Option<(u32, u64)>) -> io::Result<u64> {
        let at = self.offset();
        self.fill(8, at)?;
        let t = self.avail();
        if t.len() < 8 {
            return Err(bad_io(format!(
                "the gzip stream is cut short in the trailer at byte {at}"
            )));
        }
        let word = |k: usize| u32::from_le_bytes([t[k], t[k + 1], t[k + 2], t[k + 3]]);
        let (crc, size) = (word(0), word(4));
        self.pos += 8;
        match check {
            Some((want_crc, want_size))
                if crc != want_crc || u64::from(size) != want_size & 0xffff_ffff =>
            {
                Err(bad_io(format!(
                    "the gzip member ending at byte {at} does not match its trailer's CRC-32 \
                     or size"
                )))
            }
            _ => Ok(at),
        }
    }
}

fn inflate_error(e: zlib_rs::InflateError) -> io::Error {
    bad_io(format!("corrupt deflate data: {}", e.as_str()))
}

/// An access point found at a boundary but not yet settled: its byte is found once the output
/// after it is known, its row once the line it is in ends.
struct Pending {
    /// The input offset where the pass stopped at the boundary.
    byte: u64,
    /// The first byte of the member's deflate data: no boundary lies before it.
    body: u64,
    /// The output offset of the boundary.
    out: u64,
    window: Vec<u8>,
    /// The byte the next block starts, once found.
    offset: Option<u64>,
    /// The first line starting at or after the boundary: its output offset and record number.
    line: Option<(u64, u64)>,
}

/// One pass over a stream: lines counted, access points noted.
struct Scanner<'a> {
    path: &'a str,
    max_line: u64,
    input: Input,
    inflate: Inflate,
    trial: Option<Inflate>,
    /// Output not yet dropped: the current line, the last window, a pending point's output.
    text: Vec<u8>,
    /// Bytes of `text` holding output.
    end: usize,
    /// The output offset of `text[0]`.
    text_at: u64,
    /// Where in `text` the current line starts.
    line_start: usize,
    /// What the pass has found so far.
    found: Scan,
    /// Points kept at most: [`MAX_POINTS`], fewer where their windows would take more than the
    /// `max_line` bytes an inspection may hold for a line; none where none were asked for.
    max_points: usize,
    spacing: u64,
    last_point: u64,
    pending: Option<Pending>,
}

/// Inflates the gzip stream `object` once: counts its records and finds its longest line (a
/// line longer than `max_line` is an error), and with `points` notes access points, whose
/// windows it holds until the end: at most `max_line` bytes of them.
pub fn scan(object: &Object, max_line: u64, points: bool) -> Result<Scan> {
    let path = object.uri();
    let mut scanner = Scanner {
        path,
        max_line,
        input: Input::open(object, 0)?,
        inflate: Inflate::new(false, 15),
        trial: None,
        text: vec![0; 2 * READ_BYTES],
        end: 0,
        text_at: 0,
        line_start: 0,
        found: Scan {
            rows: 0,
            longest_line: 0,
            first_line: None,
            points: Vec::new(),
        },
        max_points: if points {
            usize::try_from(max_line / WINDOW as u64)
                .unwrap_or(MAX_POINTS)
                .clamp(1, MAX_POINTS)
        } else {
            0
        },
        spacing: SPACING,
        last_point: 0,
        pending: None,
    };
    let mut first = true;
    loop {
        let more = scanner.input.header(first);
        if !scanner.io(more)? {
            break;
        }
        first = false;
        object.cancel().check(path)?;
        scanner.member()?;
    }
    // A last line without a newline.
    let last = &scanner.text[scanner.line_start..scanner.end];
    if !last.is_empty() {
        scanner.found.count(last);
    }
    Ok(scanner.found)
}

impl Scanner<'_> {
    fn io<T>(&self, r: io::Result<T>) -> Result<T> {
        r.map_err(|e| storage::from_io(e, |e| bad(self.path, Some(self.found.rows), e.to_string())))
    }

    fn out(&self) -> u64 {
        self.text_at + self.end as u64
    }

    /// Inflates one member, its header read, and checks its trailer.
    fn member(&mut self) -> Result<()> {
        self.inflate.reset(false);
        let body = self.input.offset();
        let (mut crc, mut size) = (0u32, 0u64);
        loop {
            let keep = self
                .pending
                .as_ref()
                .filter(|p| p.offset.is_none())
                .map_or(self.input.offset().saturating_sub(8), |p| {
                    p.byte.saturating_sub(8)
                });
            let filled = self.input.fill(64 << 10, keep);
            self.io(filled)?;
            self.make_room();
            let (in0, out0) = (self.inflate.total_in(), self.inflate.total_out());
            let room = (self.text.len() - self.end).min(READ_BYTES);
            let status = self.inflate.decompress(
                self.input.avail(),
                &mut self.text[self.end..self.end + room],
                InflateFlush::Block,
            );
            let status = self.io(status.map_err(inflate_error))?;
            let consumed = (self.inflate.total_in() - in0) as usize;
            let produced = (self.inflate.total_out() - out0) as usize;
            self.input.pos += consumed;
            crc = zlib_rs::crc32::crc32(crc, &self.text[self.end..self.end + produced]);
            size += produced as u64;
            self.end += produced;
            self.lines(produced)?;
            self.settle();
            if status == Status::StreamEnd {
                break;
            }
            if consumed == 0 && produced == 0 && self.input.eof {
                return Err(bad(
                    self.path,
                    Some(self.found.rows),
                    "the gzip stream is cut short".to_owned(),
                ));
            }
            let boundary =
                status == Status::Ok && !self.input.avail().is_empty() && produced < room;
            if boundary && size > 0 {
                self.note(body);
            }
        }
        self.pending = None;
        let trailer = self.input.trailer(Some((crc, size)));
        let member_end = self.io(trailer)?;
        // This member's points (none before it is left unset).
        for (point, _) in self.found.points.iter_mut().rev() {
            if point.member_end != 0 {
                break;
            }
            point.member_end = member_end;
        }
        Ok(())
    }

    /// Makes room for a call's output, keeping the current line, the last window and a
    /// pending point's output.
    fn make_room(&mut self) {
        if self.text.len() - self.end >= READ_BYTES {
            return;
        }
        let mut keep = self.line_start.min(self.end.saturating_sub(WINDOW));
        if let Some(p) = &self.pending {
            keep = keep.min(p.out.saturating_sub(self.text_at) as usize);
        }
        self.text.copy_within(keep..self.end, 0);
        self.end -= keep;
        self.line_start -= keep;
        self.text_at += keep as u64;
        if self.text.len() - self.end < READ_BYTES {
            self.text.resize(self.end + 2 * READ_BYTES, 0);
        }
    }

    /// Counts the lines the last `produced` bytes end.
    fn lines(&mut self, produced: usize) -> Result<()> {
        let from = self.end - produced;
        let (text, text_at, max_line) = (&self.text[..self.end], self.text_at, self.max_line);
        let (found, line_start, pending) =
            (&mut self.found, &mut self.line_start, &mut self.pending);
        let mut too_long_at = None;
        for_each_newline(&text[from..], |i| {
            let nl = from + i;
            let line = &text[*line_start..=nl];
            if line.len() as u64 > max_line {
                too_long_at.get_or_insert(found.rows);
            }
            found.count(line);
            *line_start = nl + 1;
            if let Some(p) = pending.as_mut().filter(|p| p.line.is_none()) {
                if text_at + nl as u64 + 1 >= p.out {
                    p.line = Some((text_at + nl as u64 + 1, found.rows));
                }
            }
        });
        let open = (self.end - self.line_start) as u64;
        match too_long_at {
            Some(row) => Err(too_long(self.path, Encoding::JsonlGz, row, max_line)),
            None if open > max_line => Err(too_long(
                self.path,
                Encoding::JsonlGz,
                self.found.rows,
                max_line,
            )),
            None => Ok(()),
        }
    }

    /// Notes a boundary the pass stopped at, where the last point is far enough behind.
    fn note(&mut self, body: u64) {
        let out = self.out();
        if self.max_points == 0 || self.pending.is_some() || out < self.last_point + self.spacing {
            return;
        }
        let window = self.text[self.end.saturating_sub(WINDOW)..self.end].to_vec();
        let at_line_start = self.line_start == self.end;
        self.pending = Some(Pending {
            byte: self.input.offset(),
            body,
            out,
            window,
            offset: None,
            line: at_line_start.then_some((out, self.found.rows)),
        });
    }

    /// Finds a pending point's byte once the output after it is known, and keeps the point
    /// once its line is known too.
    fn settle(&mut self) {
        let Some(p) = self.pending.as_mut() else {
            return;
        };
        if p.offset.is_none() {
            let after = self.text_at + self.end as u64 - p.out;
            if after < CHECK_BYTES as u64 {
                return;
            }
            let from = (p.out - self.text_at) as usize;
            let expected = &self.text[from..from + CHECK_BYTES];
            let trial = self.trial.get_or_insert_with(|| Inflate::new(false, 15));
            p.offset = locate(trial, &self.input, p, expected);
            if p.offset.is_none() {
                self.pending = None;
                return;
            }
        }
        let Some((line_out, row)) = p.line else {
            return;
        };
        let p = self.pending.take().expect("pending");
        self.last_point = p.out;
        let point = Point {
            offset: p.offset.expect("located"),
            skip: line_out - p.out,
            row,
            member_end: 0,
        };
        // Points before the same line: the later one inflates less to reach it.
        let points = &mut self.found.points;
        if points.last().is_some_and(|(last, _)| last.row == row) {
            points.pop();
        }
        points.push((point, p.window));
        if points.len() > self.max_points {
            let mut k = 0;
            points.retain(|_| {
                k += 1;
                k % 2 == 1
            });
            self.spacing *= 2;
        }
    }
}

/// The byte where the block after pending point `p` starts, if it starts a byte: the one of
/// the bytes the stopped inflater may have taken (its bit buffer holds under 64 bits) whose
/// decode, primed with the window, gives `expected`.
fn locate(trial: &mut Inflate, input: &Input, p: &Pending, expected: &[u8]) -> Option<u64> {
    let mut out = vec![0; expected.len()];
    for held in 0..8u64 {
        let offset = p.byte.checked_sub(held)?;
        if offset < p.body || offset < input.start {
            return None;
        }
        let from = (offset - input.start) as usize;
        let bytes = &input.buf[from..input.buf.len().min(from + TRIAL_INPUT)];
        trial.reset(false);
        trial.set_dictionary(&p.window).ok()?;
        let decoded = trial.decompress(bytes, &mut out, InflateFlush::NoFlush);
        if decoded.is_ok() && trial.total_out() == out.len() as u64 && out == expected {
            return Some(offset);
        }
    }
    None
}

/// Where a [`GzStream`] is.
#[derive(Debug, Clone, Copy)]
enum Part {
    /// Before a member header (or at the end).
    Header,
    /// In a member's deflate data, with the CRC-32 and size so far when they are checked (the
    /// member was read from its start).
    Body(Option<(u32, u64)>),
}

/// A gzip stream's output from its start or from an access point. From the start every
/// member's CRC-32 and size are checked; from a point, those of the members after it.
pub struct GzStream {
    input: Input,
    inflate: Inflate,
    part: Part,
    /// Where the member a point started in ends (its trailer), as the index gives it.
    member_end: Option<u64>,
    first: bool,
    done: bool,
}

impl GzStream {
    /// The stream from its start (read through `pages` as [`GzStream::at`] reads).
    pub fn from_start(object: &Arc<Object>, pages: Option<&Arc<PageCache>>) -> Result<Self> {
        Ok(GzStream {
            input: Self::input(object, 0, pages)?,
            inflate: Inflate::new(false, 15),
            part: Part::Header,
            member_end: None,
            first: true,
            done: false,
        })
    }

    /// The stream from point `k` of `index`, or from its start when the point's window is gone
    /// from the cache (with false: the caller then reads from row 0). With `pages`, the
    /// compressed bytes are read through it in blocks ([`CachedReader`]), so that jobs starting
    /// at other points read each block from storage once.
    pub fn at(
        object: &Arc<Object>,
        index: &AccessIndex,
        k: usize,
        pages: Option<&Arc<PageCache>>,
    ) -> Result<(Self, bool)> {
        let point = &index.points[k];
        let Some(window) = index.window(k) else {
            return Ok((Self::from_start(object, pages)?, false));
        };
        let input = Self::input(object, point.offset, pages)?;
        let mut inflate = Inflate::new(false, 15);
        inflate
            .set_dictionary(&window)
            .map_err(|e| bad(object.uri(), Some(point.row), e.as_str().to_owned()))?;
        let stream = GzStream {
            input,
            inflate,
            part: Part::Body(None),
            member_end: Some(point.member_end),
            first: false,
            done: false,
        };
        Ok((stream, true))
    }

    /// The compressed bytes from `offset`: through `pages` where its blocks fit, else read on.
    fn input(object: &Arc<Object>, offset: u64, pages: Option<&Arc<PageCache>>) -> Result<Input> {
        match pages.and_then(|cache| CachedReader::new(object.clone(), cache, offset)) {
            Some(reader) => Ok(Input::from_reader(Box::new(reader), offset)),
            None => Input::open(object, offset),
        }
    }

    /// Inflates into `out`: bytes written, 0 only at the end of the stream.
    fn fill(&mut self, out: &mut [u8]) -> io::Result<usize> {
        loop {
            let Part::Body(check) = self.part else {
                if self.done || !self.input.header(self.first)? {
                    self.done = true;
                    return Ok(0);
                }
                self.first = false;
                self.inflate.reset(false);
                self.part = Part::Body(Some((0, 0)));
                continue;
            };
            let keep = self.input.offset();
            self.input.fill(64 << 10, keep)?;
            let (in0, out0) = (self.inflate.total_in(), self.inflate.total_out());
            let status = self
                .inflate
                .decompress(self.input.avail(), out, InflateFlush::NoFlush)
                .map_err(inflate_error)?;
            let consumed = (self.inflate.total_in() - in0) as usize;
            let produced = (self.inflate.total_out() - out0) as usize;
            self.input.pos += consumed;
            let check = check.map(|(crc, size)| {
                (
                    zlib_rs::crc32::crc32(crc, &out[..produced]),
                    size + produced as u64,
                )
            });
            self.part = Part::Body(check);
            if status == Status::StreamEnd {
                self.end_member(check)?;
            } else if consumed == 0 && produced == 0 && self.input.eof {
                return Err(bad_io("the gzip stream is cut short".to_owned()));
            }
            if produced > 0 {
                return Ok(produced);
            }
        }
    }

    fn end_member(&mut self, check: Option<(u32, u64)>) -> io::Result<()> {
        let at = self.input.offset();
        if self.member_end.take().is_some_and(|end| end != at) {
            return Err(bad_io(format!(
                "the gzip member ends at byte {at}, not where the access index says; the file \
                 changed since it was indexed"
            )));
        }
        self.input.trailer(check)?;
        self.part = Part::Header;
        Ok(())
    }
}

impl Read for GzStream {
    fn read(&mut self, out: &mut [u8]) -> io::Result<usize> {
        if out.is_empty() {
            return Ok(0);
        }
        self.fill(out)
    }
}

#[cfg(test)]
mod tests {
    use std::io::Write;
    use std::sync::Arc;

    use super::*;
    use crate::storage::Storage;

    /// JSON lines of varying length, some blank, as a text and the records' lines.
    fn corpus(rows: usize) -> (Vec<u8>, Vec<Vec<u8>>) {
        let (mut text, mut records) = (Vec::new(), Vec::new());
        for i in 0..rows {
            let ids: Vec<String> = (0..(i * 37 % 900))
                .map(|k| ((k * i) % 50_000).to_string())
                .collect();
            let line = format!("{{\"row\":{i},\"ids\":[{}]}}\n", ids.join(","));
            text.extend_from_slice(line.as_bytes());
            records.push(line.into_bytes());
            if i % 97 == 0 {
                text.extend_from_slice(b"  \n");
            }
        }
        (text, records)
    }

    fn gzip(text: &[u8], level: u32) -> Vec<u8> {
        let mut out = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::new(level));
        out.write_all(text).unwrap();
        out.finish().unwrap()
    }

    fn object(dir: &std::path::Path, name: &str, bytes: &[u8]) -> Arc<Object> {
        let path = dir.join(name);
        std::fs::write(&path, bytes).unwrap();
        Arc::new(Storage::local().open(path.to_str().unwrap()).unwrap())
    }

    fn temp(name: &str) -> std::path::PathBuf {
        let dir = std::env::temp_dir().join(format!("o41-gzx-{}-{name}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        dir
    }

    /// The index `scan` found, as a cache file holds it.
    fn cached(dir: &std::path::Path, scan: &Scan) -> AccessIndex {
        let file = dir.join("index.gzindex");
        let mut bytes = b"header".to_vec();
        bytes.extend_from_slice(&scan.encode());
        std::fs::write(&file, &bytes).unwrap();
        AccessIndex::decode(&bytes[6..], file, 6).expect("a well-formed index")
    }

    /// The records a reader starting at `row`'s point delivers, from `row` on (`n` of them).
    fn read_from(object: &Arc<Object>, index: &AccessIndex, row: u64, n: usize) -> Vec<Vec<u8>> {
        let (k, point) = index.point_before(row).expect("a point");
        let (stream, primed) = GzStream::at(object, index, k, None).unwrap();
        assert!(primed, "the window is in the cache file");
        let mut lines = std::io::BufReader::new(stream);
        let mut skipped = vec![0; point.skip() as usize];
        lines.read_exact(&mut skipped).unwrap();
        let mut at = point.row();
        let mut out = Vec::new();
        while out.len() < n {
            let mut line = Vec::new();
            if std::io::BufRead::read_until(&mut lines, b'\n', &mut line).unwrap() == 0 {
                break;
            }
            if line.iter().all(u8::is_ascii_whitespace) {
                continue;
            }
            if at >= row {
                out.push(line);
            }
            at += 1;
        }
        out
    }

    #[test]
    fn every_point_reads_on_exactly_as_the_stream_does_at_every_level() {
        let dir = temp("levels");
        let (text, records) = corpus(6_000);
        for level in [2, 6, 9] {
            let object = object(&dir, &format!("l{level}.jsonl.gz"), &gzip(&text, level));
            let scan = scan(&object, 1 << 20, true).unwrap();
            assert_eq!(scan.rows, records.len() as u64);
            assert_eq!(scan.first_line.as_deref(), Some(&records[0][..]));
            let index = cached(&dir, &scan);
            assert!(
                index.points.len() >= 3,
                "level {level}: {} points",
                index.points.len()
            );
            for point in &index.points {
                let row = point.row();
                let got = read_from(&object, &index, row, 3);
                assert_eq!(
                    got,
                    records[row as usize..row as usize + 3],
                    "level {level} row {row}"
                );
            }
            // A row between points: the reader skips to it.
            let row = index.points[1].row() + 5;
            assert_eq!(
                read_from(&object, &index, row, 2),
                records[row as usize..row as usize + 2]
            );
            // From the start, every record and every member check.
            let mut all = String::new();
            GzStream::from_start(&object, None)
                .unwrap()
                .read_to_string(&mut all)
                .unwrap();
            assert_eq!(all.as_bytes(), &text[..]);
        }
        std::fs::remove_dir_all(dir).unwrap();
    }

    /// One gzip member whose deflate stream holds compressed blocks, then stored blocks, then
    /// compressed blocks again, so reads from points before the stored blocks cross them.
    fn mixed_blocks(text: &[u8]) -> Vec<u8> {
        let third = text.len() / 3;
        let deflate = |part: &[u8], flush: flate2::FlushCompress| {
            let mut c = flate2::Compress::new(flate2::Compression::new(6), false);
            let mut out = Vec::with_capacity(part.len() + 1024);
            c.compress_vec(part, &mut out, flush).unwrap();
            assert_eq!(c.total_in(), part.len() as u64);
            out
        };
        // A sync flush ends on a byte, where stored blocks may follow.
        let mut body = deflate(&text[..third], flate2::FlushCompress::Sync);
        for block in text[third..2 * third].chunks(65_535) {
            let len = block.len() as u16;
            body.push(0);
            body.extend_from_slice(&len.to_le_bytes());
            body.extend_from_slice(&(!len).to_le_bytes());
            body.extend_from_slice(block);
        }
        body.extend(deflate(&text[2 * third..], flate2::FlushCompress::Finish));
        let mut out = vec![0x1f, 0x8b, 8, 0, 0, 0, 0, 0, 0, 0xff];
        out.extend_from_slice(&body);
        out.extend_from_slice(&zlib_rs::crc32::crc32(0, text).to_le_bytes());
        out.extend_from_slice(&(text.len() as u32).to_le_bytes());
        out
    }

    #[test]
    fn reads_from_points_cross_stored_blocks_and_reach_the_trailer() {
        let dir = temp("stored");
        let (text, records) = corpus(9_000);
        let bytes = mixed_blocks(&text);
        assert_eq!(
            std::io::copy(
                &mut flate2::read::GzDecoder::new(&bytes[..]),
                &mut std::io::sink()
            )
            .unwrap(),
            text.len() as u64,
            "a plain gzip reader reads the whole text"
        );
        let object = object(&dir, "mixed.jsonl.gz", &bytes);
        let scan = scan(&object, 1 << 20, true).unwrap();
        assert_eq!(scan.rows, records.len() as u64);
        let index = cached(&dir, &scan);
        assert!(index.points.len() >= 4, "{} points", index.points.len());
        for point in &index.points {
            let row = point.row() as usize;
            assert_eq!(
                read_from(&object, &index, row as u64, usize::MAX),
                records[row..]
            );
        }
        std::fs::remove_dir_all(dir).unwrap();
    }

    #[test]
    fn the_windows_held_stay_within_what_a_line_may_take() {
        let dir = temp("bounded");
        let (text, records) = corpus(9_000);
        let object = object(&dir, "b.jsonl.gz", &gzip(&text, 6));
        let roomy = scan(&object, 1 << 20, true).unwrap();
        let tight = scan(&object, 3 * WINDOW as u64, true).unwrap();
        assert!(roomy.points.len() > 3, "{} points", roomy.points.len());
        assert!(tight.points.len() <= 3, "{} points", tight.points.len());
        assert!(tight.has_points());
        let index = cached(&dir, &tight);
        for point in &index.points {
            let row = point.row() as usize;
            assert_eq!(
                read_from(&object, &index, row as u64, 4),
                records[row..row + 4]
            );
        }
        std::fs::remove_dir_all(dir).unwrap();
    }

    #[test]
    fn a_member_that_does_not_end_where_the_index_says_fails_closed() {
        let dir = temp("moved");
        let (text, _) = corpus(6_000);
        let object = object(&dir, "m.jsonl.gz", &gzip(&text, 6));
        let mut payload = scan(&object, 1 << 20, true).unwrap().encode();
        // Point 0's member_end one byte on, the points' CRC-32 made to match: the index is
        // well-formed, and wrong about the file.
        let count = u32::from_le_bytes(payload[16..20].try_into().unwrap()) as usize;
        let end = 20 + 24;
        let moved = u64::from_le_bytes(payload[end..end + 8].try_into().unwrap()) + 1;
        payload[end..end + 8].copy_from_slice(&moved.to_le_bytes());
        let table_end = 20 + count * POINT_BYTES;
        let crc = zlib_rs::crc32::crc32(0, &payload[..table_end]);
        payload[table_end..table_end + 4].copy_from_slice(&crc.to_le_bytes());
        let file = dir.join("index");
        std::fs::write(&file, &payload).unwrap();
        let index = AccessIndex::decode(&payload, file, 0).expect("well-formed");
        let (mut stream, primed) = GzStream::at(&object, &index, 0, None).unwrap();
        assert!(primed);
        let err = std::io::copy(&mut stream, &mut std::io::sink()).unwrap_err();
        assert!(
            err.to_string().contains("not where the access index says"),
            "{err}"
        );
        std::fs::remove_dir_all(dir).unwrap();
    }

    #[test]
    fn members_padding_and_a_last_line_without_newline_are_read_as_gzip_does() {
        let dir = temp("members");
        let (text, records) = corpus(3_000);
        let cut = text.len() / 3;
        let mut bytes = gzip(&text[..cut], 6);
        bytes.extend(gzip(&text[cut..text.len() - 1], 1));
        bytes.extend([0u8; 5]);
        let object = object(&dir, "m.jsonl.gz", &bytes);
        let scan = scan(&object, 1 << 20, true).unwrap();
        assert_eq!(
            scan.rows,
            records.len() as u64,
            "the last line counts without its newline"
        );
        let index = cached(&dir, &scan);
        let last = index.points.last().expect("points in the second member");
        let got = read_from(&object, &index, last.row(), usize::MAX);
        let mut want = records[last.row() as usize..].to_vec();
        want.last_mut().unwrap().pop();
        assert_eq!(got, want);
        std::fs::remove_dir_all(dir).unwrap();
    }

    #[test]
    fn damaged_streams_fail_closed_naming_what_is_wrong() {
        let dir = temp("damaged");
        let (text, _) = corpus(500);
        let good = gzip(&text, 6);
        let message = |bytes: &[u8], name: &str| {
            let object = object(&dir, name, bytes);
            scan(&object, 1 << 20, true).unwrap_err().to_string()
        };
        let mut garbage = good.clone();
        garbage.extend_from_slice(b"junk");
        assert!(message(&garbage, "g.gz").contains("does not start a gzip member"));
        let mut padded = good.clone();
        padded.extend_from_slice(&[0, 0, 7]);
        assert!(message(&padded, "p.gz").contains("neither a member nor padding"));
        assert!(message(&good[..good.len() - 3], "t.gz").contains("cut short"));
        assert!(message(&good[..good.len() / 2], "h.gz").contains("cut short"));
        let mut crc = good.clone();
        let at = crc.len() - 8;
        crc[at] ^= 1;
        assert!(message(&crc, "c.gz").contains("CRC-32"));
        assert!(message(b"not gzip at all", "n.gz").contains("does not start a gzip member"));
        let mut flags = good.clone();
        flags[3] |= 0x80;
        assert!(message(&flags, "f.gz").contains("reserved header flags"));
        let object = object(&dir, "long.gz", &good);
        let err = scan(&object, 100, true).unwrap_err().to_string();
        assert!(err.contains("longer than 100 bytes"), "{err}");
        std::fs::remove_dir_all(dir).unwrap();
    }

    #[test]
    fn a_cached_index_that_lies_about_its_shape_is_not_used() {
        let dir = temp("lies");
        let (text, _) = corpus(6_000);
        let object = object(&dir, "s.jsonl.gz", &gzip(&text, 6));
        let payload = scan(&object, 1 << 20, true).unwrap().encode();
        let file = dir.join("x");
        let decodes = |bytes: &[u8]| AccessIndex::decode(bytes, file.clone(), 0).is_some();
        assert!(decodes(&payload));
        for cut in [0, 7, 19, 20, 59, payload.len() - 1] {
            assert!(!decodes(&payload[..cut]), "cut at {cut}");
        }
        let mut flipped = payload.clone();
        flipped[30] ^= 1;
        assert!(
            !decodes(&flipped),
            "the points' CRC-32 catches a changed byte"
        );
        // Lies told with a matching CRC-32 are refused by shape.
        let forged = |at: usize, value: &[u8]| {
            let mut bytes = payload.clone();
            bytes[at..at + value.len()].copy_from_slice(value);
            let count = u32::from_le_bytes(bytes[16..20].try_into().unwrap()) as usize;
            let end = (20 + count * POINT_BYTES).min(bytes.len() - 4);
            let crc = zlib_rs::crc32::crc32(0, &bytes[..end]);
            bytes[end..end + 4].copy_from_slice(&crc.to_le_bytes());
            bytes
        };
        assert!(
            decodes(&forged(0, &payload[..8])),
            "re-signing alone changes nothing"
        );
        assert!(
            !decodes(&forged(16, &u32::MAX.to_le_bytes())),
            "a count past the file"
        );
        assert!(
            !decodes(&forged(0, &1u64.to_le_bytes())),
            "points past the rows"
        );
        assert!(
            !decodes(&forged(20 + 32, &(1u32 << 20).to_le_bytes())),
            "a window over 32 KiB"
        );
        assert!(
            !decodes(&forged(20 + 8, &u64::MAX.to_le_bytes())),
            "a skip past any line"
        );
        assert!(
            !decodes(&forged(20 + 24, &0u64.to_le_bytes())),
            "a member ending before its point"
        );
        let second = 20 + POINT_BYTES;
        assert!(
            !decodes(&forged(second, &0u64.to_le_bytes())),
            "points out of order"
        );
        std::fs::remove_dir_all(dir).unwrap();
    }
}
