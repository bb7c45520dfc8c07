//! A run's positions in one document, and the index of a directory of per-rank files
//! (docs/checkpoint.md, "A run in one document").
//!
//! A framework that saves one checkpoint for every rank (Lightning writes rank 0's dict and
//! hands that same dict to every rank on resume) keeps the run's place as a [`RunState`]: the
//! world that wrote it, the stream's resolved document once, and each rank's position. A
//! directory of per-rank files may carry a [`RunIndex`] beside them, saying which world wrote
//! them and each rank's file. Both share a header and read the documents earlier releases wrote:
//! version 1 kept each rank's pending curriculum switches beside its position, counted in the
//! rank's own batches; they are moved into the positions, counted in global batches, as read.

use std::sync::Arc;

use serde_json::{json, Map, Value};

use super::run::{check_same_place, RunFiles};
use super::{refuse, Checkpoint, Position};
use crate::config::ResolvedConfig;
use crate::error::{Error, Result};

/// The `format` marker of a run state and of a run index, so either is found among other keys
/// of a framework's checkpoint. (The name is the first writer's, the Lightning plugin's, and
/// stays so that every state written since still reads.)
pub const RUN_STATE_FORMAT: &str = "o41-training-data-lightning";

/// The version written: pending switches are in the positions.
pub const RUN_STATE_VERSION: u64 = 2;

/// The versions read: version 1 kept each rank's pending switches beside its position.
pub const RUN_STATE_READ_VERSIONS: [u64; 2] = [1, RUN_STATE_VERSION];

/// A version-1 rank's pending switches: `(stage, the rank's own batches_yielded to switch at)`.
type LegacySwitches = Vec<(usize, u64)>;

/// Every rank's position, the world that took them and the stream's resolved document.
#[derive(Debug, Clone)]
pub struct RunState {
    world_size: usize,
    resolved: Option<Arc<ResolvedConfig>>,
    /// One per rank; `None`: the rank is at the beginning of the config.
    positions: Vec<Option<Position>>,
}

impl RunState {
    /// The state of `world_size` ranks at `positions` of the stream `resolved` describes.
    /// Refused unless there is one position per rank, each the rank's own, and a document
    /// whenever a rank has started; `source` names the state in errors.
    pub fn new(
        world_size: usize,
        resolved: Option<Arc<ResolvedConfig>>,
        positions: Vec<Option<Position>>,
        source: &str,
    ) -> Result<Self> {
        check_world(world_size, positions.len(), source)?;
        for (rank, position) in positions.iter().enumerate() {
            if let Some(p) = position {
                if (p.rank, p.world_size) != (rank, world_size) {
                    return Err(refuse(format!(
                        "{source}: ranks[{rank}] holds the position of rank {} of {}",
                        p.rank, p.world_size
                    )));
                }
            }
        }
        if resolved.is_none() && positions.iter().any(Option::is_some) {
            return Err(refuse(format!(
                "{source}: positions without the resolved config"
            )));
        }
        Ok(Self {
            world_size,
            resolved,
            positions,
        })
    }

    /// Parses a state (`source` names it in errors); a version-1 state's switches move into
    /// its positions.
    pub fn parse(text: &str, source: &str) -> Result<Self> {
        let value = parse_json(text, source)?;
        let header = Header::read(&value, source)?;
        let resolved = match value.get("resolved") {
            None | Some(Value::Null) => None,
            Some(Value::String(text)) => Some(parse_resolved(text, source)?),
            Some(_) => {
                return Err(refuse(format!("{source}: resolved is not JSON text")));
            }
        };
        let mut positions = Vec::with_capacity(header.world_size);
        for (rank, entry) in header.ranks.iter().enumerate() {
            let position = match entry.get("position") {
                None | Some(Value::Null) => None,
                Some(Value::String(text)) => Some(Position::from_json(text)?),
                Some(_) => {
                    return Err(refuse(format!(
                        "{source}: ranks[{rank}].position is not JSON text"
                    )));
                }
            };
            positions.push(position);
        }
        let state = Self::new(header.world_size, resolved, positions, source)?;
        if header.version == 1 {
            let legacy = header.legacy_switches(source)?;
            return state.with_legacy_switches(&legacy, source);
        }
        Ok(state)
    }

