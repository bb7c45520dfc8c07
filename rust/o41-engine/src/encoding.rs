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
    /// A Megatron-LM / `NeMo` indexed dataset: token sequences in a `.bin`, their lengths,
    /// offsets and documents in the `.idx` beside it (`docs/corpora.md`). The shard's location
    /// is the `.bin`; a configured `.idx` or common prefix is resolved to it.
    #[serde(rename = "megatron")]
    Megatron,
    /// A `NumPy` array of token ids: a `.npy` file with its header, or a headerless array
    /// (the layout of `OLMo`) described by a sibling `meta.json` as a `.bin` is.
    #[serde(rename = "npy")]
    Npy,
    /// An Arrow IPC file, in the streaming or the file format: what Hugging Face `datasets`
    /// writes. A `save_to_disk` directory is resolved to the files its `state.json` lists.
    #[serde(rename = "arrow")]
    Arrow,
    /// A `MosaicML` MDS shard (`streaming`'s `MDSWriter`), raw or compressed whole, described by
    /// the `index.json` beside it. A dataset directory is resolved to the shards it lists.
    #[serde(rename = "mds")]
    Mds,
}

impl Encoding {
    /// Every encoding, for messages.
    pub const ALL: [Encoding; 9] = [
        Encoding::Parquet,
        Encoding::Jsonl,
        Encoding::JsonlGz,
        Encoding::Msgpack,
        Encoding::Bin,
        Encoding::Megatron,
        Encoding::Npy,
        Encoding::Arrow,
        Encoding::Mds,
    ];

    /// The name used in configs and manifests.
    pub fn name(self) -> &'static str {
        match self {
            Encoding::Parquet => "parquet",
            Encoding::Jsonl => "jsonl",
            Encoding::JsonlGz => "jsonl.gz",
            Encoding::Msgpack => "msgpack",
            Encoding::Bin => "bin",
            Encoding::Megatron => "megatron",
            Encoding::Npy => "npy",
            Encoding::Arrow => "arrow",
            Encoding::Mds => "mds",
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
            // A `.idx` is only ever Megatron's index; its `.bin` is named by `encoding`.
            (".idx", Encoding::Megatron),
            (".npy", Encoding::Npy),
            (".arrow", Encoding::Arrow),
            (".mds", Encoding::Mds),
            (".mds.zstd", Encoding::Mds),
            (".mds.gz", Encoding::Mds),
            (".mds.br", Encoding::Mds),
            (".mds.snappy", Encoding::Mds),
            (".mds.bz2", Encoding::Mds),
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

    /// The location a shard of this encoding is known by, given the one configured: a
    /// Megatron dataset configured by its `.idx` or its common prefix is its `.bin` (the file
    /// its reads, size and version belong to); every other encoding is its file.
    pub fn shard_location(self, configured: &str) -> String {
        // Megatron's own names are lower case (`get_bin_path`, `get_idx_path`).
        if self != Encoding::Megatron || configured.strip_suffix(".bin").is_some() {
            return configured.to_owned();
        }
        let prefix = configured.strip_suffix(".idx").unwrap_or(configured);
        format!("{prefix}.bin")
    }

    fn names() -> String {
        Self::ALL
            .iter()
            .map(|e| e.name())
            .collect::<Vec<_>>()
            .join(", ")
    }
}
