//! The fingerprint of a resolved document: a hash of everything that decides the order.

use serde::Serialize;

use super::resolved::{ResolvedConfig, ResolvedShard, ResolvedSource, ResolvedStage};
use crate::encoding::Encoding;
use crate::fnv::Fnv1a;

impl ResolvedConfig {
    /// A hash of everything that decides the order: fields, stages with their resolved shards,
    /// and the seed (not rank, world size or resources). FNV-1a over canonical JSON: compact,
    /// keys sorted.
    pub fn fingerprint(&self) -> String {
        // The document without its shard lists goes through `Value` (whose maps sort keys);
        // each shard list is streamed in place of a marker, so a million-shard document is
        // hashed without building a `Value` per shard (that cost seconds per open).
        let stages: Vec<ResolvedStage> = self
            .stages
            .iter()
            .map(|stage| {
                let sources = stage
                    .sources
                    .iter()
                    .map(|source| ResolvedSource {
                        weight: source.weight,
                        shards: Vec::new(),
                        manifest: source.manifest.clone(),
                        // How the files were named does not decide the order.
                        named: None,
                        columns: source.columns.clone(),
                    })
                    .collect();
                stage.with_sources(sources)
            })
            .collect();
        let mut doc = serde_json::json!({
            "fields": self.fields,
            "stages": stages,
            "seed": self.seed,
        });
        // Added only when set, so streams without it keep their fingerprints.
        if self.validation_pass {
            doc["validation_pass"] = serde_json::Value::Bool(true);
        }
        if !self.skip_batches.is_empty() {
            doc["skip_batches"] = serde_json::json!(self.skip_batches);
        }
        if self.partitions != 1 {
            doc["partitions"] = serde_json::json!(self.partitions);
        }
        if self.partition_layout != 1 {
            doc["partition_layout"] = serde_json::json!(self.partition_layout);
        }
        for (s, stage) in doc["stages"]
            .as_array_mut()
            .expect("stages serialise as an array")
            .iter_mut()
            .enumerate()
        {
            for (j, source) in stage["sources"]
                .as_array_mut()
                .expect("sources serialise as an array")
                .iter_mut()
                .enumerate()
            {
                source["shards"] = serde_json::Value::String(shards_marker(s, j));
            }
        }
        let mut hash = Fnv1a::default();
        let mut rest = doc.to_string();
        for (s, stage) in self.stages.iter().enumerate() {
            for (j, source) in stage.sources.iter().enumerate() {
                let marker = serde_json::to_string(&shards_marker(s, j)).expect("a string");
                let at = rest.find(&marker).expect("each marker is in the document");
                hash.update(&rest.as_bytes()[..at]);
                hash.update(b"[");
                for (k, shard) in source.shards.iter().enumerate() {
                    if k > 0 {
                        hash.update(b",");
                    }
                    serde_json::to_writer(&mut hash, &CanonicalShard::of(shard))
                        .expect("writing to a hash cannot fail");
                }
                hash.update(b"]");
                rest.drain(..at + marker.len());
            }
        }
        hash.update(rest.as_bytes());
        format!("fnv1a64:{:016x}", hash.value())
    }
}

/// Stands for one source's shard list while the rest of the document is serialised; the NUL
/// (written escaped) cannot occur in a serialised option.
pub(super) fn shards_marker(stage: usize, source: usize) -> String {
    format!("\0o41-shards:{stage}:{source}\0")
}

/// A shard as the canonical document writes it: `ResolvedShard`'s fields in sorted order, with
/// the same omissions.
#[derive(Serialize)]
pub(super) struct CanonicalShard<'a> {
    #[serde(skip_serializing_if = "Option::is_none")]
    bytes: Option<u64>,
    encoding: Encoding,
    path: &'a str,
    rows: u64,
    #[serde(skip_serializing_if = "Option::is_none")]
    sha256: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    version: Option<&'a str>,
}

impl<'a> CanonicalShard<'a> {
    fn of(shard: &'a ResolvedShard) -> Self {
        // Destructured so that a field added to `ResolvedShard` fails to compile here until
        // the canonical form covers it.
        let ResolvedShard {
            path,
            encoding,
            rows,
            version,
            bytes,
            sha256,
        } = shard;
        CanonicalShard {
            bytes: *bytes,
            encoding: *encoding,
            path,
            rows: *rows,
            sha256: sha256.as_deref(),
            version: version.as_deref(),
        }
    }
}
