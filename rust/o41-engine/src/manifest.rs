//! The data manifest format, version 1 (`docs/manifest.md`): splits of shards in root order, each
//! shard with its location, row count, byte size, checksum, curriculum stage and metadata, and
//! named curriculum selections of shards. Locations are relative to the manifest's directory
//! unless absolute, so a copied dataset directory stays valid.

use std::borrow::Cow;
use std::collections::{BTreeMap, HashSet};
use std::path::Path;

use serde::{Deserialize, Serialize};

use crate::encoding::Encoding;
use crate::error::{Error, Result};
use crate::fnv::FnvBuild;
use crate::storage::{self, Storage};

/// The value of the `format` field.
pub const MANIFEST_FORMAT: &str = "o41-data-manifest";
/// The version this release reads and writes.
pub const MANIFEST_VERSION: u32 = 1;

/// The largest manifest read, in bytes: ten times a million-shard one (about 100 MB). A larger
/// file is refused before it is read into memory.
pub const MAX_MANIFEST_BYTES: u64 = 1 << 30;

/// One physical shard of a split. Its strings borrow from the document where they can: open
/// parses a million-shard manifest without an allocation per shard.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ManifestShard<'a> {
    /// Where the shard is, relative to the manifest's directory unless absolute.
    #[serde(borrow)]
    pub location: Cow<'a, str>,
    /// Records in the shard.
    pub rows: u64,
    /// Size of the shard object in bytes.
    pub bytes: u64,
    /// `algorithm:hex` checksum of the shard object.
    #[serde(borrow)]
    pub checksum: Cow<'a, str>,
    /// Curriculum stage the shard was saved under, if any.
    #[serde(default)]
    pub curriculum_stage: Option<String>,
    /// Free-form metadata of the shard.
    #[serde(default)]
    pub metadata: serde_json::Map<String, serde_json::Value>,
}

/// A named, ordered selection of a split's shards.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Curriculum {
    /// Selection name.
    pub name: String,
    /// Locations of the selected shards, in reading order.
    pub shards: Vec<String>,
    /// Selector metadata.
    #[serde(default)]
    pub metadata: serde_json::Map<String, serde_json::Value>,
}

/// One split: its shards in root order and its curriculum selections.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Split<'a> {
    /// Every physical shard once, in root order.
    #[serde(borrow)]
    pub shards: Vec<ManifestShard<'a>>,
    /// Named selections.
    #[serde(default)]
    pub curricula: Vec<Curriculum>,
}

/// A data manifest.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Manifest<'a> {
    /// Always [`MANIFEST_FORMAT`].
    pub format: String,
    /// Document version.
    pub version: u32,
    /// Encoding of every shard.
    pub data_format: Encoding,
    /// Splits by name.
    #[serde(borrow)]
    pub splits: BTreeMap<String, Split<'a>>,
}

/// Refuses a document whose `format` is not a data manifest's or whose `version` this release
/// does not read.
fn check_header(format: Option<&str>, version: Option<u64>, uri: &str) -> Result<()> {
    if format != Some(MANIFEST_FORMAT) {
        return Err(invalid(
            uri,
            format!("not a data manifest (no \"format\": \"{MANIFEST_FORMAT}\")"),
        ));
    }
    match version {
        Some(v) if v == u64::from(MANIFEST_VERSION) => Ok(()),
        other => Err(invalid(
            uri,
            format!("version {other:?} is not supported (this release reads version {MANIFEST_VERSION})"),
        )),
    }
}

fn invalid(uri: &str, message: impl std::fmt::Display) -> Error {
    Error::Format {
        path: uri.to_owned(),
        encoding: "data manifest",
        row: None,
        message: message.to_string(),
    }
}

