//! The resolved document: every shard and its row count pinned, what a stream opens and what a
//! checkpoint stores. It carries a version and no credentials.

use std::borrow::Cow;
use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::schema::{FieldSpec, SourceSpec, Stage};
use crate::encoding::Encoding;
use crate::storage::promise::{Promise, PromiseOrigin};

/// Version of the resolved-config document.
pub const RESOLVED_CONFIG_VERSION: u32 = 1;

/// A shard pinned at resolution time.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ResolvedShard {
    /// Location.
    pub path: String,
    /// Encoding.
    pub encoding: Encoding,
    /// Number of records.
    pub rows: u64,
    /// The version read at resolution: a remote object's `ETag`, a local file's modification
    /// time (`mtime:<ns>`). A resumed stream refuses a shard whose version changed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub version: Option<String>,
    /// Size in bytes, as the manifest listed it or as resolution saw it. A shard of another
    /// size fails closed when it is first read.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bytes: Option<u64>,
    /// Hex SHA-256 of the shard's bytes, as its manifest lists it (`sha256:` checksums only).
    /// An object stored with another checksum fails closed when it is first read.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sha256: Option<String>,
}

impl ResolvedShard {
    /// What the document promises of the shard, as `origin` made the promise.
    pub fn promise(&self, origin: PromiseOrigin) -> Promise<'_> {
        Promise {
            origin,
            rows: self.rows,
            bytes: self.bytes,
            version: self.version.as_deref().map(Cow::Borrowed),
            sha256: self.sha256.as_deref().map(Cow::Borrowed),
        }
    }
}

/// The manifest selection a source was resolved from. Recorded so that a checkpoint can be
/// checked against a config without reading the manifest again: a manifest republished after
/// the checkpoint does not change what a resumed stream reads.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ManifestSelection {
    /// Absolute location of the manifest.
    pub manifest_uri: String,
    /// Split read.
    pub split: String,
    /// Curriculum selections or stages read, in order; `None` for the split's root order.
    pub curriculum_stages: Option<Vec<String>>,
}

/// One entry of a file list as the config named it, and how many of the source's shards (the
/// next ones, in order) it stands for.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NamedFile {
    /// The entry as configured, made absolute.
    pub file: String,
    /// The shards it resolved to.
    pub shards: u64,
}

/// A source with its shard list pinned.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ResolvedSource {
    /// Relative share of the stage's rows.
    pub weight: f64,
    /// Shards in reading order.
    pub shards: Vec<ResolvedShard>,
    /// The manifest selection the shards came from; absent for a plain file list.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub manifest: Option<ManifestSelection>,
    /// A file list's entries as the config named them, recorded where one names other files
    /// than itself (a Megatron `.idx` or prefix, a dataset directory): a config is checked
    /// against the names, as a manifest source is against its selection, so a directory
    /// rewritten after the checkpoint does not change what a resumed stream reads. Absent
    /// where every entry is its own shard, and in documents written before it existed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub named: Option<Vec<NamedFile>>,
    /// The source's column mapping: the name a projected field (or a token stage's field)
    /// reads, to the column this source's shards hold it under.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub columns: BTreeMap<String, String>,
}

impl ResolvedSource {
    /// Total records over all shards.
    pub fn rows(&self) -> u64 {
        self.shards.iter().map(|s| s.rows).sum()
    }
}

/// A stage with its sources resolved.
pub type ResolvedStage = Stage<ResolvedSource>;

/// The resolved document: what a stream opens and what a checkpoint stores.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ResolvedConfig {
    /// Document version.
    pub version: u32,
    /// Projected columns.
    pub fields: Vec<FieldSpec>,
    /// Resolved stages.
    pub stages: Vec<ResolvedStage>,
    /// Seed.
    pub seed: u64,
    /// Decode threads.
    pub threads: usize,
    /// Prefetched batches.
    pub prefetch_batches: usize,
    /// Rank.
    pub rank: usize,
    /// World size.
    pub world_size: usize,
    /// Working-set limit in bytes.
    pub memory_limit_bytes: Option<u64>,
    /// Every row once, the final round padded and masked.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub validation_pass: bool,
    /// Ranges `[start, end)` of global batches no rank receives (`crate::skips`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub skip_batches: Vec<crate::skips::SkipRange>,
    /// Partitions each stage's windows are dealt to; absent in documents of one partition
    /// (every document written before partitions existed).
    #[serde(
        default = "super::schema::one",
        skip_serializing_if = "super::schema::is_one"
    )]
    pub partitions: u64,
    /// How a partitioned stream deals its rows to partitions ([`super::PARTITION_LAYOUT`]); absent
    /// (1: shuffle windows dealt in turn) in documents of one partition and in those written
    /// before layout 2 existed, which keep the order they were taken with.
    #[serde(
        default = "super::schema::one",
        skip_serializing_if = "super::schema::is_one"
    )]
    pub partition_layout: u32,
}

impl ResolvedConfig {
    /// How the document deals rows to its partitions.
    pub fn partition_layout(&self) -> u32 {
        self.partition_layout
    }

    /// Serialises the document as JSON.
    pub fn to_json(&self) -> String {
        serde_json::to_string(self).expect("a resolved config always serialises")
    }
}

impl SourceSpec {
    /// The manifest selection `source` reads, as the resolved document records it.
    /// The manifest selection a manifest source pins in a resolved document; `None` for a file
    /// list.
    pub fn manifest_selection(&self) -> Option<ManifestSelection> {
        match self {
            SourceSpec::Files { .. } => None,
            SourceSpec::Manifest {
                manifest_uri,
                split,
                curriculum_stages,
                ..
            } => Some(ManifestSelection {
                manifest_uri: crate::storage::normalize(manifest_uri),
                split: split.clone(),
                curriculum_stages: curriculum_stages.clone(),
            }),
        }
    }
}
