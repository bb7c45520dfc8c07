//! `NumPy` arrays of token ids, read in place: a `.npy` file with its header (format versions
//! 1-3; one dimension; little-endian integers), or a headerless array such as `OLMo` token
//! files, whose type comes from a sibling `meta.json` as a `.bin` shard's does
//! (`docs/corpora.md`). Both are one stream of ids, cut into documents at an eos id.

use std::io::Write;
use std::sync::Arc;

use super::format::{
    no_records, read_in_place, tokens_only, RecordInspection, RecordSource, ShardFormat,
};
use super::token_ids::IdType;
use super::{ShardData, ShardMeta};
use crate::encoding::Encoding;
use crate::error::{Error, Result};
use crate::storage::Object;

/// The first bytes of a `.npy` file.
pub const MAGIC: &[u8; 6] = b"\x93NUMPY";
/// A header longer than this is not one of a token array (`NumPy` pads headers to 64 bytes).
pub const MAX_HEADER_BYTES: u64 = 64 << 10;

/// A `.npy` file's array, as its header describes it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NpyArray {
    /// The type of its elements.
    pub ids: IdType,
    /// Byte where the elements start.
    pub offset: u64,
    /// Elements.
    pub len: u64,
}

fn malformed(path: &str, message: String) -> Error {
    Error::Format {
        path: path.to_owned(),
        encoding: Encoding::Npy.name(),
        row: None,
        message,
    }
}

/// Whether `object` starts with the `.npy` magic (a headerless array does not).
pub fn has_header(object: &Object) -> Result<bool> {
    if object.size() < MAGIC.len() as u64 {
        return Ok(false);
    }
    Ok(&object.read_range(0..MAGIC.len() as u64)?[..] == MAGIC)
}

/// Reads and checks a `.npy` file's header: a token array is one-dimensional, of a
/// little-endian (or single-byte) integer type, and fills the file after its header exactly.
pub fn read_header(object: &Object) -> Result<NpyArray> {
    let path = object.uri();
    let size = object.size();
    let bad = |message: String| malformed(path, message);
    let prefix = object.read_range(0..size.min(12))?;
    if prefix.len() < 10 || &prefix[..6] != MAGIC {
        return Err(bad(
            "not a .npy file: it does not start with \\x93NUMPY".to_owned()
        ));
    }
    let (major, minor) = (prefix[6], prefix[7]);
    let (len_bytes, header_len) = match major {
        1 => (2u64, u64::from(u16::from_le_bytes([prefix[8], prefix[9]]))),
        2 | 3 if prefix.len() >= 12 => (
            4,
            u64::from(u32::from_le_bytes([
                prefix[8], prefix[9], prefix[10], prefix[11],
            ])),
        ),
        _ => {
            return Err(bad(format!(
                "format version {major}.{minor}; versions 1, 2 and 3 are read"
            )))
        }
    };
    let offset = 8 + len_bytes + header_len;
    if header_len > MAX_HEADER_BYTES || offset > size {
        return Err(bad(format!(
            "its header claims {header_len} bytes, more than the file ({size} bytes) or a \
             token array's header ({MAX_HEADER_BYTES}) holds"
        )));
    }
    let header = object.read_range(8 + len_bytes..offset)?;
    let header =
        std::str::from_utf8(&header).map_err(|_| bad("its header is not text".to_owned()))?;
    let descr = quoted_value(header, "descr")
        .ok_or_else(|| bad(format!("its header names no 'descr': {}", header.trim())))?;
    let ids = token_type(descr).ok_or_else(|| Error::Unsupported {
        path: path.to_owned(),
        encoding: Encoding::Npy.name(),
        message: format!(
            "its elements are '{descr}'; token arrays hold little-endian integers \
             (<u2, <i4, |u1, ...)"
        ),
    })?;
    let shape = raw_value(header, "shape")
        .ok_or_else(|| bad(format!("its header names no 'shape': {}", header.trim())))?;
    let dims: Vec<&str> = shape
        .trim_start_matches('(')
        .trim_end_matches(')')
        .split(',')
        .map(str::trim)
        .filter(|d| !d.is_empty())
        .collect();
    let [len] = dims[..] else {
        return Err(Error::Unsupported {
            path: path.to_owned(),
            encoding: Encoding::Npy.name(),
            message: format!("its shape is {shape}; a token array has one dimension"),
        });
    };
    let len: u64 = len
        .parse()
        .map_err(|_| bad(format!("its shape {shape} is not a length")))?;
    let fortran = raw_value(header, "fortran_order").unwrap_or("False");
    if fortran != "False" && fortran != "True" {
        return Err(bad(format!("fortran_order is {fortran}")));
    }
    // One dimension is the same in either order.
    match len.checked_mul(ids.width) {
        Some(bytes) if bytes == size - offset => Ok(NpyArray { ids, offset, len }),
        _ => Err(bad(format!(
            "its header says {len} elements of {} bytes after byte {offset}; the file holds \
             {} bytes there",
            ids.width,
            size - offset
        ))),
    }
}

