//! The seekable gzip layout of `jsonl.gz` shards written by this engine (`docs/formats.md`).
//!
//! A shard is a series of gzip members, each holding whole lines, followed by an empty gzip
//! member whose header's extra field (FEXTRA) carries the member index: each member's compressed
//! and decompressed size and its line count. Any gzip reader sees one stream of lines (RFC 1952
//! allows concatenated members, and the last one is empty); this engine reads the index with one
//! small read from the end of the file and then decompresses only the member holding a row.
//! Every number read from the index is checked against the file before it sizes anything.

use std::io::Write;
use std::ops::Range;

use flate2::write::DeflateEncoder;
use flate2::{Crc, Decompress, FlushDecompress, Status};

use crate::error::{Error, Result};
use crate::formats::MAX_RECORD_BYTES;
use crate::storage::Object;

/// A member is closed after this many lines...
pub const MEMBER_ROWS: u64 = 1024;
/// ...or once its lines reach this many decompressed bytes, whichever comes first. A member is
/// the unit a seek decompresses, so this bounds the work wasted before row k.
pub const MEMBER_BYTES: u64 = 1 << 20;
/// The byte target never grows past this: readers refuse a member larger than it plus the
/// longest line, so a hostile index cannot size a buffer.
pub const MAX_MEMBER_BYTES: u64 = 64 << 20;
/// Deflate's largest expansion: no member inflates to more than this times its length.
const MAX_DEFLATE_RATIO: u64 = 1032;

/// The header of every data member: no flags, no mtime, no name, OS "unknown" (255), so the same
/// lines always give the same bytes.
const MEMBER_HEADER: [u8; 10] = [0x1f, 0x8b, 8, 0, 0, 0, 0, 0, 0, 0xff];
/// FLG.FEXTRA: the only flag the index member sets.
const FEXTRA: u8 = 0x04;
/// Subfield IDs (RFC 1952 2.3.1.1): the index, and the locator that ends the extra field.
const INDEX_ID: [u8; 2] = *b"oI";
const LOCATOR_ID: [u8; 2] = *b"oL";
/// An empty deflate stream (one final fixed-Huffman block holding only end-of-block), then the
/// CRC-32 and the size of nothing.
const EMPTY_BODY: [u8; 10] = [0x03, 0x00, 0, 0, 0, 0, 0, 0, 0, 0];
/// The file's last bytes: the locator subfield (ID, length 4, the index member's total length as
/// a little-endian u32) and the empty body. One read of this size finds the index.
pub const TAIL_BYTES: u64 = 18;
/// Index format version written in the first byte of the index subfield.
const VERSION: u8 = 1;
/// The extra field's length is a u16; the locator subfield takes 8 bytes of it and the index
/// subfield's own header 4.
const MAX_INDEX_DATA: usize = u16::MAX as usize - 8 - 4;
/// Fixed bytes of the index member besides its extra field: header (10), XLEN (2), empty body.
const INDEX_MEMBER_FIXED: u64 = 10 + 2 + 10;

/// Where each member of a seekable shard lies and what it holds.
#[derive(Debug)]
pub struct MemberIndex {
    /// Byte offset of member k; one more entry, where the index member starts.
    offsets: Vec<u64>,
    /// First row of member k; one more entry, the shard's row count.
    first_rows: Vec<u64>,
    /// Decompressed bytes of member k.
    sizes: Vec<u64>,
    /// The longest line of the shard, newline included.
    pub longest_line: u64,
}

impl MemberIndex {
    /// Members in the shard (the index member not counted).
    pub fn members(&self) -> usize {
        self.sizes.len()
    }

    /// Records in the shard.
    pub fn rows(&self) -> u64 {
        *self
            .first_rows
            .last()
            .expect("one entry past the last member")
    }

    /// The member holding `row`; `members()` for rows past the end.
    pub fn member_of(&self, row: u64) -> usize {
        self.first_rows[1..].partition_point(|&end| end <= row)
    }

    /// The rows of member `m`.
    pub fn rows_of(&self, m: usize) -> Range<u64> {
        self.first_rows[m]..self.first_rows[m + 1]
    }

    /// The bytes of member `m` in the file.
    pub fn bytes_of(&self, m: usize) -> Range<u64> {
        self.offsets[m]..self.offsets[m + 1]
    }