impl<'a> Manifest<'a> {
    /// Reads the document at `uri`, a local path or an `s3://` location, for
    /// [`Manifest::from_json`] (which borrows from it).
    pub fn read(uri: &str, storage: &Storage) -> Result<String> {
        let object = storage.open(uri)?;
        if object.size() > MAX_MANIFEST_BYTES {
            return Err(invalid(
                uri,
                format!(
                    "{} bytes is over the {MAX_MANIFEST_BYTES}-byte limit of a data manifest \
                     (ten times a million-shard one); it is not read",
                    object.size()
                ),
            ));
        }
        // The size just seen, not whatever the file has grown to since.
        let bytes = object.read_range(0..object.size())?;
        String::from_utf8(Vec::from(bytes)).map_err(|e| invalid(uri, e))
    }

    /// Parses and checks a manifest document; `uri` names it in errors.
    pub fn from_json(text: &'a str, uri: &str) -> Result<Self> {
        // One pass straight into the types (a million-shard manifest is 100 MB). Only a document
        // that does not parse is read again for its header, so a file that is not a manifest, or
        // one of another version, is reported as that rather than as its first unknown field.
        match serde_json::from_str::<Manifest>(text) {
            Ok(manifest) => {
                check_header(
                    Some(&manifest.format),
                    Some(u64::from(manifest.version)),
                    uri,
                )?;
                manifest.validate(uri)?;
                Ok(manifest)
            }
            Err(parse) => {
                #[derive(Deserialize)]
                struct Header {
                    format: Option<serde_json::Value>,
                    version: Option<serde_json::Value>,
                }
                let header: Header = serde_json::from_str(text).map_err(|e| invalid(uri, e))?;
                let format = header.format.as_ref().and_then(serde_json::Value::as_str);
                let version = header.version.as_ref().and_then(serde_json::Value::as_u64);
                check_header(format, version, uri)?;
                Err(invalid(uri, parse))
            }
        }
    }

    /// The manifest as JSON.
    pub fn to_json(&self) -> String {
        serde_json::to_string_pretty(self).expect("a manifest always serialises")
    }

    /// Checks the rules a manifest keeps: every shard once per split, selections of known
    /// shards without repeats, unique selection names.
    pub fn validate(&self, uri: &str) -> Result<()> {
        for (name, split) in &self.splits {
            let listed: Vec<&str> = split.shards.iter().map(|s| &*s.location).collect();
            if let Some(location) = first_repeat(&listed) {
                return Err(invalid(
                    uri,
                    format!("split '{name}' lists shard '{location}' twice"),
                ));
            }
            check_aliases(uri, name, &listed)?;
            let locations: HashSet<&str, FnvBuild> = if split.curricula.is_empty() {
                HashSet::default()
            } else {
                listed.iter().copied().collect()
            };
            let mut names = HashSet::new();
            for curriculum in &split.curricula {
                if !names.insert(curriculum.name.as_str()) {
                    return Err(invalid(
                        uri,
                        format!(
                            "split '{name}' defines curriculum '{}' twice",
                            curriculum.name
                        ),
                    ));
                }
                let mut seen = HashSet::new();
                for location in &curriculum.shards {
                    if !locations.contains(location.as_str()) {
                        return Err(invalid(
                            uri,
                            format!("curriculum '{}' of split '{name}' selects '{location}', which the split does not list", curriculum.name),
                        ));
                    }
                    if !seen.insert(location.as_str()) {
                        return Err(invalid(
                            uri,
                            format!(
                                "curriculum '{}' of split '{name}' selects '{location}' twice",
                                curriculum.name
                            ),
                        ));
                    }
                }
            }
        }
        Ok(())
    }

