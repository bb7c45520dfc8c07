//! The row plan of a stage: for each mixed row, which source, which decode unit and which row of
//! that unit it is. Pure and deterministic; the pipeline runs one copy ahead to dispatch decode
//! units and one copy to assemble batches, and both see the same sequence.

use std::ops::Range;
use std::sync::Arc;

use crate::config::ResolvedStage;
use crate::formats::{unit_ranges, ShardMeta};
use crate::mix::Mix;

/// A range of rows of one shard, decoded as a whole by one worker.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UnitSpec {
    /// Source within the stage.
    pub source: usize,
    /// Shard within the source.
    pub shard: usize,
    /// Rows of the shard.
    pub rows: Range<u64>,
}

/// One mixed row.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RowStep {
    /// Sequence number of the unit holding the row (units are numbered in order of first use).
    pub seq: u64,
    /// Row within that unit.
    pub offset: usize,
    /// True for the unit's last row: after it the unit is no longer needed.
    pub last: bool,
    /// Set on the unit's first row: the unit to decode.
    pub new_unit: Option<UnitSpec>,
}

#[derive(Debug, Clone)]
struct SourceCursor {
    units: Arc<Vec<UnitSpec>>,
    infinite: bool,
    taken: u64,
    seq: u64,
    offset: usize,
    remaining: usize,
}

impl SourceCursor {
    fn has_more(&self) -> bool {
        self.infinite || self.taken < self.units.len() as u64
    }
}

/// Iterator over a stage's mixed rows.
#[derive(Debug, Clone)]
pub struct RowPlan {
    mix: Mix,
    sources: Vec<SourceCursor>,
    next_seq: u64,
}

impl RowPlan {
    /// The plan of `stage`, decoding at most `unit_rows` rows per unit.
    pub fn new(stage: &ResolvedStage, metas: &[Vec<ShardMeta>], unit_rows: u64) -> Self {
        let weights: Vec<f64> = stage.sources.iter().map(|s| s.weight).collect();
        let sources = metas
            .iter()
            .enumerate()
            .map(|(j, shards)| {
                let units = shards
                    .iter()
                    .enumerate()
                    .flat_map(|(f, meta)| {
                        unit_ranges(meta, unit_rows)
                            .into_iter()
                            .map(move |rows| UnitSpec {
                                source: j,
                                shard: f,
                                rows,
                            })
                    })
                    .collect();
                SourceCursor {
                    units: Arc::new(units),
                    infinite: stage.infinite,
                    taken: 0,
                    seq: 0,
                    offset: 0,
                    remaining: 0,
                }
            })
            .collect::<Vec<_>>();
        let mut mix = Mix::new(&weights);
        for (j, s) in sources.iter().enumerate() {
            if s.units.is_empty() {
                mix.remove(j);
            }
        }
        RowPlan {
            mix,
            sources,
            next_seq: 0,
        }
    }
}

impl Iterator for RowPlan {
    type Item = RowStep;

    fn next(&mut self) -> Option<RowStep> {
        let j = self.mix.pick()?;
        let cursor = &mut self.sources[j];
        let mut new_unit = None;
        if cursor.remaining == 0 {
            let unit = cursor.units[(cursor.taken % cursor.units.len() as u64) as usize].clone();
            cursor.taken += 1;
            cursor.seq = self.next_seq;
            self.next_seq += 1;
            cursor.offset = 0;
            cursor.remaining = (unit.rows.end - unit.rows.start) as usize;
            new_unit = Some(unit);
        }
        let step = RowStep {
            seq: cursor.seq,
            offset: cursor.offset,
            last: cursor.remaining == 1,
            new_unit,
        };
        cursor.offset += 1;
        cursor.remaining -= 1;
        if cursor.remaining == 0 && !cursor.has_more() {
            self.mix.remove(j);
        }
        Some(step)
    }
}
