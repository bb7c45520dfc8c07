//! The checkpoint format (`docs/checkpoint.md`): a small, versioned JSON document holding the
//! resolved config (no credentials), the cursor, and the counters users read.
//!
//! The cursor is positional: the active segment (stage and drained rows) and the first global
//! batch of the next round. Everything else is recomputed by the order function, so the
//! document does not grow with the data, the shuffle window or the run's length.

use std::sync::Arc;

use serde::{Deserialize, Serialize};

use crate::config::{ResolvedConfig, RESOLVED_CONFIG_VERSION};
use crate::error::{Error, Result};
use crate::limits::MAX_POSITION;
use crate::order::Segment;

mod diff;
mod run;
mod run_state;
mod split;

pub use diff::check_config;
pub use run::{check_same_place, check_same_stream, Naming, RunFiles};
pub use run_state::{
    switch_at, RunIndex, RunState, RUN_STATE_FORMAT, RUN_STATE_READ_VERSIONS, RUN_STATE_VERSION,
};
pub use split::{shared_name, shared_reference, SPLIT_SWITCHES_VERSION, SPLIT_VERSION};

/// Version of the checkpoint document without pending switches.
pub const CHECKPOINT_VERSION: u32 = 1;

/// Version of a checkpoint document holding pending curriculum switches (`switches`). A
/// document is written in the lowest version that holds it, so a checkpoint without pending
/// switches still reads in releases that know version 1 only.
pub const SWITCHES_VERSION: u32 = 3;

/// The version a document with `switches` is written in: the lowest that holds it.
fn version_for(switches: &[Switch], base: u32, with_switches: u32) -> u32 {
    if switches.is_empty() {
        base
    } else {
        with_switches
    }
}

/// A curriculum switch the stream has not reached yet: `stage` starts at the first round that
/// begins at or after global batch `at` (and, in a partitioned stream, at a batch where every
/// partition has read the same rows). Counted in global batches, so it means the same batch on
/// every rank, in every `DataLoader` worker and after a move to another world size.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Switch {
    /// The stage that starts.
    pub stage: usize,
    /// The global batch it starts at (the first eligible round at or after it).
    pub at: u64,
}

/// Where a stream stands, rank-independently.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Cursor {
    /// The active segment.
    pub segment: Segment,
    /// Every global batch before this one was delivered to its rank.
    pub next_batch: u64,
}

/// A rank's place in a stream: everything a checkpoint holds except the resolved config. Every
/// delivered batch carries the position after it, so an adapter can checkpoint exactly the
/// batch a model consumed, even when another thread or process produced it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Position {
    /// Fingerprint of the stream it belongs to.
    pub fingerprint: String,
    /// The rank this position belongs to.
    pub rank: usize,
    /// The number of ranks it was taken with.
    pub world_size: usize,
    /// Position.
    pub cursor: Cursor,
    /// Active stage.
    pub stage: usize,
    /// Rank-level batches received over the whole run.
    pub batches_yielded: u64,
    /// Rank-level rows received over the whole run.
    pub rows_yielded: u64,
    /// Completed passes over each source of the active stage.
    pub epochs: Vec<u64>,
    /// Curriculum switches requested and not reached yet, by increasing `at`: a stream resumed
    /// here applies them. Absent from documents written before switches were kept here.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub switches: Vec<Switch>,
}

/// A rank's stream position: its [`Position`] and the resolved document the position is in.
/// The position's rank and world size are always the document's.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(into = "Document")]
pub struct Checkpoint {
    /// Where the rank stands. Its fingerprint is always `resolved.fingerprint()`, which every
    /// constructor computes or checks, so a resumed stream takes it as known.
    pub position: Position,
    /// The resolved config, including this checkpoint's rank and world size. Shared with the
    /// stream that took the checkpoint: taking one does not copy a million-shard document.
    pub resolved: Arc<ResolvedConfig>,
}

/// The checkpoint document as written (`docs/checkpoint.md`): the position's fields without
/// its rank and world size, which the resolved document holds.
#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct Document {
    version: u32,
    fingerprint: String,
    cursor: Cursor,
    stage: usize,
    batches_yielded: u64,
    rows_yielded: u64,
    epochs: Vec<u64>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    switches: Vec<Switch>,
    resolved: Arc<ResolvedConfig>,
}