    /// The shards a stream reads from `split`: with `stages`, the union of those curriculum
    /// selections or curriculum stages, in the listed order (each shard once); otherwise the
    /// split's root order. `option` names the source in errors.
    pub fn select(
        &self,
        split: &str,
        stages: Option<&[String]>,
        option: &str,
    ) -> Result<Vec<&ManifestShard<'a>>> {
        let Some(found) = self.splits.get(split) else {
            let names: Vec<&str> = self.splits.keys().map(String::as_str).collect();
            return Err(Error::config(
                format!("{option}.split"),
                format!(
                    "the manifest has no split '{split}'; its splits are: {}",
                    names.join(", ")
                ),
            ));
        };
        let Some(stages) = stages else {
            return Ok(found.shards.iter().collect());
        };
        let by_location: BTreeMap<&str, &ManifestShard> =
            found.shards.iter().map(|s| (&*s.location, s)).collect();
        let mut chosen = Vec::new();
        let mut seen = HashSet::new();
        for stage in stages {
            let selected: Vec<&ManifestShard> =
                match found.curricula.iter().find(|c| &c.name == stage) {
                    Some(curriculum) => curriculum
                        .shards
                        .iter()
                        .map(|l| by_location[l.as_str()])
                        .collect(),
                    None => found
                        .shards
                        .iter()
                        .filter(|s| s.curriculum_stage.as_deref() == Some(stage.as_str()))
                        .collect(),
                };
            if selected.is_empty() {
                let mut known: Vec<&str> =
                    found.curricula.iter().map(|c| c.name.as_str()).collect();
                for shard in &found.shards {
                    if let Some(s) = shard.curriculum_stage.as_deref() {
                        if !known.contains(&s) {
                            known.push(s);
                        }
                    }
                }
                return Err(Error::config(
                    format!("{option}.curriculum_stages"),
                    format!(
                        "split '{split}' has no curriculum stage or selection '{stage}'; it has: {}",
                        known.join(", ")
                    ),
                ));
            }
            for shard in selected {
                if seen.insert(&*shard.location) {
                    chosen.push(shard);
                }
            }
        }
        Ok(chosen)
    }
}

/// Where a shard location of the manifest at `uri` points: an absolute path or `s3://`
/// location as it is, anything else relative to the manifest's directory, with `.` and `..`
/// resolved lexically (never above the root or the bucket).
pub fn shard_path(uri: &str, location: &str) -> String {
    ShardLocations::new(uri).path(location)
}

/// [`shard_path`] for many locations of one manifest: the manifest's directory is made
/// absolute once, not once per shard.
pub struct ShardLocations {
    /// The manifest's location, absolute.
    uri: String,
    /// Its directory, without the final `/`.
    dir_len: usize,
}

impl ShardLocations {
    /// Locations relative to the manifest at `uri`.
    pub fn new(uri: &str) -> Self {
        let uri = if storage::is_remote(uri) {
            uri.to_owned()
        } else {
            std::path::absolute(Path::new(uri))
                .map_or_else(|_| uri.to_owned(), |p| p.to_string_lossy().into_owned())
        };
        let dir_len = uri.rfind('/').unwrap_or(0);
        ShardLocations { uri, dir_len }
    }

    /// Where `location` points.
    pub fn path(&self, location: &str) -> String {
        if storage::is_remote(location) {
            return location.to_owned();
        }
        if Path::new(location).is_absolute() {
            return storage::normalize(location);
        }
        let plain = is_plain(location);
        if plain && self.uri.contains('/') {
            // What `sibling` gives when nothing is to be resolved, without splitting.
            let dir = &self.uri[..self.dir_len];
            let mut path = String::with_capacity(dir.len() + 1 + location.len());
            path.push_str(dir);
            path.push('/');
            path.push_str(location);
            return path;
        }
        storage::sibling(&self.uri, location)
    }
}

/// Refuses two spellings of one shard (`a.msgpack`, `./a.msgpack`, `sub/../a.msgpack`, its
/// absolute path): every row would be delivered once per spelling. Distinct plain relative
/// locations cannot alias, so only a split with another kind resolves its locations.
fn check_aliases(uri: &str, split: &str, listed: &[&str]) -> Result<()> {
    if listed
        .iter()
        .all(|l| !storage::is_remote(l) && !Path::new(l).is_absolute() && is_plain(l))
    {
        return Ok(());
    }
    let places = ShardLocations::new(uri);
    let resolved: Vec<String> = listed.iter().map(|l| places.path(l)).collect();
    let paths: Vec<&str> = resolved.iter().map(String::as_str).collect();
    let Some(path) = first_repeat(&paths) else {
        return Ok(());
    };
    let mut spellings = listed
        .iter()
        .zip(&paths)
        .filter(|(_, p)| **p == path)
        .map(|(l, _)| *l);
    let (first, second) = (
        spellings.next().unwrap_or(path),
        spellings.next().unwrap_or(path),
    );
    Err(invalid(
        uri,
        format!(
            "split '{split}' lists one shard twice, as '{first}' and '{second}' (both {path}); \
             every row would be read once per spelling"
        ),
    ))
}

