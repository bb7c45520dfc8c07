//! Shard encodings by name: the ground floor that configs, manifests and the readers and writers
//! under `formats/` all refer to.

use serde::{Deserialize, Deserializer, Serialize, Serializer};

use crate::error::{Error, Result};

/// What an `ArrayRecord` file's records hold. The file does not say, so the encoding a source
/// names does (`array_record:json`, `array_record:uint32`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum RecordPayload {
    /// A UTF-8 JSON object per record.
    Json,
    /// A `MessagePack` map per record.
    Msgpack,
    /// Little-endian integer token ids of `width` bytes (1, 2, 4 or 8): each record is one
    /// token document, read as a record with the single field `tokens`.
    Ids {
        /// Bytes per id.
        width: u8,
        /// Whether ids are two's-complement signed.
        signed: bool,
    },
}

/// How a shard's records are stored. Configs and manifests name an encoding by its
/// [`name`](Encoding::name).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Encoding {
    /// Apache Parquet.
    Parquet,
    /// JSON Lines, one object per line.
    Jsonl,
    /// Gzip-compressed JSON Lines.
    JsonlGz,
    /// Framed `MessagePack`: a little-endian u32 length before each map (`docs/formats.md`).
    Msgpack,
    /// A flat stream of little-endian `uint16` or `uint32` token ids, described by a sibling
    /// `meta.json` (`docs/formats.md`); read only by stages that pack or window tokens.
    Bin,
    /// A Megatron-LM / `NeMo` indexed dataset: token sequences in a `.bin`, their lengths,
    /// offsets and documents in the `.idx` beside it (`docs/corpora.md`). The shard's location
    /// is the `.bin`; a configured `.idx` or common prefix is resolved to it.
    Megatron,
    /// A `NumPy` array of token ids: a `.npy` file with its header, or a headerless array
    /// (the layout of `OLMo`) described by a sibling `meta.json` as a `.bin` is.
    Npy,
    /// An Arrow IPC file, in the streaming or the file format: what Hugging Face `datasets`
    /// writes. A `save_to_disk` directory is resolved to the files its `state.json` lists.
    Arrow,
    /// A `MosaicML` MDS shard (`streaming`'s `MDSWriter`), raw or compressed whole, described by
    /// the `index.json` beside it. A dataset directory is resolved to the shards it lists.
    Mds,
    /// An `ArrayRecord` file (grain, `MaxText`): Riegeli simple chunks located by the footer
    /// `ArrayRecordWriter` appends, each record holding the payload the name gives
    /// (`docs/corpora.md`).
    ArrayRecord(RecordPayload),
}

/// The `ArrayRecord` encodings, one per payload, in [`Encoding::ALL`]'s order.
const ARRAY_RECORD: [(RecordPayload, &str); 10] = [
    (RecordPayload::Json, "array_record:json"),
    (RecordPayload::Msgpack, "array_record:msgpack"),
    (ids(1, false), "array_record:uint8"),
    (ids(1, true), "array_record:int8"),
    (ids(2, false), "array_record:uint16"),
    (ids(2, true), "array_record:int16"),
    (ids(4, false), "array_record:uint32"),
    (ids(4, true), "array_record:int32"),
    (ids(8, false), "array_record:uint64"),
    (ids(8, true), "array_record:int64"),
];

const fn ids(width: u8, signed: bool) -> RecordPayload {
    RecordPayload::Ids { width, signed }
}

impl Encoding {
    /// Every encoding, for messages.
    pub const ALL: [Encoding; 19] = [
        Encoding::Parquet,
        Encoding::Jsonl,
        Encoding::JsonlGz,
        Encoding::Msgpack,
        Encoding::Bin,
        Encoding::Megatron,
        Encoding::Npy,
        Encoding::Arrow,
        Encoding::Mds,
        Encoding::ArrayRecord(ARRAY_RECORD[0].0),
        Encoding::ArrayRecord(ARRAY_RECORD[1].0),
        Encoding::ArrayRecord(ARRAY_RECORD[2].0),
        Encoding::ArrayRecord(ARRAY_RECORD[3].0),
        Encoding::ArrayRecord(ARRAY_RECORD[4].0),
        Encoding::ArrayRecord(ARRAY_RECORD[5].0),
        Encoding::ArrayRecord(ARRAY_RECORD[6].0),
        Encoding::ArrayRecord(ARRAY_RECORD[7].0),
        Encoding::ArrayRecord(ARRAY_RECORD[8].0),
        Encoding::ArrayRecord(ARRAY_RECORD[9].0),
    ];

