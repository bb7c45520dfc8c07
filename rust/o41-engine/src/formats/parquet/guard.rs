//! Checks of a Parquet shard's footer and page headers, made on their raw Thrift bytes before
//! arrow-rs builds anything from them: arrow-rs trusts what they declare.
//!
//! - Its schema reader and its array reader and writer builders recurse once per nesting level,
//!   so a column nested a thousand lists deep overflows a thread's stack (a crash, not an
//!   error). A schema deeper than [`MAX_NESTING`] is refused first.
//! - It reads a column's physical type from the schema and ignores the column metadata's, so a
//!   chunk written as INT64 under an INT32 schema element decodes as garbage; they must agree.
//! - It allocates what a page header declares: `uncompressed_page_size` bytes before
//!   decompressing, `num_values` dictionary entries before decoding them (the upstream issue:
//!   apache/arrow-rs "`DictDecoder::set_dict` / `decompress_buffer` allocate from untrusted
//!   page headers"). A page's uncompressed size must fit its column chunk's declared size (which the
//!   memory bound counts), and a dictionary cannot hold more values than its bytes can encode.
//! - A chunk's declared uncompressed size must be one its codec can expand its compressed bytes
//!   to; a larger one is a forged footer, not a memory limit too small for the shard.
//!
//! The functions here are pure (bytes in, a message out); `parquet` reads the bytes and names the
//! shard in the error.

use parquet::basic::{Compression, Type as Physical};
use parquet::file::metadata::ColumnChunkMetaData;

use super::footer::MAX_SCHEMA_DEPTH as MAX_NESTING;

/// Why a footer is refused: a shard deeper than this build reads (a valid file), or one whose
/// footer contradicts itself.
#[derive(Debug, PartialEq, Eq)]
pub enum Refusal {
    /// Valid, but nested deeper than [`MAX_NESTING`].
    Unsupported(String),
    /// Malformed.
    Malformed(String),
}

/// How deep the Thrift structures of a footer or page header may nest (Parquet's own are at most
/// 5 deep; statistics and logical types included).
const MAX_THRIFT_DEPTH: usize = 16;

/// A compact-protocol Thrift reader over a byte slice; `None` when the bytes end early or are not
/// Thrift.
struct Compact<'a> {
    bytes: &'a [u8],
    at: usize,
}

// Compact protocol element types.
const T_TRUE: u8 = 1;
const T_FALSE: u8 = 2;
const T_BYTE: u8 = 3;
const T_I16: u8 = 4;
const T_I32: u8 = 5;
const T_I64: u8 = 6;
const T_DOUBLE: u8 = 7;
const T_BINARY: u8 = 8;
const T_LIST: u8 = 9;
const T_SET: u8 = 10;
const T_MAP: u8 = 11;
const T_STRUCT: u8 = 12;

impl<'a> Compact<'a> {
    fn new(bytes: &'a [u8]) -> Self {
        Compact { bytes, at: 0 }
    }

    fn byte(&mut self) -> Option<u8> {
        let b = *self.bytes.get(self.at)?;
        self.at += 1;
        Some(b)
    }

    fn varint(&mut self) -> Option<u64> {
        let mut value = 0u64;
        for shift in (0..70).step_by(7) {
            let b = self.byte()?;
            value |= u64::from(b & 0x7f).checked_shl(shift)?;
            if b & 0x80 == 0 {
                return Some(value);
            }
        }
        None
    }

    fn zigzag(&mut self) -> Option<i64> {
        let v = self.varint()?;
        Some((v >> 1) as i64 ^ -((v & 1) as i64))
    }

    fn i32(&mut self) -> Option<i32> {
        i32::try_from(self.zigzag()?).ok()
    }