    /// The state as a document of the current version.
    pub fn to_json(&self) -> String {
        let ranks: Vec<Value> = self
            .positions
            .iter()
            .map(|p| json!({"position": p.as_ref().map(Position::to_json)}))
            .collect();
        json!({
            "format": RUN_STATE_FORMAT,
            "version": RUN_STATE_VERSION,
            "world_size": self.world_size,
            "resolved": self.resolved.as_ref().map(|r| r.to_json()),
            "ranks": ranks,
        })
        .to_string()
    }

    /// The number of ranks that took the positions.
    pub fn world_size(&self) -> usize {
        self.world_size
    }

    /// The stream's resolved document, when a rank has started (or one was given).
    pub fn resolved(&self) -> Option<&Arc<ResolvedConfig>> {
        self.resolved.as_ref()
    }

    /// Each rank's position; `None`: at the beginning of the config.
    pub fn positions(&self) -> &[Option<Position>] {
        &self.positions
    }

    /// Rank `rank`'s checkpoint (of the world that took the state), or `None` at the beginning.
    pub fn checkpoint(&self, rank: usize) -> Result<Option<Checkpoint>> {
        let Some(position) = self.positions.get(rank).ok_or_else(|| {
            Error::config(
                "rank",
                format!("rank {rank} is not below world_size {}", self.world_size),
            )
        })?
        else {
            return Ok(None);
        };
        let resolved = self.resolved.clone().expect("new() requires it");
        Checkpoint::from_position(resolved, position.clone()).map(Some)
    }

    /// Where rank `rank` of `world_size` resumes (`None`: the config's beginning).
    ///
    /// With the world that took the state, the rank's own entry. With another, the positions
    /// are moved ([`check_same_place`], then [`Checkpoint::for_world`]): exact only when every
    /// old rank stopped at the same place with the same pending switches. `source` names the
    /// state in the refusal.
    pub fn checkpoint_for(
        &self,
        rank: usize,
        world_size: usize,
        source: &str,
    ) -> Result<Option<Checkpoint>> {
        if world_size == self.world_size {
            return self.checkpoint(rank);
        }
        let Some(first) = self.positions.iter().flatten().next() else {
            return Ok(None); // no rank had started: the new ones start at the beginning
        };
        let names: Vec<String> = (0..self.world_size).map(|r| format!("rank {r}")).collect();
        let stops: Vec<(&str, Option<&Position>)> = names
            .iter()
            .map(String::as_str)
            .zip(self.positions.iter().map(Option::as_ref))
            .collect();
        let old = self.world_size;
        let moved = check_same_place(&stops, world_size).and_then(|()| {
            let resolved = self.resolved.clone().expect("new() requires it");
            Checkpoint::from_position(resolved, first.clone())?.for_world(rank, world_size)
        });
        moved.map(Some).map_err(|error| match error {
            Error::Checkpoint { message } => refuse(format!(
                "{message} ({source}, written by {old} ranks; resume with {old} ranks)"
            )),
            other => other,
        })
    }

    /// The state with version 1's per-rank switches (`[stage, batches_yielded]`, counted in the
    /// rank's own batches) placed in the positions, counted in global batches.
    fn with_legacy_switches(mut self, switches: &[LegacySwitches], source: &str) -> Result<Self> {
        if switches.iter().all(Vec::is_empty) {
            return Ok(self);
        }
        let Some(resolved) = self.resolved.clone() else {
            return Err(refuse(format!(
                "{source}: a version-1 state whose ranks had not started holds a curriculum \
                 switch but no resolved config to place it in; call advance() again before \
                 trainer.fit"
            )));
        };
        let ramped: Vec<bool> = resolved.stages.iter().map(|s| s.ramp.is_some()).collect();
        let start = Checkpoint::at_start(resolved)?;
        for (rank, pending) in switches.iter().enumerate() {
            for &(stage, at) in pending {
                let position = match self.positions[rank].take() {
                    Some(position) => position,
                    None => start.for_world(rank, self.world_size)?.position,
                };
                let placed = match at.checked_sub(position.batches_yielded) {
                    Some(ahead) => {
                        let at = switch_at(&ramped, &position, stage, ahead)?;
                        position.with_switch(stage, at)
                    }
                    None => position, // the rank had passed it: its position reflects it
                };
                self.positions[rank] = Some(placed);
            }
        }
        Ok(self)
    }
}