    /// File name suffixes and the encoding each names, longest first so that `.jsonl.gz` is
    /// not taken for something shorter: the one table every layer infers encodings from (the
    /// Python face reads it through `_core.encoding_suffixes()`). An `ArrayRecord` file's suffix
    /// is not here: its name does not say what its records hold.
    pub const SUFFIXES: [(&'static str, Encoding); 15] = [
        (".mds.snappy", Encoding::Mds),
        (".jsonl.gz", Encoding::JsonlGz),
        (".mds.zstd", Encoding::Mds),
        // Dolma and other text corpora name their gzipped JSON Lines `.json.gz`.
        (".json.gz", Encoding::JsonlGz),
        (".parquet", Encoding::Parquet),
        (".msgpack", Encoding::Msgpack),
        (".mds.bz2", Encoding::Mds),
        (".mds.gz", Encoding::Mds),
        (".mds.br", Encoding::Mds),
        (".jsonl", Encoding::Jsonl),
        (".arrow", Encoding::Arrow),
        (".bin", Encoding::Bin),
        // A `.idx` is only ever Megatron's index; its `.bin` is named by `encoding`.
        (".idx", Encoding::Megatron),
        (".npy", Encoding::Npy),
        (".mds", Encoding::Mds),
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
            Encoding::ArrayRecord(payload) => ARRAY_RECORD
                .iter()
                .find(|(p, _)| *p == payload)
                .map_or("array_record", |(_, name)| name),
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
        // An ArrayRecord file does not say what its records hold; TFDS and grain name sharded
        // files `name.array_record-00000-of-00008`.
        if path.ends_with(".array_record") || path.contains(".array_record-") {
            return Err(Error::config(
                option,
                format!(
                    "{path} is an ArrayRecord file, whose records' payload its name does not \
                     give; set encoding to array_record:json, array_record:msgpack or \
                     array_record:<id dtype> (uint16, int32, ...)"
                ),
            ));
        }
        Self::SUFFIXES
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

impl Serialize for Encoding {
    fn serialize<S: Serializer>(&self, serializer: S) -> std::result::Result<S::Ok, S::Error> {
        serializer.serialize_str(self.name())
    }
}

impl<'de> Deserialize<'de> for Encoding {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> std::result::Result<Self, D::Error> {
        let name = std::borrow::Cow::<str>::deserialize(deserializer)?;
        Encoding::ALL
            .into_iter()
            .find(|e| e.name() == name)
            .ok_or_else(|| {
                serde::de::Error::custom(format!(
                    "unknown encoding '{name}'; expected one of {}",
                    Encoding::names()
                ))
            })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn suffixes_run_longest_first_so_none_hides_a_longer_one() {
        for (i, (suffix, _)) in Encoding::SUFFIXES.iter().enumerate() {
            for (later, _) in &Encoding::SUFFIXES[i + 1..] {
                assert!(
                    !later.ends_with(suffix),
                    "{suffix} comes before {later}, which ends with it"
                );
            }
        }
    }

    #[test]
    fn every_name_parses_to_its_encoding_and_serialises_as_itself() {
        for encoding in Encoding::ALL {
            assert_eq!(Encoding::parse(encoding.name(), "x").unwrap(), encoding);
            let json = serde_json::to_string(&encoding).unwrap();
            assert_eq!(json, format!("\"{}\"", encoding.name()));
            assert_eq!(serde_json::from_str::<Encoding>(&json).unwrap(), encoding);
        }
        assert!(serde_json::from_str::<Encoding>("\"array_record\"").is_err());
    }

    #[test]
    fn file_names_give_their_encoding() {
        for (name, encoding) in [
            ("a.jsonl.gz", Encoding::JsonlGz),
            ("dolma/v1/c4-0000.json.gz", Encoding::JsonlGz),
            ("a.jsonl", Encoding::Jsonl),
            ("a.parquet", Encoding::Parquet),
            ("a.mds.zstd", Encoding::Mds),
        ] {
            assert_eq!(
                Encoding::from_path(name, "files[0]").unwrap(),
                encoding,
                "{name}"
            );
        }
        assert!(
            Encoding::from_path("a.json", "files[0]").is_err(),
            "a JSON document is not lines"
        );
    }

    #[test]
    fn an_array_record_file_name_asks_for_its_payload() {
        for name in ["a.array_record", "train.array_record-00001-of-00004"] {
            let e = Encoding::from_path(name, "files[0]")
                .unwrap_err()
                .to_string();
            assert!(e.contains("array_record:json"), "{e}");
        }
    }
}