impl From<Document> for Checkpoint {
    fn from(doc: Document) -> Self {
        Checkpoint {
            position: Position {
                fingerprint: doc.fingerprint,
                rank: doc.resolved.rank,
                world_size: doc.resolved.world_size,
                cursor: doc.cursor,
                stage: doc.stage,
                batches_yielded: doc.batches_yielded,
                rows_yielded: doc.rows_yielded,
                epochs: doc.epochs,
                switches: doc.switches,
            },
            resolved: doc.resolved,
        }
    }
}

impl From<Checkpoint> for Document {
    fn from(checkpoint: Checkpoint) -> Self {
        let version = checkpoint.version();
        let Position {
            fingerprint,
            cursor,
            stage,
            batches_yielded,
            rows_yielded,
            epochs,
            switches,
            ..
        } = checkpoint.position;
        Document {
            version,
            fingerprint,
            cursor,
            stage,
            batches_yielded,
            rows_yielded,
            epochs,
            switches,
            resolved: checkpoint.resolved,
        }
    }
}

fn refuse(message: impl Into<String>) -> Error {
    Error::Checkpoint {
        message: message.into(),
    }
}

fn unsupported(version: impl std::fmt::Display) -> Error {
    refuse(format!(
        "version {version} is not supported (this release reads versions {CHECKPOINT_VERSION} \
         and {SWITCHES_VERSION}, and the split form's {SPLIT_VERSION} and \
         {SPLIT_SWITCHES_VERSION})"
    ))
}

/// Refuses a document that is not JSON, has no version, or has another version than this
/// release reads; skips everything else without building it.
fn check_version(text: &str) -> Result<()> {
    #[derive(Deserialize)]
    struct Header {
        version: Option<serde_json::Value>,
    }
    let header: Header =
        serde_json::from_str(text).map_err(|e| refuse(format!("not valid JSON: {e}")))?;
    match header.version {
        Some(v) if is_whole_version(v.as_u64()) => Ok(()),
        Some(v) if is_split_version(v.as_u64()) => Err(refuse(format!(
            "it is a rank file of the split form (version {v}), which names its resolved \
             document beside it: read it with read_checkpoint(path) or Checkpoint.from_split"
        ))),
        Some(v) => Err(unsupported(v)),
        None => Err(refuse("it has no version field; is it a checkpoint?")),
    }
}

/// Whether `version` is one of the self-contained document's.
fn is_whole_version(version: Option<u64>) -> bool {
    version.is_some_and(|v| v == u64::from(CHECKPOINT_VERSION) || v == u64::from(SWITCHES_VERSION))
}

/// Whether `version` is one of the split form's rank files'.
fn is_split_version(version: Option<u64>) -> bool {
    version.is_some_and(|v| v == u64::from(SPLIT_VERSION) || v == u64::from(SPLIT_SWITCHES_VERSION))
}

/// Refuses a document of `version` whose `switches` that version cannot hold.
fn check_switches_version(version: u32, switches: &[Switch], base: u32) -> Result<()> {
    if version == base && !switches.is_empty() {
        return Err(refuse(format!(
            "it is version {base} but holds pending switches, which a document of that version \
             cannot hold; the document was altered"
        )));
    }
    Ok(())
}

impl Position {
    /// This position with a switch to `stage` at global batch `at` requested: kept when the
    /// stream has not reached `at` (`at >= next_batch`) and the stage in effect there is another
    /// one; a request replaces the ones at or after its `at` (the latest request wins), so the
    /// switches stay ordered. A request the position is already past is dropped: the position
    /// reflects it, or the stream passed that batch before the request arrived.
    #[must_use]
    pub fn with_switch(&self, stage: usize, at: u64) -> Position {
        let mut out = self.clone();
        if at < out.cursor.next_batch {
            return out;
        }
        out.switches.retain(|s| s.at < at);
        let current = out.switches.last().map_or(out.stage, |s| s.stage);
        if stage != current {
            out.switches.push(Switch { stage, at });
        }
        out
    }

    /// The position as a small JSON document.
    pub fn to_json(&self) -> String {
        serde_json::to_string(self).expect("a position always serialises")
    }

    /// Parses a position document.
    pub fn from_json(text: &str) -> Result<Self> {
        let position: Position =
            serde_json::from_str(text).map_err(|e| refuse(format!("malformed position: {e}")))?;
        if position.world_size == 0 || position.rank >= position.world_size {
            return Err(refuse(format!(
                "the position's rank {} of world size {} is invalid",
                position.rank, position.world_size
            )));
        }
        check_counters(
            position.stage,
            &position.cursor,
            [position.batches_yielded, position.rows_yielded],
            &position.epochs,
        )?;
        check_switches(&position.cursor, &position.switches)?;
        Ok(position)
    }
}