    /// Decompressed bytes of member `m`.
    pub fn size_of(&self, m: usize) -> u64 {
        self.sizes[m]
    }

    /// The largest member, compressed plus decompressed: what one reader holds at a time.
    pub fn largest_member(&self) -> u64 {
        (0..self.members())
            .map(|m| self.sizes[m] + (self.offsets[m + 1] - self.offsets[m]))
            .max()
            .unwrap_or(0)
    }
}

fn malformed(path: &str, row: Option<u64>, message: String) -> Error {
    Error::Format {
        path: path.to_owned(),
        encoding: "jsonl.gz",
        row,
        message,
    }
}

// --- writing ------------------------------------------------------------------------------

/// Writes `text` (lines, each ending in `\n`; `ends[i]` is the end of line i) as a seekable
/// gzip stream. `path` names the shard in errors.
pub fn write(out: &mut impl Write, text: &[u8], ends: &[usize], path: &str) -> Result<()> {
    let io = |e: std::io::Error| Error::io(path, e);
    let longest = ends
        .iter()
        .scan(0, |start, &end| {
            let n = end - *start;
            *start = end;
            Some(n)
        })
        .max()
        .unwrap_or(0) as u64;
    let members = plan(ends, path)?;
    let mut index = Vec::new();
    index.push(VERSION);
    put_varint(&mut index, longest);
    put_varint(&mut index, members.len() as u64);
    let mut encoder = DeflateEncoder::new(Vec::new(), flate2::Compression::default());
    for rows in members {
        let start = if rows.start == 0 {
            0
        } else {
            ends[rows.start - 1]
        };
        let body = &text[start..ends[rows.end - 1]];
        encoder.write_all(body).map_err(io)?;
        // `reset` finishes this member's deflate stream and starts the next one afresh.
        let deflated = encoder.reset(Vec::new()).map_err(io)?;
        let mut crc = Crc::new();
        crc.update(body);
        out.write_all(&MEMBER_HEADER).map_err(io)?;
        out.write_all(&deflated).map_err(io)?;
        out.write_all(&crc.sum().to_le_bytes()).map_err(io)?;
        out.write_all(&(body.len() as u32).to_le_bytes())
            .map_err(io)?;
        put_varint(&mut index, (deflated.len() + 18) as u64);
        put_varint(&mut index, body.len() as u64);
        put_varint(&mut index, rows.len() as u64);
    }
    if index.len() > MAX_INDEX_DATA {
        // `plan` sized members so that even incompressible ones fit; reaching this is a bug.
        return Err(Error::Internal {
            message: format!("{path}: the member index takes {} bytes", index.len()),
        });
    }
    let xlen = 4 + index.len() + 8;
    let total = INDEX_MEMBER_FIXED + xlen as u64;
    let mut member = Vec::with_capacity(total as usize);
    member.extend_from_slice(&[0x1f, 0x8b, 8, FEXTRA, 0, 0, 0, 0, 0, 0xff]);
    member.extend_from_slice(&(xlen as u16).to_le_bytes());
    member.extend_from_slice(&INDEX_ID);
    member.extend_from_slice(&(index.len() as u16).to_le_bytes());
    member.extend_from_slice(&index);
    member.extend_from_slice(&LOCATOR_ID);
    member.extend_from_slice(&4u16.to_le_bytes());
    member.extend_from_slice(&(total as u32).to_le_bytes());
    member.extend_from_slice(&EMPTY_BODY);
    out.write_all(&member).map_err(io)
}

/// Cuts lines into members of at most `MEMBER_ROWS` lines and about `MEMBER_BYTES`; where the
/// index of a very large shard would not fit the extra field, both limits double.
fn plan(ends: &[usize], path: &str) -> Result<Vec<Range<usize>>> {
    let (mut max_rows, mut max_bytes) = (MEMBER_ROWS as usize, MEMBER_BYTES as usize);
    loop {
        let mut members = Vec::new();
        let mut bound = 1 + 10 + 10;
        let mut start = 0;
        while start < ends.len() {
            let base = if start == 0 { 0 } else { ends[start - 1] };
            let mut end = start + 1;
            while end < ends.len() && end - start < max_rows && ends[end - 1] - base < max_bytes {
                end += 1;
            }
            let size = (ends[end - 1] - base) as u64;
            // Deflate's worst case (stored blocks) plus the member's header and trailer.
            let compressed = size + size / 1024 * 5 + 64;
            bound += varint_len(compressed) + varint_len(size) + varint_len((end - start) as u64);
            members.push(start..end);
            start = end;
        }
        if bound <= MAX_INDEX_DATA {
            return Ok(members);
        }
        if max_bytes as u64 >= MAX_MEMBER_BYTES {
            return Err(Error::Data {
                path: path.to_owned(),
                row: None,
                field: None,
                message: format!(
                    "{} records are too many for one seekable jsonl.gz shard; save fewer \
                     records per shard",
                    ends.len()
                ),
            });
        }
        max_rows *= 2;
        max_bytes *= 2;
    }
}

