//! The list lengths of a token column, kept in the inspection cache beside the shard's entry
//! (`<digest>.lengths`: a header naming the object and column, then the record count and one
//! little-endian `u32` per record), from which a packing or windows stage plans the shard
//! without decoding it.

use crate::encoding::Encoding;
use crate::inspect_cache::{CompanionKind, InspectCache};
use crate::storage::Pin;

/// The lengths file's kind; its magic carries the payload layout's version.
const LENGTHS: CompanionKind = CompanionKind {
    suffix: "lengths",
    magic: b"o41len01",
};

/// The lengths of the lists in column `column` of every record of the object `pin` describes,
/// if they were stored; None as well when reading them would take more than `max_bytes` (a
/// file is read whole and becomes `u64`s).
pub(super) fn lookup(
    cache: &InspectCache,
    (location, encoding, pin): (&str, Encoding, &Pin),
    column: &str,
    max_bytes: u64,
) -> Option<Vec<u64>> {
    let found =
        cache.lookup_companion(LENGTHS, (location, encoding, pin, column), max_bytes / 3)?;
    let (count, values) = found.payload.split_first_chunk::<8>()?;
    if Some(values.len() as u64) != u64::from_le_bytes(*count).checked_mul(4) {
        return None;
    }
    Some(
        values
            .chunks_exact(4)
            .map(|b| u64::from(u32::from_le_bytes([b[0], b[1], b[2], b[3]])))
            .collect(),
    )
}

/// Records the list lengths of column `column` of every record of the object `pin` describes.
/// Best effort, like every cache entry; lengths past `u32` are not stored. Public so that tests
/// can forge an entry (`tests/forged_inputs.rs`).
pub fn store(
    cache: &InspectCache,
    (location, encoding, pin): (&str, Encoding, &Pin),
    column: &str,
    lengths: &[u64],
) {
    let mut payload = Vec::with_capacity(8 + 4 * lengths.len());
    payload.extend_from_slice(&(lengths.len() as u64).to_le_bytes());
    for &len in lengths {
        let Ok(len) = u32::try_from(len) else {
            return;
        };
        payload.extend_from_slice(&len.to_le_bytes());
    }
    let _ = cache.store_companion(LENGTHS, (location, encoding, pin, column), &payload);
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::inspect_cache::tests::pin;

    #[test]
    fn list_lengths_are_found_only_for_the_same_object_and_column() {
        let dir = std::env::temp_dir().join(format!("o41-lengths-test-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let cache = InspectCache::new(&dir);
        let lengths = [3, 0, 70_000, 1];
        let (at, parquet) = ("/d/t.parquet", Encoding::Parquet);
        store(
            &cache,
            (at, parquet, &pin(10, "mtime:1")),
            "tokens",
            &lengths,
        );
        let find =
            |pin: &Pin, column: &str, max: u64| lookup(&cache, (at, parquet, pin), column, max);
        assert_eq!(
            find(&pin(10, "mtime:1"), "tokens", 1 << 20),
            Some(lengths.to_vec())
        );
        assert_eq!(find(&pin(10, "mtime:1"), "ids", 1 << 20), None);
        assert_eq!(find(&pin(10, "mtime:2"), "tokens", 1 << 20), None);
        // Within the memory it may take only.
        assert_eq!(find(&pin(10, "mtime:1"), "tokens", 16), None);
        // A truncated or foreign file is a miss.
        for sub in std::fs::read_dir(&dir).unwrap() {
            for file in std::fs::read_dir(sub.unwrap().path()).unwrap() {
                let path = file.unwrap().path();
                let bytes = std::fs::read(&path).unwrap();
                std::fs::write(&path, &bytes[..bytes.len() - 1]).unwrap();
            }
        }
        assert_eq!(find(&pin(10, "mtime:1"), "tokens", 1 << 20), None);
        // Lengths past u32 are not stored.
        store(
            &cache,
            (at, parquet, &pin(10, "mtime:3")),
            "tokens",
            &[1 << 33],
        );
        assert_eq!(find(&pin(10, "mtime:3"), "tokens", 1 << 20), None);
        let _ = std::fs::remove_dir_all(&dir);
        let _ = std::fs::remove_file(dir.with_extension("key"));
    }
}