/// Refuses a position whose fields contradict each other or exceed what a stream reaches: the
/// stage its cursor is in, counters and epochs below [`MAX_POSITION`], and no more batches
/// received than the global batches before its cursor. A forged or corrupted document is named
/// by its fields rather than resumed somewhere else in the sequence.
fn check_counters(
    stage: usize,
    cursor: &Cursor,
    [batches, rows]: [u64; 2],
    epochs: &[u64],
) -> Result<()> {
    if stage != cursor.segment.stage {
        return Err(refuse(format!(
            "its stage is {stage} but its cursor is in stage {}; the fields contradict each other",
            cursor.segment.stage
        )));
    }
    // The cursor's own bounds are the order's to check at resume ("beyond any position").
    if batches > MAX_POSITION || rows > MAX_POSITION {
        return Err(refuse(format!(
            "its counters ({batches} batches, {rows} rows) are beyond any a stream reaches"
        )));
    }
    if let Some(&epoch) = epochs.iter().find(|&&e| e > MAX_POSITION) {
        return Err(refuse(format!(
            "its epochs is {epoch}, beyond what a stream reaches ({MAX_POSITION})"
        )));
    }
    if cursor.segment.start_batch > cursor.next_batch {
        return Err(refuse(format!(
            "its cursor.next_batch {} is before its segment's start_batch {}; the fields \
             contradict each other",
            cursor.next_batch, cursor.segment.start_batch
        )));
    }
    if batches > cursor.next_batch {
        return Err(refuse(format!(
            "its batches_yielded {batches} exceeds the global batches before its cursor ({}); \
             the fields contradict each other",
            cursor.next_batch
        )));
    }
    Ok(())
}

/// Refuses pending switches a stream at `cursor` cannot hold: each at or after the cursor's next
/// global batch, within [`MAX_POSITION`], in increasing order.
fn check_switches(cursor: &Cursor, switches: &[Switch]) -> Result<()> {
    let mut after = cursor.next_batch;
    for (i, switch) in switches.iter().enumerate() {
        if switch.at < after || (i > 0 && switch.at == after) || switch.at > MAX_POSITION {
            return Err(refuse(format!(
                "its switches[{i}] at global batch {} is not after the position (next_batch {}) \
                 and the switches before it, or is beyond any a stream reaches",
                switch.at, cursor.next_batch
            )));
        }
        after = switch.at;
    }
    Ok(())
}

/// Refuses a checkpoint or position of another rank or world size than this process's.
/// `None` accepts any.
pub fn check_process(
    rank: usize,
    world_size: usize,
    this_rank: Option<usize>,
    this_world_size: Option<usize>,
) -> Result<()> {
    if this_rank.is_none_or(|r| r == rank) && this_world_size.is_none_or(|w| w == world_size) {
        return Ok(());
    }
    Err(refuse(format!(
        "it belongs to rank {rank} of {world_size}, this process is rank {} of {}; resume each \
         rank from its own checkpoint, or move the position with \
         checkpoint.for_world(rank, world_size)",
        this_rank.unwrap_or(rank),
        this_world_size.unwrap_or(world_size)
    )))
}

impl Checkpoint {
    /// The version its document is written in: [`SWITCHES_VERSION`] when it holds pending
    /// switches, else [`CHECKPOINT_VERSION`] (the lowest that holds it).
    pub fn version(&self) -> u32 {
        version_for(
            &self.position.switches,
            CHECKPOINT_VERSION,
            SWITCHES_VERSION,
        )
    }

    /// The rank this checkpoint belongs to.
    pub fn rank(&self) -> usize {
        self.position.rank
    }

    /// The world size it was taken in.
    pub fn world_size(&self) -> usize {
        self.position.world_size
    }

    /// Refuses the checkpoint for a process of another rank or world size (`None` accepts any).
    pub fn check_process(&self, rank: Option<usize>, world_size: Option<usize>) -> Result<()> {
        check_process(self.rank(), self.world_size(), rank, world_size)
    }

    /// The JSON document.
    pub fn to_json(&self) -> String {
        serde_json::to_string(self).expect("a checkpoint always serialises")
    }