fn put_varint(out: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        out.push((v as u8) | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

fn varint_len(v: u64) -> usize {
    (64 - (v | 1).leading_zeros() as usize).div_ceil(7)
}

// --- reading the index --------------------------------------------------------------------

/// Reads a shard's member index with one read of its last bytes (and one more of the index
/// member): `None` when the file does not end with a locator (a gzip file from another writer),
/// an error when it does but the index disagrees with the file.
pub fn read_index(object: &Object) -> Result<Option<MemberIndex>> {
    let path = object.uri();
    let size = object.size();
    if size < TAIL_BYTES {
        return Ok(None);
    }
    let tail = object.read_range(size - TAIL_BYTES..size)?;
    if tail[..2] != LOCATOR_ID || tail[2..4] != [4, 0] || tail[8..] != EMPTY_BODY {
        return Ok(None);
    }
    let total = u64::from(u32::from_le_bytes([tail[4], tail[5], tail[6], tail[7]]));
    let most = INDEX_MEMBER_FIXED + u64::from(u16::MAX);
    if total < INDEX_MEMBER_FIXED + 12 || total > most || total > size {
        return Err(malformed(
            path,
            None,
            format!(
                "the seekable index locator gives an index member of {total} bytes, impossible \
                 in a file of {size} bytes"
            ),
        ));
    }
    let member = object.read_range(size - total..size)?;
    parse_index(&member, size, path).map(Some)
}

/// Parses the index member `member` (the last `member.len()` bytes of a file of `size` bytes).
pub fn parse_index(member: &[u8], size: u64, path: &str) -> Result<MemberIndex> {
    let bad = |message: String| malformed(path, None, message);
    let total = member.len();
    if (total as u64) < INDEX_MEMBER_FIXED
        || total as u64 > size
        || member[..4] != [0x1f, 0x8b, 8, FEXTRA]
    {
        return Err(bad(
            "the seekable index member does not start with a gzip header carrying only an \
             extra field"
                .to_owned(),
        ));
    }
    let xlen = usize::from(u16::from_le_bytes([member[10], member[11]]));
    if 12 + xlen + 10 != total {
        return Err(bad(format!(
            "the seekable index member's extra field takes {xlen} bytes, but the locator gives \
             the member {total} bytes"
        )));
    }
    let mut extra = &member[12..12 + xlen];
    let mut index = None;
    while !extra.is_empty() {
        if extra.len() < 4 {
            return Err(bad("a truncated subfield in the seekable index".to_owned()));
        }
        let id = [extra[0], extra[1]];
        let len = usize::from(u16::from_le_bytes([extra[2], extra[3]]));
        if 4 + len > extra.len() {
            return Err(bad(format!(
                "a subfield of {len} bytes overruns the seekable index's extra field"
            )));
        }
        let data = &extra[4..4 + len];
        extra = &extra[4 + len..];
        // Other subfield IDs are another writer's; readers skip them.
        if id == INDEX_ID {
            if index.is_some() {
                return Err(bad("two member indexes in one shard".to_owned()));
            }
            index = Some(data);
        }
    }
    let Some(data) = index else {
        return Err(bad(
            "the locator points at a gzip member without a member index".to_owned(),
        ));
    };
    decode_index(data, size - total as u64, path)
}

/// Decodes the index subfield; members must tile the file from byte 0 to `index_at`.
fn decode_index(data: &[u8], index_at: u64, path: &str) -> Result<MemberIndex> {
    let bad = |message: String| malformed(path, None, message);
    let mut input = Varints { data, at: 0 };
    match data.first() {
        Some(&VERSION) => input.at = 1,
        Some(&v) => {
            return Err(Error::Unsupported {
                path: path.to_owned(),
                encoding: "jsonl.gz",
                message: format!("seekable index version {v} (this build reads version {VERSION})"),
            })
        }
        None => return Err(bad("an empty member index".to_owned())),
    }
    let longest_line = input.next(path)?;
    if longest_line > MAX_RECORD_BYTES {
        return Err(bad(format!(
            "the member index gives a longest line of {longest_line} bytes, longer than any \
             reader holds ({MAX_RECORD_BYTES})"
        )));
    }
    let count = input.next(path)?;
    // Each entry takes at least three bytes: the count cannot size anything bigger than that.
    if count > (data.len() / 3) as u64 {
        return Err(bad(format!(
            "the member index claims {count} members in {} bytes",
            data.len()
        )));
    }
    let count = count as usize;
    let mut index = MemberIndex {
        offsets: Vec::with_capacity(count + 1),
        first_rows: Vec::with_capacity(count + 1),
        sizes: Vec::with_capacity(count),
        longest_line,
    };
    let (mut offset, mut row) = (0u64, 0u64);
    let largest = MAX_MEMBER_BYTES.saturating_add(longest_line);
    for m in 0..count {
        let (compressed, size, rows) = (input.next(path)?, input.next(path)?, input.next(path)?);
        let at = |message: String| malformed(path, Some(row), format!("member {m}: {message}"));
        if compressed < 18 {
            return Err(at(format!(
                "{compressed} bytes is smaller than any gzip member"
            )));
        }
        // A record's line holds at least `{}` and its newline; deflate expands at most 1,032
        // times (258-byte matches of one bit each), so a few compressed bytes cannot claim
        // megabytes and make a reader reserve them.
        if rows == 0
            || size < rows.saturating_mul(3)
            || size > largest
            || size > rows.saturating_mul(longest_line)
            || size > compressed.saturating_mul(MAX_DEFLATE_RATIO)
        {
            return Err(at(format!(
                "{rows} lines in {size} decompressed bytes from {compressed} compressed is \
                 impossible (lines of 3 to {longest_line} bytes, members at most {largest} \
                 bytes, deflate expanding at most {MAX_DEFLATE_RATIO} times)"
            )));
        }
        index.offsets.push(offset);
        index.first_rows.push(row);
        index.sizes.push(size);
        offset = offset
            .checked_add(compressed)
            .filter(|&end| end <= index_at)
            .ok_or_else(|| {
                at(format!(
                    "{compressed} bytes from byte {offset} run past the index at byte {index_at}"
                ))
            })?;
        row = row
            .checked_add(rows)
            .ok_or_else(|| at("the row count overflows".to_owned()))?;
    }
    if offset != index_at {
        return Err(bad(format!(
            "the members end at byte {offset}, but the index member starts at byte {index_at}"
        )));
    }
    if input.at != data.len() {
        return Err(bad(format!(
            "{} unread bytes after the member index",
            data.len() - input.at
        )));
    }
    index.offsets.push(offset);
    index.first_rows.push(row);
    Ok(index)
}

struct Varints<'a> {
    data: &'a [u8],
    at: usize,
}

impl Varints<'_> {
    fn next(&mut self, path: &str) -> Result<u64> {
        let mut value = 0u64;
        for shift in (0..64).step_by(7) {
            let Some(&byte) = self.data.get(self.at) else {
                return Err(malformed(
                    path,
                    None,
                    "the member index ends inside a number".to_owned(),
                ));
            };
            self.at += 1;
            let bits = u64::from(byte & 0x7f);
            if shift == 63 && bits > 1 {
                break;
            }
            value |= bits << shift;
            if byte & 0x80 == 0 {
                return Ok(value);
            }
        }
        Err(malformed(
            path,
            None,
            "a number in the member index overflows 64 bits".to_owned(),
        ))
    }
}

