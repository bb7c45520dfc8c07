//! The split checkpoint form, version 2 (`docs/checkpoint.md`, "Version 2: split"): a rank's
//! file holds its position and counters and names the run's resolved document by fingerprint;
//! the document is stored once beside the rank files, as `resolved-<fingerprint>.json`. A
//! rank's file does not grow with the corpus, and the shared document is written once per run
//! (by whichever rank gets there first: the same name always holds the same stream).

use std::sync::Arc;

use serde::{Deserialize, Serialize};

use super::{check_switches_version, refuse, version_for, Checkpoint, Cursor, Position, Switch};
use crate::config::ResolvedConfig;
use crate::error::Result;

/// Version of a split checkpoint's rank file without pending switches.
pub const SPLIT_VERSION: u32 = 2;

/// Version of a split checkpoint's rank file holding pending switches (written only then, as
/// the self-contained form writes version 3 only then).
pub const SPLIT_SWITCHES_VERSION: u32 = 4;

/// A rank's file in the split form.
#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct RankDocument {
    version: u32,
    fingerprint: String,
    /// The shared document's file name, beside this file.
    resolved: String,
    rank: usize,
    world_size: usize,
    cursor: Cursor,
    stage: usize,
    batches_yielded: u64,
    rows_yielded: u64,
    epochs: Vec<u64>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    switches: Vec<Switch>,
}

/// The file name of the resolved document of the stream `fingerprint` names.
pub fn shared_name(fingerprint: &str) -> String {
    // "fnv1a64:0123..." -> "resolved-fnv1a64-0123....json": one path component, any system.
    let safe: String = fingerprint
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() { c } else { '-' })
        .collect();
    format!("resolved-{safe}.json")
}

/// The largest rank file of the split form: its position and one epoch count per source of a
/// stage. A larger text is not one, and is not scanned for a version (a self-contained
/// checkpoint of a million shards would be parsed twice).
const MAX_RANK_FILE: usize = 1 << 20;

/// The shared document a split rank file `text` names, if `text` is one (version 2 or 4).
pub fn shared_reference(text: &str) -> Result<Option<String>> {
    #[derive(Deserialize)]
    struct Header {
        version: Option<serde_json::Value>,
        resolved: Option<serde_json::Value>,
    }
    if text.len() > MAX_RANK_FILE {
        return Ok(None);
    }
    let Ok(header) = serde_json::from_str::<Header>(text) else {
        return Ok(None);
    };
    if !super::is_split_version(header.version.and_then(|v| v.as_u64())) {
        return Ok(None);
    }
    match header.resolved {
        Some(serde_json::Value::String(name)) if is_shared_name(&name) => Ok(Some(name)),
        other => Err(refuse(format!(
            "its resolved field is {}, not the name of a resolved document \
             (resolved-<fingerprint>.json)",
            other.map_or_else(|| "missing".to_owned(), |v| v.to_string())
        ))),
    }
}

/// Whether `name` is a shared document's name: one plain path component, nothing to escape to.
pub(super) fn is_shared_name(name: &str) -> bool {
    name.len() <= 128
        && name.starts_with("resolved-")
        // The exact name writers give it (a fingerprint's), not any casing of it.
        && name.as_bytes().ends_with(b".json")
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '.')
        && !name.contains("..")
}

impl Checkpoint {
    /// The rank's file of the split form: its position and counters, and the name of the
    /// shared document ([`Checkpoint::shared_json`]).
    pub fn to_split_json(&self) -> String {
        let position = &self.position;
        let document = RankDocument {
            version: version_for(&position.switches, SPLIT_VERSION, SPLIT_SWITCHES_VERSION),
            fingerprint: position.fingerprint.clone(),
            resolved: shared_name(&position.fingerprint),
            rank: position.rank,
            world_size: position.world_size,
            cursor: position.cursor,
            stage: position.stage,
            batches_yielded: position.batches_yielded,
            rows_yielded: position.rows_yielded,
            epochs: position.epochs.clone(),
            switches: position.switches.clone(),
        };
        serde_json::to_string(&document).expect("a rank document always serialises")
    }

    /// The shared document of the split form: the resolved document, as rank 0 of a world of 1
    /// (each rank's file says which it is), so every rank of the run writes the same bytes.
    pub fn shared_json(&self) -> String {
        if (self.resolved.rank, self.resolved.world_size) == (0, 1) {
            return self.resolved.to_json();
        }
        let mut shared = (*self.resolved).clone();
        shared.rank = 0;
        shared.world_size = 1;
        shared.to_json()
    }

    /// The checkpoint a split rank file (`rank_text`) and its shared document (`shared_text`)
    /// describe; the document's fingerprint must be the one the rank file names.
    pub fn from_split(rank_text: &str, shared_text: &str) -> Result<Self> {
        let rank = RankFile::parse(rank_text)?;
        let shared = SharedDocument::parse(rank.shared_name(), shared_text)?;
        rank.with_shared(&shared)
    }
}

/// A parsed rank file of the split form, waiting for its shared document.
pub(super) struct RankFile(RankDocument);

impl RankFile {
    pub(super) fn parse(text: &str) -> Result<Self> {
        let rank: RankDocument = serde_json::from_str(text)
            .map_err(|e| refuse(format!("malformed rank file of a split checkpoint: {e}")))?;
        if !super::is_split_version(Some(u64::from(rank.version))) {
            return Err(refuse(format!(
                "the rank file is version {}, not the split form ({SPLIT_VERSION} or \
                 {SPLIT_SWITCHES_VERSION})",
                rank.version
            )));
        }
        check_switches_version(rank.version, &rank.switches, SPLIT_VERSION)?;
        Ok(Self(rank))
    }

    /// The name of the shared document it names.
    pub(super) fn shared_name(&self) -> &str {
        &self.0.resolved
    }

    /// The checkpoint it and `shared` describe; `shared` must be the stream it names.
    pub(super) fn with_shared(self, shared: &SharedDocument) -> Result<Checkpoint> {
        let rank = self.0;
        if shared.fingerprint != rank.fingerprint {
            return Err(refuse(format!(
                "{} holds stream {}, but the rank file belongs to {}; the document \
                 was altered or is another run's",
                rank.resolved, shared.fingerprint, rank.fingerprint
            )));
        }
        let position = Position {
            fingerprint: rank.fingerprint,
            rank: rank.rank,
            world_size: rank.world_size,
            cursor: rank.cursor,
            stage: rank.stage,
            batches_yielded: rank.batches_yielded,
            rows_yielded: rank.rows_yielded,
            epochs: rank.epochs,
            switches: rank.switches,
        };
        // Checks the counters against each other and against the document.
        let position = Position::from_json(&position.to_json())?;
        Checkpoint::from_fingerprinted(Arc::clone(&shared.resolved), &shared.fingerprint, position)
    }
}

/// A parsed and checked shared document: read once however many rank files name it.
pub(super) struct SharedDocument {
    resolved: Arc<ResolvedConfig>,
    fingerprint: String,
}

impl SharedDocument {
    /// Parses the document `name` holds (`text`).
    pub(super) fn parse(name: &str, text: &str) -> Result<Self> {
        let resolved: ResolvedConfig = serde_json::from_str(text)
            .map_err(|e| refuse(format!("malformed resolved document {name}: {e}")))?;
        resolved
            .validate()
            .map_err(|e| refuse(format!("its resolved config is invalid: {e}")))?;
        let fingerprint = resolved.fingerprint();
        Ok(Self {
            resolved: Arc::new(resolved),
            fingerprint,
        })
    }
}
