//! The `.bin` token format: little-endian ids of 2 or 4 bytes, described by a sibling
//! `meta.json` (dtype, eos id), scanned for document ends.

use std::io::Read;
use std::sync::Arc;

use serde::Deserialize;

use super::{malformed, Documents};
use crate::encoding::Encoding;
use crate::error::{Error, Result};
use crate::formats::format::{
    no_records, tokens_only, RecordInspection, RecordSource, ShardFormat,
};
use crate::formats::token_ids::IdType;
use crate::formats::{ShardData, ShardMeta};
use crate::storage::{sibling, Object, Storage};

/// A `.bin` stream of token ids: read only by stages that pack or window tokens, written only by
/// the tokenizer.
pub struct Bin;

impl ShardFormat for Bin {
    fn encoding(&self) -> Encoding {
        Encoding::Bin
    }

    fn reads_records(&self) -> bool {
        false
    }

    fn reads_tokens(&self) -> bool {
        true
    }

    fn inspect(&self, object: Arc<Object>, _how: RecordInspection<'_>) -> Result<ShardMeta> {
        Err(tokens_only(&object, "a .bin token stream"))
    }

    fn records(
        &self,
        _storage: &Storage,
        object: Arc<Object>,
        _chunk_rows: usize,
    ) -> Result<Box<dyn RecordSource>> {
        Err(no_records(&object, Encoding::Bin, "a .bin shard"))
    }

    fn write(
        &self,
        _out: &mut (dyn std::io::Write + Send),
        _data: ShardData<'_>,
        name: &str,
    ) -> Result<()> {
        Err(Error::config(
            "data_format",
            format!(
                "{name}: .bin token streams are written by a tokenizer, not the dataset saver; \
                 save records with a token list field as parquet"
            ),
        ))
    }
}

/// The file beside a `.bin` shard that describes it.
pub const META_FILE: &str = "meta.json";
/// A `meta.json` larger than this is not one.
pub(super) const MAX_META_BYTES: u64 = 1 << 20;

/// Bytes read at a time when a `.bin` shard is scanned for document ends.
pub(super) const SCAN_BYTES: usize = 1 << 20;

/// What a `.bin` shard's `meta.json` says.
#[derive(Debug, Deserialize)]
pub(super) struct BinMeta {
    /// `uint16` or `uint32`.
    pub(super) dtype: String,
    /// The id that ends each document, if the corpus marks them.
    #[serde(default)]
    pub(super) eos_id: Option<u64>,
}

/// Reads `path`'s `meta.json`: the type of its ids and its eos id. A headerless `NumPy` token
/// array (`encoding`) is described the same way.
pub(in crate::formats) fn bin_meta(
    storage: &Storage,
    path: &str,
    encoding: Encoding,
) -> Result<(IdType, Option<u64>)> {
    let meta_path = sibling(path, META_FILE);
    let object = storage.open(&meta_path).map_err(|e| match e {
        e @ Error::Cancelled { .. } => e,
        other => malformed(
            path,
            encoding,
            None,
            format!(
                "a {} shard without a header is described by {meta_path} (its dtype and eos \
                 id), which cannot be read: {other}",
                encoding.name()
            ),
        ),
    })?;
    let bad = |message: String| malformed(&meta_path, encoding, None, message);
    if object.size() > MAX_META_BYTES {
        return Err(bad(format!(
            "{} bytes is not a meta.json (at most {MAX_META_BYTES})",
            object.size()
        )));
    }
    let text = object.read_range(0..object.size())?;
    let meta: BinMeta = serde_json::from_slice(&text)
        .map_err(|e| bad(format!("not a token corpus description: {e}")))?;
    // Our own `.bin` files hold 2- or 4-byte ids; OLMo's arrays any integer type.
    let ids = IdType::parse(&meta.dtype)
        .filter(|ids| encoding != Encoding::Bin || matches!(*ids, IdType::U16 | IdType::U32));
    let Some(ids) = ids else {
        let expected = if encoding == Encoding::Bin {
            "uint16 or uint32"
        } else {
            "an integer type (uint16, int32, ...)"
        };
        return Err(bad(format!(
            "dtype '{}' is not a token id type; expected {expected}",
            meta.dtype
        )));
    };
    Ok((ids, meta.eos_id))
}

/// Scans a flat stream of ids (from byte `offset`) for `eos`, handing each document it closes
/// (and the tail after the last) to `documents`.
pub(super) fn scan_ids(
    object: &Object,
    (ids, offset, encoding): (IdType, u64, Encoding),
    eos: u64,
    documents: &mut Documents,
    max_plan: u64,
    too_large: &dyn Fn(u64) -> Error,
) -> Result<()> {
    let path = object.uri();
    let width = ids.width;
    let eos = i128::from(eos);
    let mut reader = object.reader(offset)?;
    let mut buf = vec![0u8; SCAN_BYTES];
    let mut filled = 0usize;
    let mut token = 0u64;
    let mut doc_start = 0u64;
    loop {
        let n = reader
            .read(&mut buf[filled..])
            .map_err(|e| crate::storage::from_io(e, |e| Error::io(path, e)))?;
        filled += n;
        let whole = filled - filled % width as usize;
        for id in buf[..whole].chunks_exact(width as usize) {
            if ids.get(id) == eos {
                documents.push(doc_start, token + 1 - doc_start)?;
                doc_start = token + 1;
            }
            token += 1;
        }
        if documents.bytes() > max_plan {
            return Err(too_large(max_plan));
        }
        buf.copy_within(whole..filled, 0);
        filled -= whole;
        if n == 0 {
            break;
        }
    }
    if offset + token * width != object.size() {
        return Err(malformed(
            path,
            encoding,
            None,
            format!(
                "read {} bytes of a {}-byte shard",
                offset + token * width + filled as u64,
                object.size()
            ),
        ));
    }
    if doc_start < token {
        documents.push(doc_start, token - doc_start)?;
    }
    Ok(())
}