// --- reading members ----------------------------------------------------------------------

/// Decompresses one member into `text` (replacing its contents), checking it against its index
/// entry and its own trailer. `inflater` is reused across members.
pub fn inflate_member(
    member: &[u8],
    size: u64,
    inflater: &mut Decompress,
    text: &mut Vec<u8>,
    path: &str,
    first_row: u64,
) -> Result<()> {
    let bad = |message: String| malformed(path, Some(first_row), message);
    let body = gzip_body(member).map_err(|m| bad(m.to_owned()))?;
    let (deflated, trailer) = body.split_at(body.len() - 8);
    text.clear();
    // One byte of room past the indexed size tells a member that inflates further.
    let room = size as usize + 1;
    text.reserve_exact(room);
    inflater.reset(false);
    let status = inflater
        .decompress_vec(deflated, text, FlushDecompress::Finish)
        .map_err(|e| bad(format!("corrupt deflate data: {e}")))?;
    if text.len() as u64 > size {
        return Err(bad(format!(
            "the member inflates past the {size} bytes its index entry gives"
        )));
    }
    if status != Status::StreamEnd || inflater.total_in() != deflated.len() as u64 {
        return Err(bad(format!(
            "the member's deflate stream {} ({} of {} bytes read)",
            if status == Status::StreamEnd {
                "ends early"
            } else {
                "is cut short"
            },
            inflater.total_in(),
            deflated.len()
        )));
    }
    if text.len() as u64 != size {
        return Err(bad(format!(
            "the member holds {} bytes where its index entry gives {size}",
            text.len()
        )));
    }
    let mut crc = Crc::new();
    crc.update(text);
    let want_crc = u32::from_le_bytes([trailer[0], trailer[1], trailer[2], trailer[3]]);
    let want_size = u32::from_le_bytes([trailer[4], trailer[5], trailer[6], trailer[7]]);
    if crc.sum() != want_crc || want_size != size as u32 {
        return Err(bad(
            "the member's CRC-32 or size does not match its trailer".to_owned(),
        ));
    }
    Ok(())
}