    fn binary(&mut self) -> Option<&'a [u8]> {
        let len = usize::try_from(self.varint()?).ok()?;
        let end = self.at.checked_add(len)?;
        let out = self.bytes.get(self.at..end)?;
        self.at = end;
        Some(out)
    }

    /// The next field's id and type; type 0 (stop) at the struct's end.
    fn field(&mut self, last: &mut i16) -> Option<(i16, u8)> {
        let header = self.byte()?;
        if header == 0 {
            return Some((0, 0));
        }
        let kind = header & 0x0f;
        let delta = header >> 4;
        let id = if delta == 0 {
            i16::try_from(self.zigzag()?).ok()?
        } else {
            last.checked_add(i16::from(delta))?
        };
        *last = id;
        Some((id, kind))
    }

    /// A list's (or set's) element type and length.
    fn list(&mut self) -> Option<(u8, usize)> {
        let header = self.byte()?;
        let kind = header & 0x0f;
        let len = match header >> 4 {
            15 => usize::try_from(self.varint()?).ok()?,
            n => usize::from(n),
        };
        // Every element takes at least one byte: a longer list cannot be in these bytes.
        (len <= self.bytes.len() - self.at).then_some((kind, len))
    }

    /// Reads past one value of type `kind` (a field's: booleans are in the field header).
    fn skip(&mut self, kind: u8, depth: usize) -> Option<()> {
        if depth > MAX_THRIFT_DEPTH {
            return None;
        }
        match kind {
            T_TRUE | T_FALSE => {}
            T_BYTE => {
                self.byte()?;
            }
            T_I16 | T_I32 | T_I64 => {
                self.varint()?;
            }
            T_DOUBLE => {
                self.at = self.at.checked_add(8).filter(|&e| e <= self.bytes.len())?;
            }
            T_BINARY => {
                self.binary()?;
            }
            T_LIST | T_SET => {
                let (elem, len) = self.list()?;
                for _ in 0..len {
                    self.skip_element(elem, depth + 1)?;
                }
            }
            T_MAP => {
                let len = usize::try_from(self.varint()?).ok()?;
                if len > 0 {
                    let types = self.byte()?;
                    if len > self.bytes.len() - self.at {
                        return None;
                    }
                    for _ in 0..len {
                        self.skip_element(types >> 4, depth + 1)?;
                        self.skip_element(types & 0x0f, depth + 1)?;
                    }
                }
            }
            T_STRUCT => {
                let mut last = 0;
                loop {
                    let (_, kind) = self.field(&mut last)?;
                    if kind == 0 {
                        break;
                    }
                    self.skip(kind, depth + 1)?;
                }
            }
            _ => return None,
        }
        Some(())
    }

    /// Reads past one list element: a boolean element is a byte of its own.
    fn skip_element(&mut self, kind: u8, depth: usize) -> Option<()> {
        if matches!(kind, T_TRUE | T_FALSE) {
            self.byte().map(drop)
        } else {
            self.skip(kind, depth)
        }
    }

    /// Calls `f(id, kind, self)` for each field of a struct; `f` reads the value or returns
    /// `false` to have it skipped.
    fn each_field(
        &mut self,
        depth: usize,
        mut f: impl FnMut(i16, u8, &mut Self) -> Option<bool>,
    ) -> Option<()> {
        if depth > MAX_THRIFT_DEPTH {
            return None;
        }
        let mut last = 0;
        loop {
            let (id, kind) = self.field(&mut last)?;
            if kind == 0 {
                break;
            }
            if !f(id, kind, self)? {
                self.skip(kind, depth + 1)?;
            }
        }
        Some(())
    }
}

/// Physical type names, as Parquet's Thrift numbers them.
fn physical_name(code: i32) -> String {
    match code {
        0 => "BOOLEAN".into(),
        1 => "INT32".into(),
        2 => "INT64".into(),
        3 => "INT96".into(),
        4 => "FLOAT".into(),
        5 => "DOUBLE".into(),
        6 => "BYTE_ARRAY".into(),
        7 => "FIXED_LEN_BYTE_ARRAY".into(),
        other => format!("type {other}"),
    }
}

/// One schema element: what the checks need of it.
#[derive(Default)]
struct Element {
    name: String,
    physical: Option<i32>,
    children: usize,
}