/// The global batch where a switch to `stage`, requested `batches_ahead` local batches after
/// `position`, takes effect on every rank: the round after those batches. A position's
/// `next_batch` is the same on every rank after the same number of local batches, and each
/// local batch is one round: `world_size` global batches, or one in a ramped stage (whose global
/// batches the ranks share). `ramped` says, stage by stage, whether the stage has a ramp.
pub fn switch_at(
    ramped: &[bool],
    position: &Position,
    stage: usize,
    batches_ahead: u64,
) -> Result<u64> {
    let stages = ramped.len();
    if stage >= stages {
        return Err(Error::config(
            "stage",
            format!("there is no stage {stage}; the stream has {stages} stages"),
        ));
    }
    let Some(&ramp) = ramped.get(position.stage) else {
        return Err(Error::config(
            "position",
            format!(
                "it is in stage {}, the stream has {stages} stages",
                position.stage
            ),
        ));
    };
    let per_round = crate::order::batches_per_round(ramp, position.world_size as u64);
    batches_ahead
        .checked_mul(per_round)
        .and_then(|ahead| ahead.checked_add(position.cursor.next_batch))
        .filter(|&at| at <= crate::limits::MAX_POSITION)
        .ok_or_else(|| {
            Error::config(
                "batches_ahead",
                format!("{batches_ahead} batches ahead is past the last batch a stream can have"),
            )
        })
}

/// The index beside a directory of per-rank files: the world that wrote them, each rank's file
/// (`None`: the rank had not started) and the framework's step the save was taken at.
#[derive(Debug, Clone)]
pub struct RunIndex {
    world_size: usize,
    global_step: Option<i64>,
    files: Vec<Option<String>>,
    legacy: Vec<LegacySwitches>,
}

impl RunIndex {
    /// The index of a save of `files.len()` ranks at `global_step`.
    pub fn new(files: Vec<Option<String>>, global_step: Option<i64>) -> Self {
        let legacy = vec![Vec::new(); files.len()];
        Self {
            world_size: files.len(),
            global_step,
            files,
            legacy,
        }
    }

    /// Parses an index (`source` names it in errors).
    pub fn parse(text: &str, source: &str) -> Result<Self> {
        let value = parse_json(text, source)?;
        let header = Header::read(&value, source)?;
        let mut files = Vec::with_capacity(header.world_size);
        for (rank, entry) in header.ranks.iter().enumerate() {
            files.push(match entry.get("file") {
                None | Some(Value::Null) => None,
                Some(Value::String(name)) => Some(name.clone()),
                Some(other) => {
                    return Err(refuse(format!(
                        "{source}: ranks[{rank}].file is {other}, not a file name"
                    )));
                }
            });
        }
        let legacy = if header.version == 1 {
            header.legacy_switches(source)?
        } else {
            vec![Vec::new(); header.world_size]
        };
        Ok(Self {
            world_size: header.world_size,
            global_step: value.get("global_step").and_then(Value::as_i64),
            files,
            legacy,
        })
    }

    /// The index as a document of the current version.
    pub fn to_json(&self) -> String {
        let ranks: Vec<Value> = self.files.iter().map(|f| json!({"file": f})).collect();
        json!({
            "format": RUN_STATE_FORMAT,
            "version": RUN_STATE_VERSION,
            "world_size": self.world_size,
            "global_step": self.global_step,
            "ranks": ranks,
        })
        .to_string()
    }

    /// The world that wrote the files.
    pub fn world_size(&self) -> usize {
        self.world_size
    }

    /// The step the save was taken at, when the writer said.
    pub fn global_step(&self) -> Option<i64> {
        self.global_step
    }

    /// Where rank `rank` of `world_size` resumes from the files the index lists among `files`
    /// (`None`: no rank had started). On the world that wrote them only the rank's own file is
    /// read; on another, every rank's, moved. `read` returns a file's text by name.
    pub fn restore(
        &self,
        files: &RunFiles,
        rank: usize,
        world_size: usize,
        read: &mut dyn FnMut(&str) -> Result<String>,
        source: &str,
    ) -> Result<Option<Checkpoint>> {
        if self.files.iter().all(Option::is_none) {
            return Ok(None);
        }
        let old = self.world_size;
        if self.legacy.iter().all(Vec::is_empty) {
            return files
                .restore(rank, world_size, None, Some(old), read)
                .map(Some);
        }
        // Version 1 kept pending switches here: every old rank's position takes its own, then
        // the state moves them.
        let stops = files.checkpoints(Some(old), read)?;
        let resolved = Some(stops[0].resolved.clone());
        let positions = stops.into_iter().map(|c| Some(c.position)).collect();
        RunState::new(old, resolved, positions, source)?
            .with_legacy_switches(&self.legacy, source)?
            .checkpoint_for(rank, world_size, source)
    }
}