/// Why bytes are not a gzip member header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BadHeader {
    /// No gzip magic and deflate method.
    NotGzip,
    /// FLG sets bits RFC 1952 reserves.
    ReservedFlags,
}

/// The length of the gzip member header `bytes` start with, whatever optional fields (extra,
/// name, comment, header CRC) its writer set; `Ok(None)` where `bytes` end inside it.
pub fn header_len(bytes: &[u8]) -> std::result::Result<Option<usize>, BadHeader> {
    const FHCRC: u8 = 0x02;
    const FNAME: u8 = 0x08;
    const FCOMMENT: u8 = 0x10;
    if bytes.len() < 4 {
        return if [0x1f, 0x8b, 8].starts_with(bytes) {
            Ok(None)
        } else {
            Err(BadHeader::NotGzip)
        };
    }
    if bytes[..3] != [0x1f, 0x8b, 8] {
        return Err(BadHeader::NotGzip);
    }
    let flags = bytes[3];
    if flags & 0xe0 != 0 {
        return Err(BadHeader::ReservedFlags);
    }
    let mut at = 10usize;
    if flags & FEXTRA != 0 {
        let Some(xlen) = bytes.get(at..at + 2) else {
            return Ok(None);
        };
        at += 2 + usize::from(u16::from_le_bytes([xlen[0], xlen[1]]));
    }
    for flag in [FNAME, FCOMMENT] {
        if flags & flag != 0 {
            let Some(end) = bytes.get(at..).and_then(|s| s.iter().position(|&b| b == 0)) else {
                return Ok(None);
            };
            at += end + 1;
        }
    }
    if flags & FHCRC != 0 {
        at += 2;
    }
    Ok((bytes.len() >= at).then_some(at))
}