/// Checks a footer's `FileMetaData` (its Thrift bytes, without the length and magic): schema
/// nesting within [`MAX_NESTING`], and each column chunk's physical type equal to its schema
/// leaf's. Bytes that do not parse are left to arrow-rs, which says what is wrong with them.
///
/// # Errors
/// What is wrong, naming the column.
pub fn check_footer(bytes: &[u8]) -> Result<(), Refusal> {
    let mut c = Compact::new(bytes);
    let mut leaves: Vec<(String, Option<i32>)> = Vec::new();
    let mut groups: Vec<Vec<Option<i32>>> = Vec::new();
    let mut problem: Option<String> = None;
    let parsed = c.each_field(0, |id, kind, c| match (id, kind) {
        (2, T_LIST) => {
            let (elem, len) = c.list()?;
            if elem != T_STRUCT {
                return None;
            }
            // Remaining children of each open group; the depth is how many are open.
            let mut open: Vec<usize> = Vec::new();
            let mut names: Vec<String> = Vec::new();
            for k in 0..len {
                let mut e = Element::default();
                c.each_field(1, |id, kind, c| {
                    Some(match (id, kind) {
                        (1, T_I32) => {
                            e.physical = Some(c.i32()?);
                            true
                        }
                        (4, T_BINARY) => {
                            e.name = String::from_utf8_lossy(c.binary()?).into_owned();
                            true
                        }
                        (5, T_I32) => {
                            e.children = usize::try_from(c.i32()?).unwrap_or(0);
                            true
                        }
                        _ => false,
                    })
                })?;
                while open.last() == Some(&0) {
                    open.pop();
                    names.pop();
                }
                if let Some(last) = open.last_mut() {
                    *last -= 1;
                }
                if k > 0 {
                    names.push(e.name.clone());
                }
                if e.children > 0 {
                    open.push(e.children);
                } else if k > 0 {
                    // The path's length is the column's depth, as arrow-rs builds it.
                    if names.len() > MAX_NESTING && problem.is_none() {
                        problem = Some(format!(
                            "column '{}' nests {} levels deep, more than the {MAX_NESTING} \
                             supported",
                            names[..2].join("."),
                            names.len()
                        ));
                    }
                    leaves.push((names.join("."), e.physical));
                    names.pop();
                }
            }
            Some(true)
        }
        (4, T_LIST) => {
            let (elem, len) = c.list()?;
            if elem != T_STRUCT {
                return None;
            }
            for _ in 0..len {
                let mut types = Vec::new();
                c.each_field(1, |id, kind, c| {
                    if (id, kind) != (1, T_LIST) {
                        return Some(false);
                    }
                    let (elem, len) = c.list()?;
                    if elem != T_STRUCT {
                        return None;
                    }
                    for _ in 0..len {
                        let mut physical = None;
                        c.each_field(2, |id, kind, c| {
                            if (id, kind) != (3, T_STRUCT) {
                                return Some(false);
                            }
                            c.each_field(3, |id, kind, c| {
                                if (id, kind) != (1, T_I32) {
                                    return Some(false);
                                }
                                physical = Some(c.i32()?);
                                Some(true)
                            })?;
                            Some(true)
                        })?;
                        types.push(physical);
                    }
                    Some(true)
                })?;
                groups.push(types);
            }
            Some(true)
        }
        _ => Some(false),
    });
    if let Some(problem) = problem {
        return Err(Refusal::Unsupported(problem));
    }
    if parsed.is_none() {
        return Ok(());
    }
    for (g, types) in groups.iter().enumerate() {
        for ((name, schema), chunk) in leaves.iter().zip(types) {
            if let (Some(schema), Some(chunk)) = (schema, chunk) {
                if schema != chunk {
                    return Err(Refusal::Malformed(format!(
                        "column '{name}' is {} in the schema but {} in row group {g}'s column \
                         metadata",
                        physical_name(*schema),
                        physical_name(*chunk)
                    )));
                }
            }
        }
    }
    Ok(())
}

/// What the checks need of a page header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PageHeader {
    /// Bytes of the header itself.
    pub header_len: u64,
    /// `type`: 0 data, 2 dictionary, 3 data v2.
    pub kind: i32,
    pub uncompressed: i32,
    pub compressed: i32,
    /// A dictionary page's `num_values`.
    pub dictionary_values: Option<i32>,
}