/// The item of `items` met a second time first, if any. Sorts cheap hashes rather than filling
/// a hash set: a million-shard split's set costs a cache miss per shard, a sort of hashes does
/// not. Items whose hashes collide are told apart by sorting them, so colliding keys cost
/// `n log n`, never `n^2`.
fn first_repeat<'s>(items: &[&'s str]) -> Option<&'s str> {
    let mut keyed: Vec<(u64, usize)> = items
        .iter()
        .enumerate()
        .map(|(i, item)| (word_hash(item.as_bytes()), i))
        .collect();
    keyed.sort_unstable();
    let mut first: Option<usize> = None;
    for run in keyed.chunk_by_mut(|a, b| a.0 == b.0) {
        if run.len() < 2 {
            continue;
        }
        run.sort_unstable_by_key(|&(_, i)| (items[i], i));
        for pair in run.windows(2) {
            if items[pair[0].1] == items[pair[1].1] && first.is_none_or(|f| pair[1].1 < f) {
                first = Some(pair[1].1);
            }
        }
    }
    first.map(|i| items[i])
}

/// A fast, non-cryptographic hash of `bytes`, eight at a time (`FxHash`'s step).
fn word_hash(bytes: &[u8]) -> u64 {
    const K: u64 = 0x517c_c1b7_2722_0a95;
    let step = |h: u64, word: u64| (h.rotate_left(5) ^ word).wrapping_mul(K);
    let mut words = bytes.chunks_exact(8);
    let mut h = bytes.len() as u64;
    for word in &mut words {
        h = step(h, u64::from_le_bytes(word.try_into().expect("eight bytes")));
    }
    let rest = words.remainder();
    if !rest.is_empty() {
        let mut last = [0u8; 8];
        last[..rest.len()].copy_from_slice(rest);
        h = step(h, u64::from_le_bytes(last));
    }
    h
}

/// Whether `location` is relative and has no empty, `.` or `..` part: joined to a directory
/// as it is. One pass over the bytes (this runs once per shard of a manifest).
fn is_plain(location: &str) -> bool {
    location
        .as_bytes()
        .split(|&b| b == b'/')
        .all(|part| !matches!(part, b"" | b"." | b".."))
}