    /// Parses and checks a checkpoint document.
    pub fn from_json(text: &str) -> Result<Self> {
        // One pass on the common path: a resolved document can list a million shards, parsed
        // straight into its types. Only a document that does not parse is scanned again, for
        // its version, so that one of another release is refused as that, not as malformed.
        let document: Document = serde_json::from_str(text).map_err(|e| {
            // A document nested past serde_json's limit is refused for that, whatever else.
            if e.to_string().starts_with("recursion limit exceeded") {
                return refuse(format!("malformed: it nests too deep ({e})"));
            }
            check_version(text)
                .err()
                .unwrap_or_else(|| refuse(format!("malformed: {e}")))
        })?;
        if !is_whole_version(Some(u64::from(document.version))) {
            return Err(unsupported(document.version));
        }
        check_switches_version(document.version, &document.switches, CHECKPOINT_VERSION)?;
        let checkpoint = Checkpoint::from(document);
        let expected = checkpoint.resolved.fingerprint();
        if checkpoint.position.fingerprint != expected {
            return Err(refuse(format!(
                "its fingerprint {} does not match its resolved config ({expected}); the document was altered",
                checkpoint.position.fingerprint
            )));
        }
        checkpoint
            .resolved
            .validate()
            .map_err(|e| refuse(format!("its resolved config is invalid: {e}")))?;
        checkpoint.check_consistent()?;
        Ok(checkpoint)
    }

    /// Refuses a checkpoint whose position contradicts itself or its resolved document: see
    /// `check_counters`, and the stage and epochs must fit the document's stages and sources.
    fn check_consistent(&self) -> Result<()> {
        if self.resolved.version != RESOLVED_CONFIG_VERSION {
            return Err(refuse(format!(
                "its resolved config is version {}; this release reads version \
                 {RESOLVED_CONFIG_VERSION}",
                self.resolved.version
            )));
        }
        let position = &self.position;
        check_counters(
            position.stage,
            &position.cursor,
            [position.batches_yielded, position.rows_yielded],
            &position.epochs,
        )?;
        check_switches(&position.cursor, &position.switches)?;
        let stages = self.resolved.stages.len();
        if let Some(switch) = position.switches.iter().find(|s| s.stage >= stages) {
            return Err(refuse(format!(
                "its pending switch to stage {} names no stage of the stream's {stages}",
                switch.stage
            )));
        }
        let Some(stage) = self.resolved.stages.get(position.stage) else {
            return Err(refuse(format!(
                "its stage {} is not one of the stream's {stages} stages",
                position.stage
            )));
        };
        if position.epochs.len() != stage.sources.len() {
            return Err(refuse(format!(
                "its epochs list {} sources, but stage {} has {}",
                position.epochs.len(),
                position.stage,
                stage.sources.len()
            )));
        }
        Ok(())
    }

    /// This checkpoint with `skips` as its stream's skipped ranges (`crate::skips`): every
    /// range it skipped is kept, and added ones start at or after its next global batch. The
    /// skips are part of the fingerprint, so the checkpoint gets the new stream's; a later
    /// checkpoint of the resumed stream keeps them.
    pub fn with_skips(&self, skips: &[crate::skips::SkipRange]) -> Result<Self> {
        if skips == self.resolved.skip_batches.as_slice() {
            return Ok(self.clone());
        }
        let next_batch = self.position.cursor.next_batch;
        crate::skips::check_extends(&self.resolved.skip_batches, skips, next_batch)?;
        let mut resolved = (*self.resolved).clone();
        resolved.skip_batches = skips.to_vec();
        let resolved = Arc::new(resolved);
        let position = Position {
            fingerprint: resolved.fingerprint(),
            ..self.position.clone()
        };
        Ok(Checkpoint { position, resolved })
    }

    /// The position part of the checkpoint.
    pub fn position(&self) -> Position {
        self.position.clone()
    }

    /// The checkpoint at `position` of the stream `resolved` describes, for the position's rank
    /// and world size.
    pub fn from_position(resolved: Arc<ResolvedConfig>, position: Position) -> Result<Self> {
        let fingerprint = resolved.fingerprint();
        Self::from_fingerprinted(resolved, &fingerprint, position)
    }

    /// [`Checkpoint::from_position`] for a document whose fingerprint is known (`fingerprint`
    /// is `resolved.fingerprint()`, which a stream computes once): a stream's checkpoints cost
    /// no pass over its shards.
    pub fn from_fingerprinted(
        mut resolved: Arc<ResolvedConfig>,
        fingerprint: &str,
        position: Position,
    ) -> Result<Self> {
        if position.fingerprint != fingerprint {
            return Err(refuse(format!(
                "the position belongs to stream {}, not to this one ({fingerprint})",
                position.fingerprint
            )));
        }
        if position.world_size == 0 || position.rank >= position.world_size {
            return Err(refuse(format!(
                "the position's rank {} of world size {} is invalid",
                position.rank, position.world_size
            )));
        }
        if (resolved.rank, resolved.world_size) != (position.rank, position.world_size) {
            let retargeted = Arc::make_mut(&mut resolved);
            retargeted.rank = position.rank;
            retargeted.world_size = position.world_size;
        }
        let checkpoint = Checkpoint { position, resolved };
        checkpoint.check_consistent()?;
        Ok(checkpoint)
    }