/// What a run state and a run index share: format, version, world size and one entry per rank.
struct Header<'a> {
    world_size: usize,
    version: u64,
    ranks: Vec<&'a Map<String, Value>>,
}

impl<'a> Header<'a> {
    fn read(value: &'a Value, source: &str) -> Result<Self> {
        let Some(object) = value
            .as_object()
            .filter(|o| o.get("format").and_then(Value::as_str) == Some(RUN_STATE_FORMAT))
        else {
            return Err(refuse(format!(
                "{source} holds no {RUN_STATE_FORMAT} state"
            )));
        };
        let version = object.get("version").unwrap_or(&Value::Null);
        let Some(version) = version
            .as_u64()
            .filter(|v| RUN_STATE_READ_VERSIONS.contains(v))
        else {
            return Err(refuse(format!(
                "{source} holds {RUN_STATE_FORMAT} state version {version}; this release reads \
                 versions 1, 2"
            )));
        };
        let world = object.get("world_size").unwrap_or(&Value::Null);
        let world_size = world
            .as_u64()
            .and_then(|w| usize::try_from(w).ok())
            .filter(|&w| w >= 1)
            .ok_or_else(|| refuse(format!("{source}: world_size is {world}")))?;
        let ranks = object.get("ranks").unwrap_or(&Value::Null);
        let Some(ranks) = ranks.as_array() else {
            return Err(refuse(format!(
                "{source}: expected {world_size} rank entries, found {ranks}"
            )));
        };
        check_world(world_size, ranks.len(), source)?;
        let ranks = ranks
            .iter()
            .enumerate()
            .map(|(rank, entry)| {
                entry
                    .as_object()
                    .ok_or_else(|| refuse(format!("{source}: ranks[{rank}] is {entry}")))
            })
            .collect::<Result<_>>()?;
        Ok(Self {
            world_size,
            version,
            ranks,
        })
    }

    /// Version 1's `switches` of every rank entry.
    fn legacy_switches(&self, source: &str) -> Result<Vec<LegacySwitches>> {
        let pair = |v: &Value| -> Option<(usize, u64)> {
            let [stage, at] = v.as_array()?.as_slice() else {
                return None;
            };
            Some((usize::try_from(stage.as_u64()?).ok()?, at.as_u64()?))
        };
        let read = |entry: &Map<String, Value>| -> Option<LegacySwitches> {
            entry
                .get("switches")?
                .as_array()?
                .iter()
                .map(pair)
                .collect()
        };
        self.ranks
            .iter()
            .enumerate()
            .map(|(rank, entry)| {
                read(entry).ok_or_else(|| {
                    let found = entry.get("switches").unwrap_or(&Value::Null);
                    refuse(format!(
                        "{source}: ranks[{rank}].switches is {found}, expected [[stage, at], ...]"
                    ))
                })
            })
            .collect()
    }
}

fn check_world(world_size: usize, entries: usize, source: &str) -> Result<()> {
    if world_size == 0 || entries != world_size {
        return Err(refuse(format!(
            "{source}: expected {world_size} rank entries, found {entries}"
        )));
    }
    Ok(())
}

fn parse_json(text: &str, source: &str) -> Result<Value> {
    serde_json::from_str(text).map_err(|e| refuse(format!("{source} is not JSON: {e}")))
}