/// The value after `'key':` in a header dictionary, up to the next top-level comma or brace.
fn raw_value<'a>(header: &'a str, key: &str) -> Option<&'a str> {
    let at = header.find(&format!("'{key}'"))? + key.len() + 2;
    let rest = header[at..].trim_start().strip_prefix(':')?.trim_start();
    let mut depth = 0i32;
    for (i, c) in rest.char_indices() {
        match c {
            '(' | '[' => depth += 1,
            ')' | ']' => depth -= 1,
            ',' | '}' if depth == 0 => return Some(rest[..i].trim()),
            _ => {}
        }
    }
    None
}

/// A quoted string value of a header dictionary.
fn quoted_value<'a>(header: &'a str, key: &str) -> Option<&'a str> {
    let raw = raw_value(header, key)?;
    raw.strip_prefix('\'')?.strip_suffix('\'')
}

/// The id type an array's `descr` names, when it is a little-endian or single-byte integer.
fn token_type(descr: &str) -> Option<IdType> {
    let (order, code) = descr.split_at_checked(1)?;
    let ids = IdType::parse(code)?;
    let ordered = match order {
        "<" => true,
        // `|` (not applicable) and `=` (native) are only unambiguous for single bytes.
        "|" | "=" => ids.width == 1,
        _ => false,
    };
    (ordered && code.len() == 2).then_some(ids)
}

/// `NumPy` token arrays.
pub struct Npy;

impl ShardFormat for Npy {
    fn encoding(&self) -> Encoding {
        Encoding::Npy
    }

    fn reads_records(&self) -> bool {
        false
    }

    fn reads_tokens(&self) -> bool {
        true
    }

    fn inspect(&self, object: Arc<Object>, _how: RecordInspection<'_>) -> Result<ShardMeta> {
        Err(tokens_only(&object, "a NumPy token array"))
    }

    fn records(
        &self,
        _storage: &crate::storage::Storage,
        object: Arc<Object>,
        _chunk_rows: usize,
    ) -> Result<Box<dyn RecordSource>> {
        Err(no_records(&object, Encoding::Npy, "a NumPy token array"))
    }

    fn write(&self, _out: &mut (dyn Write + Send), _data: ShardData<'_>, name: &str) -> Result<()> {
        Err(read_in_place(
            name,
            "NumPy token arrays",
            "records with a token list field as parquet",
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::{raw_value, token_type};
    use crate::formats::token_ids::IdType;

    #[test]
    fn header_values_are_found_whatever_their_order() {
        let h = "{'descr': '<u2', 'fortran_order': False, 'shape': (12,), }";
        assert_eq!(raw_value(h, "shape"), Some("(12,)"));
        assert_eq!(raw_value(h, "fortran_order"), Some("False"));
        let h = "{'shape': (3, 4), 'descr': '<i4', 'fortran_order': False}";
        assert_eq!(raw_value(h, "shape"), Some("(3, 4)"));
        assert_eq!(raw_value(h, "descr"), Some("'<i4'"));
    }

    #[test]
    fn only_little_endian_integers_are_token_types() {
        assert_eq!(token_type("<u2"), Some(IdType::U16));
        assert_eq!(token_type("<i8"), Some(IdType::new(8, true)));
        assert_eq!(token_type("|u1"), Some(IdType::new(1, false)));
        assert_eq!(token_type(">u2"), None);
        assert_eq!(token_type("<f4"), None);
        assert_eq!(token_type("|u2"), None);
        assert_eq!(token_type("<u16"), None);
    }
}