    /// The checkpoint at the beginning of the stream `resolved` describes (for its rank and
    /// world size): where a stream opened from the config starts. With [`Position::with_switch`]
    /// it places a curriculum switch in a stream that has not delivered a batch yet.
    pub fn at_start(resolved: Arc<ResolvedConfig>) -> Result<Self> {
        let sources = resolved
            .stages
            .first()
            .map_or(0, |stage| stage.sources.len());
        let fingerprint = resolved.fingerprint();
        let position = Position {
            fingerprint: fingerprint.clone(),
            rank: resolved.rank,
            world_size: resolved.world_size,
            cursor: Cursor {
                segment: Segment::first(),
                next_batch: 0,
            },
            stage: 0,
            batches_yielded: 0,
            rows_yielded: 0,
            epochs: vec![0; sources],
            switches: Vec::new(),
        };
        Self::from_fingerprinted(resolved, &fingerprint, position)
    }

    /// The same position for rank `rank` of `world_size`.
    ///
    /// The global batch sequence does not depend on the world size, so any rank's checkpoint
    /// taken after the same number of local batches as every other rank's continues the same
    /// sequence, partitioned over the new ranks.
    pub fn for_world(&self, rank: usize, world_size: usize) -> Result<Self> {
        if world_size == 0 || rank >= world_size {
            return Err(Error::config(
                "rank",
                format!("rank {rank} is not below world_size {world_size}"),
            ));
        }
        let mut out = self.clone();
        let retargeted = Arc::make_mut(&mut out.resolved);
        retargeted.rank = rank;
        retargeted.world_size = world_size;
        out.position.rank = rank;
        out.position.world_size = world_size;
        // A ramped stage's batches must split over the new world too.
        out.resolved.validate()?;
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn resolved() -> Arc<ResolvedConfig> {
        let text = r#"{"version": 1, "fields": [{"name": "v", "source": "v", "dtype": "i64",
            "shape": [], "pad": 0}], "stages": [{"sources": [{"weight": 1.0, "shards": [{"path":
            "/d/a.parquet", "encoding": "parquet", "rows": 10, "bytes": 533}]}], "batch_size": 2,
            "shuffle": null, "infinite": false}], "seed": 0, "threads": 1, "prefetch_batches": 2,
            "rank": 0, "world_size": 2, "memory_limit_bytes": null}"#;
        Arc::new(serde_json::from_str(text).unwrap())
    }

    fn position(fingerprint: String, rank: usize) -> Position {
        Position {
            fingerprint,
            rank,
            world_size: 2,
            cursor: Cursor {
                segment: Segment::first(),
                next_batch: 2,
            },
            stage: 0,
            batches_yielded: 1,
            rows_yielded: 2,
            epochs: vec![0],
            switches: Vec::new(),
        }
    }

    #[test]
    fn a_checkpoint_shares_its_streams_document_unless_it_is_for_another_rank() {
        let resolved = resolved();
        let fingerprint = resolved.fingerprint();
        let own = Checkpoint::from_fingerprinted(
            resolved.clone(),
            &fingerprint,
            position(fingerprint.clone(), 0),
        )
        .unwrap();
        assert!(Arc::ptr_eq(&own.resolved, &resolved));
        let other = Checkpoint::from_fingerprinted(
            resolved.clone(),
            &fingerprint,
            position(fingerprint.clone(), 1),
        )
        .unwrap();
        assert!(!Arc::ptr_eq(&other.resolved, &resolved));
        assert_eq!((other.resolved.rank, resolved.rank), (1, 0));
        assert_eq!(other.resolved.stages, resolved.stages);
        assert_eq!(
            other,
            Checkpoint::from_position(resolved.clone(), position(fingerprint.clone(), 1)).unwrap()
        );
        let foreign = position("fnv1a64:0000000000000000".to_owned(), 0);
        let refused = Checkpoint::from_fingerprinted(resolved, &fingerprint, foreign).unwrap_err();
        assert!(
            refused.to_string().contains("belongs to stream"),
            "{refused}"
        );
    }
}
