//! What identifies a local shard's content (`docs/checkpoint.md`, "Local shards").
//!
//! A local file's modification time is not its content: a plain `cp`, a re-download or a fresh
//! container image changes it and keeps the bytes. A resolved document therefore pins a local
//! shard by its content identity, `content:<kind>:<32 hex digits>`:
//!
//! - `parquet-footer`: the file's size and its footer (metadata, its length and the magic),
//!   which holds every column chunk's offset, size and statistics; open reads it anyway.
//! - `megatron-idx`: the `.bin`'s size and the whole `.idx` beside it (every sequence's length
//!   and offset, the document boundaries).
//! - `highway128`: every byte of the file, for the formats without a footer or index of their
//!   own.
//!
//! Each is a 128-bit `HighwayHash` under the fixed key [`KEY`]. An identity is computed once per
//! file and kept in the inspection cache, keyed by the file's size, times (status change
//! included) and inode, so a file rewritten behind the cache's back is hashed again.

use highway::{HighwayHash, HighwayHasher, Key};

use super::megatron;
use crate::encoding::Encoding;
use crate::error::{Error, Result};
use crate::inspect_cache::InspectCache;
use crate::storage::promise::CONTENT_PREFIX as PREFIX;
use crate::storage::Object;

/// The `HighwayHash` key of content identities: "o41 content id\0\0" read as four little-endian
/// `u64`s, twice. Fixed: identities computed on two hosts must agree.
const KEY: Key = Key([
    u64::from_le_bytes(*b"o41 cont"),
    u64::from_le_bytes(*b"ent id\0\0"),
    u64::from_le_bytes(*b"o41 cont"),
    u64::from_le_bytes(*b"ent id\0\0"),
]);

/// Bytes hashed per read of a whole file.
const CHUNK: u64 = 1 << 20;

/// Files up to this size are hashed whole at each open rather than kept in the cache: reading
/// them costs less than writing (and later reading) a cache file, and a first open of thousands
/// of small shards spent most of its time creating those files.
const UNCACHED_BYTES: u64 = 64 << 10;

/// A Parquet footer longer than this is hashed with the whole file instead of read in one
/// piece: the identity never allocates more than this for a hostile length.
const MAX_FOOTER: u64 = 64 << 20;

/// Whether `version` is a content identity (and not an `ETag` or an older release's `mtime:`).
pub fn is_content(version: &str) -> bool {
    version.starts_with(PREFIX)
}

/// The content identity of the local file `object` (None for a remote object, whose `ETag`
/// identifies it), from the cache where it knows the file, else computed and stored there.
pub fn of(
    object: &Object,
    encoding: Encoding,
    cache: Option<&InspectCache>,
) -> Result<Option<String>> {
    let Some(ctime) = object.local_ctime_ns()? else {
        return Ok(None);
    };
    let pin = object.pin();
    let path = object.uri();
    let cache = cache.filter(|_| object.size() > UNCACHED_BYTES);
    if let Some(found) = cache.and_then(|c| c.lookup_content(path, encoding, &pin, ctime)) {
        if is_content(&found) {
            return Ok(Some(found));
        }
    }
    let identity = compute(object, encoding)?;
    if let Some(cache) = cache {
        cache.store_content(path, encoding, &pin, ctime, &identity);
    }
    Ok(Some(identity))
}

fn compute(object: &Object, encoding: Encoding) -> Result<String> {
    let size = object.size();
    let mut hasher = HighwayHasher::new(KEY);
    hasher.append(&size.to_le_bytes());
    let kind = match encoding {
        Encoding::Parquet => match footer_len(object)? {
            Some(len) => {
                hasher.append(&object.read_range(size - len..size)?);
                "parquet-footer"
            }
            None => whole(object, 0..size, &mut hasher)?,
        },
        Encoding::Megatron => {
            let idx = megatron::idx_path(object.uri());
            let bytes = std::fs::read(&idx).map_err(|e| Error::io(&idx, e))?;
            hasher.append(&bytes);
            "megatron-idx"
        }
        _ => whole(object, 0..size, &mut hasher)?,
    };
    let [high, low] = hasher.finalize128();
    Ok(format!("{PREFIX}{kind}:{high:016x}{low:016x}"))
}

/// The length of a Parquet file's footer with its 8-byte trailer, where the trailer is sound
/// and the footer at most [`MAX_FOOTER`]; a malformed file is reported by its inspection, and
/// identified by all of its bytes until then.
fn footer_len(object: &Object) -> Result<Option<u64>> {
    let size = object.size();
    if size < 12 {
        return Ok(None);
    }
    let tail = object.read_range(size - 8..size)?;
    if &tail[4..] != b"PAR1" {
        return Ok(None);
    }
    let len = u64::from(u32::from_le_bytes([tail[0], tail[1], tail[2], tail[3]])) + 8;
    Ok((len <= size - 4 && len <= MAX_FOOTER).then_some(len))
}

/// Hashes the bytes of `range`, a chunk at a time, and names the kind.
fn whole(
    object: &Object,
    range: std::ops::Range<u64>,
    hasher: &mut HighwayHasher,
) -> Result<&'static str> {
    let mut buf = Vec::new();
    let mut at = range.start;
    while at < range.end {
        object.cancel().check(object.uri())?;
        let end = range.end.min(at + CHUNK);
        object.read_range_into(at..end, &mut buf)?;
        hasher.append(&buf);
        at = end;
    }
    Ok("highway128")
}