/// Parses a page header from the start of `bytes`: `Ok(None)` when `bytes` end before it does.
///
/// # Errors
/// When the bytes are not a page header.
pub fn page_header(bytes: &[u8]) -> Result<Option<PageHeader>, String> {
    let mut c = Compact::new(bytes);
    let mut header = PageHeader {
        header_len: 0,
        kind: -1,
        uncompressed: -1,
        compressed: -1,
        dictionary_values: None,
    };
    let parsed = c.each_field(0, |id, kind, c| {
        Some(match (id, kind) {
            (1, T_I32) => {
                header.kind = c.i32()?;
                true
            }
            (2, T_I32) => {
                header.uncompressed = c.i32()?;
                true
            }
            (3, T_I32) => {
                header.compressed = c.i32()?;
                true
            }
            (7, T_STRUCT) => {
                c.each_field(1, |id, kind, c| {
                    if (id, kind) != (1, T_I32) {
                        return Some(false);
                    }
                    header.dictionary_values = Some(c.i32()?);
                    Some(true)
                })?;
                true
            }
            _ => false,
        })
    });
    if parsed.is_none() {
        // Too short, or not Thrift: which, the caller tells by offering more bytes.
        return Ok(None);
    }
    header.header_len = c.at as u64;
    if header.uncompressed < 0 || header.compressed < 0 {
        return Err(format!(
            "a page header declares {} compressed and {} uncompressed bytes",
            header.compressed, header.uncompressed
        ));
    }
    Ok(Some(header))
}

/// The least bytes a plain-encoded dictionary value of `physical` type takes, in eighths of a
/// byte (booleans are bits).
fn least_eighths(column: &ColumnChunkMetaData) -> u64 {
    match column.column_type() {
        Physical::BOOLEAN => 1,
        Physical::INT32 | Physical::FLOAT | Physical::BYTE_ARRAY => 32,
        Physical::INT64 | Physical::DOUBLE => 64,
        Physical::INT96 => 96,
        Physical::FIXED_LEN_BYTE_ARRAY => {
            8 * u64::try_from(column.column_descr().type_length()).unwrap_or(0)
        }
    }
}

/// Checks one page's header against its column chunk: its bytes within the chunk, its
/// uncompressed size within the chunk's declared one, a dictionary's values within its bytes.
///
/// # Errors
/// What the header claims that it cannot.
pub fn check_page(
    column: &ColumnChunkMetaData,
    header: &PageHeader,
    at: u64,
    chunk_end: u64,
) -> Result<(), String> {
    let name = column.column_path().string();
    let end = at
        .checked_add(header.header_len)
        .and_then(|e| e.checked_add(header.compressed as u64));
    if end.is_none_or(|end| end > chunk_end) {
        return Err(format!(
            "column '{name}': the page at byte {at} declares {} bytes, past its column chunk's end \
             at byte {chunk_end}",
            header.compressed
        ));
    }
    let declared = u64::try_from(column.uncompressed_size()).unwrap_or(0);
    if header.uncompressed as u64 > declared {
        return Err(format!(
            "column '{name}': the page at byte {at} declares {} uncompressed bytes, more than its \
             column chunk's {declared}",
            header.uncompressed
        ));
    }
    if let Some(values) = header.dictionary_values {
        let most = (header.uncompressed as u64) * 8 / least_eighths(column).max(1);
        if values < 0 || values as u64 > most {
            return Err(format!(
                "column '{name}': the dictionary page at byte {at} declares {values} values, more \
                 than its {} bytes hold",
                header.uncompressed
            ));
        }
    }
    Ok(())
}

/// How many times its compressed size a codec can expand a column chunk to, at most (a little
/// above each format's limit): a declared uncompressed size beyond it is forged.
fn most_expansion(codec: Compression) -> Option<u64> {
    match codec {
        // Page headers differ in size between the two; pages themselves do not.
        Compression::UNCOMPRESSED => Some(2),
        // A 3-byte copy yields at most 64 bytes.
        Compression::SNAPPY => Some(22),
        // A deflate block expands at most 1,032 times.
        Compression::GZIP(_) => Some(1040),
        // An LZ4 sequence of 255-byte length extensions: about 255 times.
        Compression::LZ4 | Compression::LZ4_RAW => Some(256),
        // zstd and Brotli repeat a byte run almost without bound: only the memory bound holds.
        _ => None,
    }
}

