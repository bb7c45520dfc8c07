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
//! - `highway128-sampled`: a file of another format over [`WHOLE_UP_TO`]: its size, its first
//!   and last [`EDGE`] bytes and [`SAMPLES`] runs of [`SAMPLE`] bytes spread evenly between
//!   them, 384 KiB in all whatever the file's size. The edges hold what these formats carry
//!   about their content: an MDS shard's sample offsets, a `NumPy` header, an Arrow IPC or
//!   `ArrayRecord` footer, a gzip member's CRC-32 and size. A rewrite of the same size that
//!   changes no sampled byte (an edit confined to a few records in the middle) keeps it: the
//!   rule trades that for not reading every byte of a corpus on every cold node.
//! - `highway128`: every byte of the file, for smaller files of those formats, and for a file a
//!   checkpoint of an earlier release pinned so (it is compared as it was pinned).
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

/// Files of the formats without a footer or index kind up to this size are hashed whole; larger
/// ones are sampled (a whole read of a small file costs about what sampling it does).
const WHOLE_UP_TO: u64 = 1 << 20;

/// Bytes a sampled identity hashes at each end of the file.
const EDGE: u64 = 64 << 10;

/// Runs a sampled identity hashes between the ends, and their length.
const SAMPLES: u64 = 64;
const SAMPLE: u64 = 4 << 10;

/// The kind of the whole-file identity, which checkpoints of earlier releases pinned for every
/// format but Parquet and Megatron.
const WHOLE: &str = "highway128";

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

/// The kind of a content identity (`parquet-footer` of `content:parquet-footer:<hex>`).
fn kind_of(identity: &str) -> Option<&str> {
    identity.strip_prefix(PREFIX)?.split(':').next()
}

/// The content identity of the local file `object` (None for a remote object, whose `ETag`
/// identifies it), from the cache where it knows the file, else computed and stored there.
/// `pinned` is the identity a checkpoint or listing holds the file to, if any: a file pinned
/// whole by an earlier release is hashed whole again, so that its checkpoint still resumes.
pub fn of(
    object: &Object,
    encoding: Encoding,
    cache: Option<&InspectCache>,
    pinned: Option<&str>,
) -> Result<Option<String>> {
    let Some(ctime) = object.local_ctime_ns()? else {
        return Ok(None);
    };
    let pin = object.pin();
    let path = object.uri();
    let whole_wanted = pinned.and_then(kind_of) == Some(WHOLE);
    let cache = cache.filter(|_| object.size() > UNCACHED_BYTES);
    if let Some(found) = cache.and_then(|c| c.lookup_content(path, encoding, &pin, ctime)) {
        if is_content(&found) && (!whole_wanted || kind_of(&found) == Some(WHOLE)) {
            return Ok(Some(found));
        }
    }
    let identity = compute(object, encoding, whole_wanted)?;
    // The cache keeps the identity an open computes; one computed only to compare with an old
    // checkpoint is not kept in its place.
    if let Some(cache) = cache.filter(|_| !whole_wanted) {
        cache.store_content(path, encoding, &pin, ctime, &identity);
    }
    Ok(Some(identity))
}

fn compute(object: &Object, encoding: Encoding, whole_wanted: bool) -> Result<String> {
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
        _ if whole_wanted || size <= WHOLE_UP_TO => whole(object, 0..size, &mut hasher)?,
        _ => sampled(object, &mut hasher)?,
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

/// Hashes the ends of the file and [`SAMPLES`] runs spread evenly between them (a file over
/// [`WHOLE_UP_TO`], so the runs never overlap the ends), and names the kind.
fn sampled(object: &Object, hasher: &mut HighwayHasher) -> Result<&'static str> {
    let size = object.size();
    let inner = size - 2 * EDGE - SAMPLE;
    let mut buf = Vec::new();
    let runs = std::iter::once((0, EDGE))
        .chain((0..SAMPLES).map(|k| (EDGE + inner / (SAMPLES - 1) * k, SAMPLE)))
        .chain(std::iter::once((size - EDGE, EDGE)));
    for (start, len) in runs {
        object.cancel().check(object.uri())?;
        object.read_range_into(start..start + len, &mut buf)?;
        hasher.append(&buf);
    }
    Ok("highway128-sampled")
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
    Ok(WHOLE)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::storage::Storage;

    fn whole_hash(bytes: &[u8]) -> String {
        let mut hasher = HighwayHasher::new(KEY);
        hasher.append(&(bytes.len() as u64).to_le_bytes());
        hasher.append(bytes);
        let [high, low] = hasher.finalize128();
        format!("{PREFIX}{WHOLE}:{high:016x}{low:016x}")
    }

    #[test]
    fn a_large_file_is_sampled_unless_pinned_whole_by_an_earlier_release() {
        let path = std::env::temp_dir().join(format!("o41-identity-{}.jsonl", std::process::id()));
        let bytes: Vec<u8> = (0..3u32 << 20).map(|i| (i % 251) as u8).collect();
        std::fs::write(&path, &bytes).unwrap();
        let object = Storage::local().open(path.to_str().unwrap()).unwrap();

        let sampled = of(&object, Encoding::Jsonl, None, None).unwrap().unwrap();
        assert_eq!(kind_of(&sampled), Some("highway128-sampled"));
        // A checkpoint that pinned the file whole is compared whole, and a sampled pin as is.
        let old = whole_hash(&bytes);
        assert_eq!(
            of(&object, Encoding::Jsonl, None, Some(&old)).unwrap(),
            Some(old)
        );
        let again = of(&object, Encoding::Jsonl, None, Some(&sampled)).unwrap();
        assert_eq!(again, Some(sampled));
        std::fs::remove_file(path).unwrap();
    }

    #[test]
    fn a_small_file_is_hashed_whole() {
        let path =
            std::env::temp_dir().join(format!("o41-identity-small-{}.jsonl", std::process::id()));
        let bytes = b"{\"v\": 1}\n".repeat(1000);
        std::fs::write(&path, &bytes).unwrap();
        let object = Storage::local().open(path.to_str().unwrap()).unwrap();
        let identity = of(&object, Encoding::Jsonl, None, None).unwrap();
        assert_eq!(identity, Some(whole_hash(&bytes)));
        std::fs::remove_file(path).unwrap();
    }
}