/// The member's deflate data and 8-byte trailer, past its header.
fn gzip_body(member: &[u8]) -> std::result::Result<&[u8], &'static str> {
    let at = match header_len(member) {
        Err(BadHeader::NotGzip) => {
            return Err("the index points at bytes that are not a gzip member")
        }
        Err(BadHeader::ReservedFlags) => {
            return Err("a gzip member header with reserved flags set")
        }
        Ok(None) => return Err("a truncated gzip member header"),
        Ok(Some(at)) => at,
    };
    match member.get(at..) {
        Some(body) if body.len() >= 8 => Ok(body),
        _ => Err("a truncated gzip member header"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lines(n: usize, width: usize) -> (Vec<u8>, Vec<usize>) {
        let mut text = Vec::new();
        let mut ends = Vec::new();
        for i in 0..n {
            let pad = "x".repeat(width);
            text.extend_from_slice(format!("{{\"v\":{i},\"p\":\"{pad}\"}}\n").as_bytes());
            ends.push(text.len());
        }
        (text, ends)
    }

    fn index_of(file: &[u8]) -> Result<MemberIndex> {
        let tail = &file[file.len() - TAIL_BYTES as usize..];
        let total = u32::from_le_bytes([tail[4], tail[5], tail[6], tail[7]]) as usize;
        parse_index(&file[file.len() - total..], file.len() as u64, "s.jsonl.gz")
    }

    #[test]
    fn members_hold_bounded_lines_and_any_gzip_reader_sees_the_lines() {
        let (text, ends) = lines(3000, 10);
        let mut file = Vec::new();
        write(&mut file, &text, &ends, "s").unwrap();
        let mut plain = Vec::new();
        std::io::Read::read_to_end(
            &mut flate2::read::MultiGzDecoder::new(&file[..]),
            &mut plain,
        )
        .unwrap();
        assert_eq!(plain, text);
        let index = index_of(&file).unwrap();
        assert_eq!(index.members(), 3);
        assert_eq!(index.rows(), 3000);
        assert_eq!(index.rows_of(2), 2048..3000);
        assert_eq!(index.member_of(2047), 1);
        assert_eq!(index.member_of(2048), 2);
        assert_eq!(index.member_of(3000), 3);
        let mut inflater = Decompress::new(false);
        let mut out = Vec::new();
        let m = 1;
        let bytes = index.bytes_of(m);
        inflate_member(
            &file[bytes.start as usize..bytes.end as usize],
            index.size_of(m),
            &mut inflater,
            &mut out,
            "s",
            1024,
        )
        .unwrap();
        assert_eq!(out, text[ends[1023]..ends[2047]]);
    }

    #[test]
    fn large_lines_close_members_by_bytes_and_empty_shards_have_an_index() {
        let (text, ends) = lines(40, 100_000);
        let mut file = Vec::new();
        write(&mut file, &text, &ends, "s").unwrap();
        let index = index_of(&file).unwrap();
        assert!(index.members() >= 4, "{}", index.members());
        assert!((0..index.members()).all(|m| index.size_of(m) < MEMBER_BYTES + 100_100));
        let mut empty = Vec::new();
        write(&mut empty, &[], &[], "s").unwrap();
        assert_eq!(index_of(&empty).unwrap().rows(), 0);
    }

    #[test]
    fn many_members_grow_instead_of_overflowing_the_extra_field() {
        let (text, ends) = lines(20_000, 0);
        // Force small members by pretending every line is large: plan over fake ends.
        let fake: Vec<usize> = (1..=40_000).map(|i| i * 600_000).collect();
        let members = plan(&fake, "s").unwrap();
        assert!(members.len() < 40_000 / 2 + 1);
        let mut file = Vec::new();
        write(&mut file, &text, &ends, "s").unwrap();
        assert_eq!(index_of(&file).unwrap().rows(), 20_000);
    }

    #[test]
    fn the_same_lines_give_the_same_bytes() {
        let (text, ends) = lines(100, 3);
        let (mut a, mut b) = (Vec::new(), Vec::new());
        write(&mut a, &text, &ends, "s").unwrap();
        write(&mut b, &text, &ends, "s").unwrap();
        assert_eq!(a, b);
    }

    /// Rewrites the index subfield of `file` with `data`, keeping the layout valid otherwise.
    fn with_index(file: &[u8], data: &[u8]) -> Vec<u8> {
        let index = index_of(file).unwrap();
        let mut out = file[..index.offsets[index.members()] as usize].to_vec();
        let xlen = 4 + data.len() + 8;
        let total = INDEX_MEMBER_FIXED as usize + xlen;
        out.extend_from_slice(&[0x1f, 0x8b, 8, FEXTRA, 0, 0, 0, 0, 0, 0xff]);
        out.extend_from_slice(&(xlen as u16).to_le_bytes());
        out.extend_from_slice(&INDEX_ID);
        out.extend_from_slice(&(data.len() as u16).to_le_bytes());
        out.extend_from_slice(data);
        out.extend_from_slice(&LOCATOR_ID);
        out.extend_from_slice(&4u16.to_le_bytes());
        out.extend_from_slice(&(total as u32).to_le_bytes());
        out.extend_from_slice(&EMPTY_BODY);
        out
    }

    fn entries(longest: u64, members: &[(u64, u64, u64)]) -> Vec<u8> {
        let mut data = vec![VERSION];
        put_varint(&mut data, longest);
        put_varint(&mut data, members.len() as u64);
        for &(c, s, r) in members {
            put_varint(&mut data, c);
            put_varint(&mut data, s);
            put_varint(&mut data, r);
        }
        data
    }

    #[test]
    fn hostile_indexes_are_errors_not_allocations() {
        let (text, ends) = lines(10, 3);
        let mut file = Vec::new();
        write(&mut file, &text, &ends, "s").unwrap();
        let real = index_of(&file).unwrap();
        let c = real.bytes_of(0).end;
        let s = real.size_of(0);
        let cases: Vec<(Vec<u8>, &str)> = vec![
            (entries(20, &[(c, s, u64::MAX)]), "impossible"),
            (entries(u64::MAX, &[(c, u64::MAX, 1)]), "longest line"),
            (entries(20, &[(c, u64::MAX, 1)]), "impossible"),
            (entries(20, &[(c + 1, s, 10)]), "run past the index"),
            (entries(20, &[(c - 1, s, 10)]), "members end at byte"),
            (entries(20, &[(5, s, 10)]), "smaller than any gzip member"),
            (entries(20, &[(c, s, 0)]), "impossible"),
            (
                entries(20, &[(c / 2, s / 2, 5), (c - c / 2, s - s / 2, 5)]),
                "",
            ),
            (
                {
                    let mut d = vec![VERSION];
                    put_varint(&mut d, 20);
                    put_varint(&mut d, u64::MAX);
                    d
                },
                "claims",
            ),
            (
                vec![
                    VERSION, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x7f,
                ],
                "overflows",
            ),
            (vec![VERSION, 20], "ends inside a number"),
            (vec![9], "version 9"),
            (
                {
                    let mut d = entries(20, &[(c, s, 10)]);
                    d.push(0);
                    d
                },
                "unread bytes",
            ),
        ];
        for (data, want) in cases {
            let hostile = with_index(&file, &data);
            match index_of(&hostile) {
                Err(e) => assert!(e.to_string().contains(want), "{want}: {e}"),
                // Overlapping members that still tile the file parse; reading them fails.
                Ok(index) => {
                    assert_eq!(want, "", "accepted {data:?}");
                    let bytes = index.bytes_of(1);
                    let err = inflate_member(
                        &hostile[bytes.start as usize..bytes.end as usize],
                        index.size_of(1),
                        &mut Decompress::new(false),
                        &mut Vec::new(),
                        "s",
                        5,
                    )
                    .unwrap_err();
                    assert!(err.to_string().contains("row 5"), "{err}");
                }
            }
        }
    }

    #[test]
    fn corrupt_members_fail_closed() {
        let (text, ends) = lines(10, 3);
        let mut file = Vec::new();
        write(&mut file, &text, &ends, "s").unwrap();
        let index = index_of(&file).unwrap();
        let bytes = index.bytes_of(0);
        let member = &file[bytes.start as usize..bytes.end as usize];
        let mut inflater = Decompress::new(false);
        let mut out = Vec::new();
        for at in [0, 12, member.len() - 6, member.len() - 1] {
            let mut broken = member.to_vec();
            broken[at] ^= 0x55;
            let r = inflate_member(&broken, index.size_of(0), &mut inflater, &mut out, "s", 0);
            assert!(r.is_err(), "flipping byte {at} went unnoticed");
        }
        let r = inflate_member(
            member,
            index.size_of(0) - 1,
            &mut inflater,
            &mut out,
            "s",
            0,
        );
        assert!(r.unwrap_err().to_string().contains("inflates past"));
    }

    #[test]
    fn varints_round_trip() {
        for v in [0, 1, 127, 128, 300, u64::from(u32::MAX), u64::MAX] {
            let mut d = Vec::new();
            put_varint(&mut d, v);
            assert_eq!(d.len(), varint_len(v));
            assert_eq!(Varints { data: &d, at: 0 }.next("s").unwrap(), v);
        }
    }
}