fn parse_resolved(text: &str, source: &str) -> Result<Arc<ResolvedConfig>> {
    let resolved: ResolvedConfig = serde_json::from_str(text)
        .map_err(|e| refuse(format!("{source}: malformed resolved config: {e}")))?;
    resolved.validate()?;
    Ok(Arc::new(resolved))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A two-stage stream of 2-row batches; stage 1 is ramped when `ramped`.
    fn resolved(ramped: bool) -> Arc<ResolvedConfig> {
        let ramp = if ramped {
            r#"{"start": 2, "increment": 2, "rows": 8}"#
        } else {
            "null"
        };
        let stage = |ramp: &str| {
            format!(
                r#"{{"sources": [{{"weight": 1.0, "shards": [{{"path": "/d/a.parquet",
                "encoding": "parquet", "rows": 64, "bytes": 533}}]}}], "batch_size": 4,
                "ramp": {ramp}, "shuffle": null, "infinite": false}}"#
            )
        };
        let text = format!(
            r#"{{"version": 1, "fields": [{{"name": "v", "source": "v", "dtype": "i64",
            "shape": [], "pad": 0}}], "stages": [{}, {}], "seed": 0, "threads": 1,
            "prefetch_batches": 2, "rank": 0, "world_size": 2, "memory_limit_bytes": null}}"#,
            stage("null"),
            stage(ramp)
        );
        Arc::new(serde_json::from_str(&text).unwrap())
    }

    /// Rank `rank` of 2 after `batches` local batches of stage 0.
    fn after(resolved: &Arc<ResolvedConfig>, rank: usize, batches: u64) -> Position {
        let mut position = Checkpoint::at_start(resolved.clone())
            .unwrap()
            .for_world(rank, 2)
            .unwrap()
            .position;
        position.cursor.next_batch = 2 * batches;
        position.batches_yielded = batches;
        position.rows_yielded = 4 * batches;
        position
    }

    fn state_text(resolved: &Arc<ResolvedConfig>, version: u64, ranks: &[Value]) -> String {
        json!({"format": RUN_STATE_FORMAT, "version": version, "world_size": ranks.len(),
               "resolved": resolved.to_json(), "ranks": ranks})
        .to_string()
    }

    #[test]
    fn a_state_round_trips_and_moves_to_another_world() {
        let resolved = resolved(false);
        let positions = vec![Some(after(&resolved, 0, 3)), Some(after(&resolved, 1, 3))];
        let state = RunState::new(2, Some(resolved.clone()), positions, "s").unwrap();
        let read = RunState::parse(&state.to_json(), "s").unwrap();
        assert_eq!(read.positions(), state.positions());
        let own = read.checkpoint_for(1, 2, "s").unwrap().unwrap();
        assert_eq!(own.position, after(&resolved, 1, 3));
        let moved = read.checkpoint_for(2, 4, "s").unwrap().unwrap();
        assert_eq!(
            (
                moved.rank(),
                moved.world_size(),
                moved.position.cursor.next_batch
            ),
            (2, 4, 6)
        );
    }

    #[test]
    fn ranks_at_different_places_do_not_move() {
        let resolved = resolved(false);
        let positions = vec![Some(after(&resolved, 0, 3)), Some(after(&resolved, 1, 4))];
        let state = RunState::new(2, Some(resolved), positions, "s").unwrap();
        let error = state
            .checkpoint_for(0, 3, "the ckpt")
            .unwrap_err()
            .to_string();
        assert!(
            error.contains("rank 0 at global batch 6 (stage 0), rank 1 at global batch 8")
                && error.contains("(the ckpt, written by 2 ranks; resume with 2 ranks)"),
            "{error}"
        );
        assert!(
            state.checkpoint_for(0, 2, "s").is_ok(),
            "its own world reads"
        );
    }

    #[test]
    fn version_one_switches_become_global_batches() {
        let resolved = resolved(false);
        let ranks: Vec<Value> = (0..2)
            .map(|r| {
                // Batch 5 in the rank's own count: two local batches, two rounds of two global
                // batches, after its position (global batch 6).
                json!({"position": after(&resolved, r, 3).to_json(), "switches": [[1, 5], [0, 1]]})
            })
            .collect();
        let state = RunState::parse(&state_text(&resolved, 1, &ranks), "s").unwrap();
        for position in state.positions().iter().flatten() {
            // The switch the rank had passed (its own batch 1) is in its position already.
            assert_eq!(
                position.switches,
                [super::super::Switch { stage: 1, at: 10 }]
            );
        }
    }

    #[test]
    fn a_version_one_switch_before_any_start_needs_the_document() {
        let text = json!({"format": RUN_STATE_FORMAT, "version": 1, "world_size": 1,
            "resolved": null, "ranks": [{"position": null, "switches": [[1, 0]]}]})
        .to_string();
        let error = RunState::parse(&text, "s").unwrap_err().to_string();
        assert!(
            error.contains("no resolved config to place it in"),
            "{error}"
        );
    }

    #[test]
    fn malformed_states_are_refused_naming_what() {
        let resolved = resolved(false);
        let position = after(&resolved, 0, 1).to_json();
        let cases = [
            (
                "[]".to_owned(),
                "holds no o41-training-data-lightning state",
            ),
            (
                json!({"format": RUN_STATE_FORMAT, "version": 3}).to_string(),
                "state version 3; this release reads versions 1, 2",
            ),
            (
                json!({"format": RUN_STATE_FORMAT, "version": 2, "world_size": 1u64 << 60,
                       "ranks": []})
                .to_string(),
                "expected 1152921504606846976 rank entries, found 0",
            ),
            (
                json!({"format": RUN_STATE_FORMAT, "version": 2, "world_size": 2,
                       "ranks": [{"position": position}, {"position": null}]})
                .to_string(),
                "positions without the resolved config",
            ),
            (
                json!({"format": RUN_STATE_FORMAT, "version": 1, "world_size": 1,
                       "ranks": [{"position": null, "switches": [[1]]}]})
                .to_string(),
                "ranks[0].switches is [[1]], expected [[stage, at], ...]",
            ),
            (
                json!({"format": RUN_STATE_FORMAT, "version": 2, "world_size": 1,
                       "ranks": [7]})
                .to_string(),
                "ranks[0] is 7",
            ),
            ("{".to_owned(), "is not JSON"),
        ];
        for (text, expected) in cases {
            let error = RunState::parse(&text, "the state").unwrap_err().to_string();
            assert!(error.contains(expected), "{text}: {error}");
        }
    }

    #[test]
    fn an_index_round_trips_and_restores_nothing_before_any_start() {
        let index = RunIndex::new(vec![Some("stream-rank0-of-2.json".into()), None], Some(7));
        let read = RunIndex::parse(&index.to_json(), "i").unwrap();
        assert_eq!((read.world_size(), read.global_step()), (2, Some(7)));
        let files = RunFiles::among(Vec::new(), "d").unwrap();
        let empty = RunIndex::new(vec![None, None], None);
        let mut read_nothing = |name: &str| -> Result<String> { panic!("read {name}") };
        assert!(empty
            .restore(&files, 0, 3, &mut read_nothing, "i")
            .unwrap()
            .is_none());
    }

    #[test]
    fn a_version_one_index_reads_the_shared_document_once_and_moves_its_switches() {
        let resolved = resolved(false);
        let mut texts = std::collections::BTreeMap::new();
        let mut ranks = Vec::new();
        for rank in 0..2 {
            let checkpoint =
                Checkpoint::from_position(resolved.clone(), after(&resolved, rank, 3)).unwrap();
            let name = super::super::Naming::Stream.file_name(rank, 2);
            texts.insert(name.clone(), checkpoint.to_split_json());
            let shared = super::super::shared_name(&checkpoint.position.fingerprint);
            texts.insert(shared, checkpoint.shared_json());
            ranks.push(json!({"file": name, "switches": [[1, 5]]}));
        }
        let text = json!({"format": RUN_STATE_FORMAT, "version": 1, "world_size": 2,
            "global_step": 7, "ranks": ranks})
        .to_string();
        let index = RunIndex::parse(&text, "i").unwrap();
        let files = RunFiles::among(texts.keys().cloned().collect(), "d").unwrap();
        let mut reads = Vec::new();
        let mut read = |name: &str| -> Result<String> {
            reads.push(name.to_owned());
            Ok(texts[name].clone())
        };
        let moved = index
            .restore(&files, 1, 4, &mut read, "i")
            .unwrap()
            .unwrap();
        assert_eq!((moved.rank(), moved.world_size()), (1, 4));
        assert_eq!(
            moved.position.switches,
            [super::super::Switch { stage: 1, at: 10 }]
        );
        let shared = reads.iter().filter(|n| n.starts_with("resolved-")).count();
        assert_eq!(shared, 1, "{reads:?}");
    }

    #[test]
    fn switch_at_counts_rounds_and_refuses_what_does_not_exist() {
        let resolved = resolved(true);
        let position = after(&resolved, 0, 3);
        assert_eq!(switch_at(&[false, true], &position, 1, 2).unwrap(), 6 + 4);
        let mut ramped = position.clone();
        ramped.stage = 1;
        assert_eq!(switch_at(&[false, true], &ramped, 0, 2).unwrap(), 6 + 2);
        assert!(switch_at(&[false, true], &position, 2, 0).is_err());
        assert!(switch_at(&[false, true], &position, 1, u64::MAX).is_err());
    }
}
