//! Shard encodings by name: the ground floor that configs, manifests and the readers and writers
//! under `formats/` all refer to.

use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};

/// How a shard's records are stored.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum Encoding {
    /// Apache Parquet.
    #[serde(rename = "parquet")]
    Parquet,
    /// JSON Lines, one object per line.
    #[serde(rename = "jsonl")]
    Jsonl,
    /// Gzip-compressed JSON Lines.
    #[serde(rename = "jsonl.gz")]
    JsonlGz,
    /// Framed `MessagePack`: a little-endian u32 length before each map (`docs/formats.md`).
    #[serde(rename = "msgpack")]
    Msgpack,
    /// A flat stream of little-endian `uint16` or `uint32` token ids, described by a sibling
    /// `meta.json` (`docs/formats.md`); read only by stages that pack or window tokens.
    #[serde(rename = "bin")]
    Bin,
}

impl Encoding {
    /// Every encoding, for messages.
    pub const ALL: [Encoding; 5] = [
        Encoding::Parquet,
        Encoding::Jsonl,
        Encoding::JsonlGz,
        Encoding::Msgpack,
        Encoding::Bin,
    ];

    /// The name used in configs and manifests.
    pub fn name(self) -> &'static str {
        match self {
            Encoding::Parquet => "parquet",
            Encoding::Jsonl => "jsonl",
            Encoding::JsonlGz => "jsonl.gz",
            Encoding::Msgpack => "msgpack",
            Encoding::Bin => "bin",
        }
    }

    /// Parses a configured encoding name; `option` names it in the error.
    pub fn parse(name: &str, option: &str) -> Result<Self> {
        Self::ALL
            .into_iter()
            .find(|e| e.name() == name)
            .ok_or_else(|| {
                Error::config(
                    option,
                    format!(
                        "unknown encoding '{name}'; expected one of {}",
                        Self::names()
                    ),
                )
            })
    }

    /// Infers the encoding from a file name's suffix.
    pub fn from_path(path: &str, option: &str) -> Result<Self> {
        // Longest suffix first so `.jsonl.gz` is not taken for something else.
        let by_suffix = [
            (".jsonl.gz", Encoding::JsonlGz),
            (".jsonl", Encoding::Jsonl),
            (".parquet", Encoding::Parquet),
            (".msgpack", Encoding::Msgpack),
            (".bin", Encoding::Bin),
        ];
        by_suffix
            .iter()
            .find(|(suffix, _)| path.ends_with(suffix))
            .map(|(_, e)| *e)
            .ok_or_else(|| {
                Error::config(
                    option,
                    format!(
                        "cannot infer the encoding of '{path}' from its suffix; set encoding to one of {}",
                        Self::names()
                    ),
                )
            })
    }

    fn names() -> String {
        Self::ALL
            .iter()
            .map(|e| e.name())
            .collect::<Vec<_>>()
            .join(", ")
    }
}