/// What a manifest lists for a shard another tool wrote: its location (a Megatron dataset
/// named by its `.idx` or prefix is listed by its `.bin`), its record count (a `NumPy` token
/// array's: its ids), its size and the SHA-256 of its bytes (`o41 manifest build`). The shard
/// is read whole, once; one that changes while it is being described fails closed rather than
/// being listed with mixed facts.
pub fn describe_shard(
    storage: &Storage,
    path: &str,
    encoding: Encoding,
) -> Result<(String, u64, u64, String)> {
    let location = crate::formats::format_of(encoding).shard_location(path);
    let path = location.as_str();
    let (rows, pin) = if crate::formats::format_of(encoding).reads_records() {
        let meta = crate::formats::inspect(
            storage,
            path,
            encoding,
            &crate::fields::Projection {
                columns: Vec::new(),
            },
            crate::formats::MAX_RECORD_BYTES,
            crate::formats::Checks::default(),
        )?;
        (meta.rows, meta.pin)
    } else {
        crate::formats::count_ids(storage, path, encoding)?
    };
    let sha256 = storage.content_sha256(path)?;
    let after = storage.open(path)?.pin();
    if after != pin {
        return Err(Error::Storage {
            path: path.to_owned(),
            message: "the object changed while it was being described; describe it again once \
                      it is no longer being written"
                .to_owned(),
        });
    }
    Ok((location, rows, pin.size, sha256))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn locations_borrow_from_the_document_unless_escaped() {
        let text = r#"{"format": "o41-data-manifest", "version": 1, "data_format": "parquet",
            "splits": {"train": {"shards": [
                {"location": "plain.parquet", "rows": 1, "bytes": 2, "checksum": "none:0"},
                {"location": "caf\u00e9\\x.parquet", "rows": 1, "bytes": 2, "checksum": "none:0"}
            ]}}}"#;
        let manifest = Manifest::from_json(text, "/m.json").unwrap();
        let shards = &manifest.splits["train"].shards;
        assert!(matches!(shards[0].location, Cow::Borrowed("plain.parquet")));
        assert_eq!(shards[1].location, "café\\x.parquet");
        assert!(matches!(shards[1].location, Cow::Owned(_)));
    }

    #[test]
    fn one_shard_under_two_spellings_is_refused() {
        let manifest = |locations: &[&str]| {
            let shards: Vec<String> = locations
                .iter()
                .map(|l| {
                    format!(r#"{{"location": "{l}", "rows": 1, "bytes": 2, "checksum": "none:0"}}"#)
                })
                .collect();
            format!(
                r#"{{"format": "o41-data-manifest", "version": 1, "data_format": "msgpack",
                "splits": {{"train": {{"shards": [{}]}}}}}}"#,
                shards.join(",")
            )
        };
        for alias in [
            "./a.msgpack",
            "/data/a.msgpack",
            "sub/../a.msgpack",
            "/data/./x/../a.msgpack",
        ] {
            let error = Manifest::from_json(
                &manifest(&["a.msgpack", "b.msgpack", alias]),
                "/data/m.json",
            )
            .unwrap_err()
            .to_string();
            assert!(
                error.contains(&format!(
                    "lists one shard twice, as 'a.msgpack' and '{alias}' (both /data/a.msgpack)"
                )),
                "{error}"
            );
        }
        // Distinct shards in any spelling pass.
        Manifest::from_json(
            &manifest(&["a.msgpack", "./b.msgpack", "/data/sub/a.msgpack"]),
            "/data/m.json",
        )
        .unwrap();
    }

    #[test]
    fn first_repeat_names_the_item_repeated_first() {
        assert_eq!(first_repeat(&[]), None);
        assert_eq!(first_repeat(&["a", "b", "c"]), None);
        assert_eq!(first_repeat(&["a", "b", "b", "a"]), Some("b"));
        assert_eq!(first_repeat(&["a", "b", "a", "b", "b"]), Some("a"));
        let many: Vec<String> = (0..10_000)
            .map(|k| format!("part-{k:05}.parquet"))
            .collect();
        let mut items: Vec<&str> = many.iter().map(String::as_str).collect();
        assert_eq!(first_repeat(&items), None);
        items.push("part-04321.parquet");
        items.push("part-00007.parquet");
        assert_eq!(first_repeat(&items), Some("part-04321.parquet"));
    }

    #[test]
    fn shard_locations_join_as_the_lexical_resolution_does() {
        let locations = [
            "part-0.parquet",
            "a/b/part-1.parquet",
            "./part-2.parquet",
            "a/../part-3.parquet",
            "../../../../up.parquet",
            "a//b.parquet",
            "a/./b/.",
            "/abs/part.parquet",
            "s3://other/part.parquet",
        ];
        for uri in [
            "s3://bucket/dir/m.json",
            "s3://bucket/m.json",
            "/data/set/m.json",
            "/m.json",
        ] {
            let joined = ShardLocations::new(uri);
            for location in locations {
                let expected = if Path::new(location).is_absolute() {
                    storage::normalize(location)
                } else {
                    storage::sibling(uri, location)
                };
                assert_eq!(joined.path(location), expected, "{uri} + {location}");
            }
        }
        let relative = ShardLocations::new("m.json").path("part.parquet");
        assert!(Path::new(&relative).is_absolute(), "{relative}");
    }
}