/// Checks a column chunk's declared uncompressed size against what its codec can produce from
/// its compressed bytes.
///
/// # Errors
/// The column, its sizes and codec.
pub fn check_chunk_sizes(column: &ColumnChunkMetaData, group: usize) -> Result<(), String> {
    let (compressed, uncompressed) = (column.compressed_size(), column.uncompressed_size());
    let Some(ratio) = most_expansion(column.compression()) else {
        return Ok(());
    };
    // Small chunks: page headers and a few values may outweigh their compressed pages.
    let most = (compressed.max(0) as u64)
        .saturating_mul(ratio)
        .saturating_add(4096);
    if uncompressed.max(0) as u64 > most {
        return Err(format!(
            "column '{}' of row group {group} declares {uncompressed} uncompressed bytes, more \
             than {} can make of its {compressed} compressed bytes",
            column.column_path(),
            column.compression()
        ));
    }
    Ok(())
}

/// Checks the page headers in `ranges` (each a column chunk, or pages of one, as the decoder will
/// read them: `ParquetIndex::pages`) of `metadata`'s shard, read through `reader`. A range no
/// column chunk holds, or a header too long to read here, is left to the decoder.
///
/// # Errors
/// The first header that claims what its chunk cannot hold.
pub fn check_pages<R: parquet::file::reader::ChunkReader>(
    reader: &R,
    metadata: &parquet::file::metadata::ParquetMetaData,
    ranges: &[std::ops::Range<u64>],
) -> Result<(), String> {
    for range in ranges {
        let Some(column) = metadata
            .row_groups()
            .iter()
            .flat_map(parquet::file::metadata::RowGroupMetaData::columns)
            .find(|c| {
                let (start, len) = c.byte_range();
                start <= range.start && range.end <= start.saturating_add(len)
            })
        else {
            continue;
        };
        let (start, len) = column.byte_range();
        let chunk_end = start.saturating_add(len);
        let mut at = range.start;
        'pages: while at < range.end {
            for want in [256u64, 16 << 10, 1 << 20] {
                let take = want.min(chunk_end - at);
                let Ok(bytes) = reader.get_bytes(at, take as usize) else {
                    // A storage failure: the decoder meets and reports it.
                    return Ok(());
                };
                if let Some(header) = page_header(&bytes)? {
                    check_page(column, &header, at, chunk_end)?;
                    at += header.header_len + header.compressed as u64;
                    continue 'pages;
                }
                if take < want {
                    break;
                }
            }
            // Not a header this reads: arrow-rs says what is wrong with it.
            break;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn varint(out: &mut Vec<u8>, mut v: u64) {
        while v >= 0x80 {
            out.push((v as u8) | 0x80);
            v >>= 7;
        }
        out.push(v as u8);
    }

    fn zigzag(out: &mut Vec<u8>, v: i64) {
        varint(out, ((v << 1) ^ (v >> 63)) as u64);
    }

    /// A dictionary page header, as Thrift compact bytes.
    fn dictionary_header(uncompressed: i32, compressed: i32, values: i32) -> Vec<u8> {
        let mut b = vec![0x15];
        zigzag(&mut b, 2);
        b.push(0x15);
        zigzag(&mut b, uncompressed.into());
        b.push(0x15);
        zigzag(&mut b, compressed.into());
        b.push(0x4c); // field 7, struct
        b.push(0x15);
        zigzag(&mut b, values.into());
        b.push(0x15);
        zigzag(&mut b, 0);
        b.push(0);
        b.push(0);
        b
    }

    #[test]
    fn reads_a_dictionary_header_and_waits_for_more_bytes() {
        let bytes = dictionary_header(800, 400, 100);
        let header = page_header(&bytes).unwrap().unwrap();
        assert_eq!(header.header_len, bytes.len() as u64);
        assert_eq!(
            (header.kind, header.uncompressed, header.compressed),
            (2, 800, 400)
        );
        assert_eq!(header.dictionary_values, Some(100));
        assert_eq!(page_header(&bytes[..bytes.len() - 1]).unwrap(), None);
        assert!(page_header(&dictionary_header(-1, 4, 1)).is_err());
    }
}
