//! The order function: which row of which shard fills each slot of each global batch.
//!
//! Everything here is a pure function of the resolved config and a small cursor, so a stream
//! can start at any global batch without replaying what came before (`docs/order.md`).
//!
//! - `source`: a source's epochs and per-epoch shard order;
//! - `mix`: the deterministic weighted interleave of a stage's sources;
//! - `stage`: the shuffle window over a stage's mixed rows;
//! - `ramp`: how a stage's rows are cut into global batches (one size, or a batch ramp);
//! - `pack`: the windows a token shard's rows are (packed documents, or the stream cut into
//!   overlapping windows), planned per shard before the rest of the order sees them;
//! - this module: stages joined by `advance` into segments, global batches, the end of a
//!   finite stage, and the rank partition.

mod keyed;
mod mix;
pub mod pack;
mod ramp;
mod source;
mod stage;

use std::collections::HashMap;
use std::ops::Range;
use std::sync::Arc;

use serde::{Deserialize, Serialize};

pub use keyed::{key, mix64};
pub use ramp::{batches_per_round, Batching};
pub use source::{EpochLayout, SourceRow};
pub use stage::{
    default_unit_rows, partition_window_rows, window_rows, StageOrder, StageRow, DEFAULT_UNIT_ROWS,
};

use crate::config::ResolvedConfig;
use crate::error::{Error, Result};

pub use crate::limits::MAX_POSITION;

/// The rows of an old stage still in its shuffle window when `advance` switched stages; they
/// fill the first batches after the switch. Positions count rows of one partition of that stage
/// (the stage's output positions when the stream has one partition); with several, every
/// partition drains the same range of its own rows.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Drain {
    /// Stage the rows belong to.
    pub stage: usize,
    /// First output position (of that stage) still to deliver.
    pub from: u64,
    /// End of the drained range.
    pub to: u64,
}

impl Drain {
    fn len(&self) -> u64 {
        self.to - self.from
    }
}

/// The stretch of the stream between two advances: global batches from `start_batch` on are
/// cut from the drained rows (if any) followed by `stage`'s rows from its position 0.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Segment {
    /// Active stage.
    pub stage: usize,
    /// First global batch of the segment.
    pub start_batch: u64,
    /// Rows of the previous stage drained first.
    pub drain: Option<Drain>,
}

impl Segment {
    /// The segment a fresh stream starts in.
    pub fn first() -> Self {
        Segment {
            stage: 0,
            start_batch: 0,
            drain: None,
        }
    }
}

/// One slot of a global batch: the stage row it holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Slot {
    /// Stage the row belongs to (the drained stage for drained rows).
    pub stage: usize,
    /// Source, index and shard row.
    pub row: StageRow,
}

/// The order of a whole stream.
#[derive(Debug, Clone)]
pub struct Order {
    stages: Vec<StageOrder>,
    /// Partitions of every stage: global batch `g` of a segment starting at `S` is cut from
    /// partition `(g - S) mod partitions`.
    partitions: u64,
    /// A validation pass: finite segments end with a padded round instead of dropping it.
    validation: bool,
}

/// Caches epoch layouts, which cost O(shards) to build, for a planner's lookups.
#[derive(Debug, Default)]
pub struct LayoutCache {
    layouts: HashMap<(usize, usize, u64), Arc<EpochLayout>>,
}

impl Order {
    /// The order of `config`.
    pub fn new(config: &ResolvedConfig) -> Result<Self> {
        let stages = config
            .stages
            .iter()
            .enumerate()
            .map(|(s, stage)| {
                StageOrder::new(
                    stage,
                    s,
                    config.seed,
                    (config.partitions, config.partition_layout),
                )
            })
            .collect::<Result<Vec<_>>>()?;
        Ok(Order {
            stages,
            partitions: config.partitions.max(1),
            validation: config.validation_pass,
        })
    }

    /// True for a validation pass (every row once, the final round padded).
    pub fn validation(&self) -> bool {
        self.validation
    }

    /// Partitions of every stage (1 when the stream is not partitioned).
    pub fn partitions(&self) -> u64 {
        self.partitions
    }

    /// Rows of each partition of `segment`: its drain and its stage's partition; `None` when
    /// the stage is infinite.
    fn partition_rows(&self, segment: &Segment) -> Option<u64> {
        let drained = segment.drain.map_or(0, |d| d.len());
        self.stages[segment.stage]
            .partition_rows()
            .map(|rows| rows + drained)
    }

    /// The stages' orders.
    pub fn stages(&self) -> &[StageOrder] {
        &self.stages
    }

    /// The largest batch while `segment` is active: its stage's `batch_size`.
    pub fn batch_size(&self, segment: &Segment) -> u64 {
        self.stages[segment.stage].batch_size
    }

    fn batching(&self, segment: &Segment) -> &Batching {
        &self.stages[segment.stage].batching
    }

    /// True when every rank reads a share of every global batch of `segment` (a ramped
    /// stage) rather than whole batches in turn.
    pub fn split(&self, segment: &Segment) -> bool {
        self.batching(segment).is_ramp()
    }

    /// Rows of global batch `g` of `segment`.
    pub fn batch_rows(&self, segment: &Segment, g: u64) -> u64 {
        self.batching(segment).size(g - segment.start_batch)
    }

    /// Rows of the segment before global batch `g` (at or after its start); positions were
    /// checked to stay below [`MAX_POSITION`], so this cannot overflow for a stream's batches.
    pub fn first_row(&self, segment: &Segment, g: u64) -> u64 {
        let t = g.max(segment.start_batch) - segment.start_batch;
        self.batching(segment).start(t).unwrap_or(u64::MAX)
    }

    /// Rows of the segment (drain plus the stage), `None` when the stage is infinite.
    pub fn segment_rows(&self, segment: &Segment) -> Option<u64> {
        let stage = &self.stages[segment.stage];
        self.partition_rows(segment)
            .map(|rows| rows * self.partitions + stage.unpartitioned_rows())
    }

    /// Whole global batches of a finite segment: each partition fills its own, and the segment
    /// ends with the first batch whose partition cannot fill it.
    fn whole_batches(&self, segment: &Segment) -> Option<u64> {
        let batching = self.batching(segment);
        if self.partitions == 1 {
            return self
                .segment_rows(segment)
                .map(|rows| batching.whole_batches(rows));
        }
        let per = self.partition_rows(segment)? / self.batch_size(segment);
        Some(per * self.partitions)
    }

    /// The first global batch no rank receives. A finite segment ends at its last complete
    /// round of `world_size` batches (rounds start at `origin`); a ramped one, whose every batch
    /// is a round of its own, at its last complete batch; a validation pass at the round
    /// holding its last row.
    pub fn end_batch(&self, segment: &Segment, origin: u64, world_size: u64) -> Option<u64> {
        let rows = self.segment_rows(segment)?;
        let batching = self.batching(segment);
        if self.validation {
            let end = segment.start_batch + batching.batches_covering(rows);
            return Some(origin + end.saturating_sub(origin).div_ceil(world_size) * world_size);
        }
        let end = segment.start_batch + self.whole_batches(segment)?;
        if batching.is_ramp() {
            return Some(end);
        }
        Some(origin + end.saturating_sub(origin) / world_size * world_size)
    }

    /// Rows of a finite segment that no rank receives, given its end batch: none in a
    /// validation pass, which pads its final round instead.
    pub fn dropped_rows(&self, segment: &Segment, end_batch: u64) -> u64 {
        if self.validation {
            return 0;
        }
        self.segment_rows(segment).map_or(0, |rows| {
            rows.saturating_sub(self.first_row(segment, end_batch))
        })
    }

    /// The segment rows rank `rank` of `world_size` receives in global batch `g`: the whole
    /// batch, or in a ramped segment the rank's equal, contiguous share of it.
    pub fn rank_rows(&self, segment: &Segment, g: u64, rank: u64, world_size: u64) -> Range<u64> {
        let first = self.first_row(segment, g);
        let size = self.batch_rows(segment, g);
        if self.split(segment) {
            let share = size / world_size;
            first + rank * share..first + (rank + 1) * share
        } else {
            first..first + size
        }
    }

    /// True when segment row `t` is padding: past the end of a validation pass's data.
    pub fn padding(&self, segment: &Segment, t: u64) -> bool {
        self.validation && self.segment_rows(segment).is_some_and(|rows| t >= rows)
    }

    /// Rows (padding excluded) a rank receives in `count` of its batches of `segment`, the
    /// first being global batch `g`: in turn (`world_size` apart), or shares of consecutive
    /// batches in a ramped segment.
    pub fn rows_received(&self, segment: &Segment, g: u64, count: u64, world_size: u64) -> u64 {
        if count == 0 {
            return 0;
        }
        if self.split(segment) {
            let end = self.first_row(segment, g + count);
            return (end - self.first_row(segment, g)) / world_size;
        }
        let bs = self.batch_size(segment);
        let Some(rows) = self.segment_rows(segment).filter(|_| self.validation) else {
            return count * bs;
        };
        // Batches `t = g - start + i * world_size`: whole while `t < full`, `rest` rows at
        // `t == full`, empty after.
        let (full, rest) = (rows / bs, rows % bs);
        let t0 = g - segment.start_batch;
        let whole = if t0 >= full {
            0
        } else {
            count.min((full - t0).div_ceil(world_size))
        };
        let partial = rest > 0
            && full >= t0
            && (full - t0).is_multiple_of(world_size)
            && (full - t0) / world_size < count;
        whole * bs + if partial { rest } else { 0 }
    }

    /// The stage row in slot `slot` of global batch `g` (which must be in `segment`).
    pub fn slot(&self, segment: &Segment, g: u64, slot: u64, cache: &mut LayoutCache) -> Slot {
        self.slot_at(segment, self.first_row(segment, g) + slot, cache)
    }

    /// The stage row at segment row `t` (not padding).
    pub fn slot_at(&self, segment: &Segment, t: u64, cache: &mut LayoutCache) -> Slot {
        // The partition of the batch holding `t`, and `t`'s row in it: a segment's batches go
        // to its partitions in turn.
        let (p, x) = if self.partitions == 1 {
            (0, t)
        } else {
            let bs = self.batch_size(segment);
            let n = t / bs;
            (n % self.partitions, n / self.partitions * bs + t % bs)
        };
        let (stage, x) = match segment.drain {
            Some(d) if x < d.len() => (d.stage, d.from + x),
            Some(d) => (segment.stage, x - d.len()),
            None => (segment.stage, x),
        };
        let order = &self.stages[stage];
        let row = order.partition_row(p, x, &mut |source, epoch| {
            let layouts = &mut cache.layouts;
            if layouts.len() > 256 {
                layouts.clear();
            }
            layouts
                .entry((stage, source, epoch))
                .or_insert_with(|| order.sources()[source].layout(epoch))
                .clone()
        });
        Slot { stage, row }
    }

    /// Whether a segment starting at global batch `start` may switch stages at `g`: every
    /// partition has then read the same rows, so one drained range serves them all.
    pub fn switch_aligned(&self, start: u64, g: u64) -> bool {
        g.saturating_sub(start).is_multiple_of(self.partitions)
    }

    /// The segment that starts at global batch `at` (a round boundary) when the stream switches
    /// to `stage`: rows left in the current stage's shuffle window drain first.
    pub fn advance(&self, segment: &Segment, at: u64, stage: usize) -> Result<Segment> {
        if stage >= self.stages.len() {
            return Err(Error::config(
                "stage",
                format!(
                    "there is no stage {stage}; the stream has {} stages",
                    self.stages.len()
                ),
            ));
        }
        if stage == segment.stage {
            return Ok(*segment);
        }
        if !self.switch_aligned(segment.start_batch, at) {
            return Err(Error::config(
                "advance",
                format!(
                    "global batch {at} is not a multiple of {} batches after the active stage \
                     began at {}: a partitioned stream switches stages there",
                    self.partitions, segment.start_batch
                ),
            ));
        }
        // Rows every partition has read: the same for all at an aligned switch.
        let x = self.first_row(segment, at) / self.partitions;
        let drain = match segment.drain {
            Some(d) if x < d.len() => Drain {
                stage: d.stage,
                from: d.from + x,
                to: d.to,
            },
            other => {
                let x = x - other.map_or(0, |d| d.len());
                let current = &self.stages[segment.stage];
                let x = current.partition_rows().map_or(x, |n| x.min(n));
                Drain {
                    stage: segment.stage,
                    from: x,
                    to: current.window_end(x),
                }
            }
        };
        Ok(Segment {
            stage,
            start_batch: at,
            drain: (drain.len() > 0).then_some(drain),
        })
    }

    /// Completed epochs of each source of the segment's stage once global batch `g` starts.
    pub fn epochs(&self, segment: &Segment, g: u64) -> Vec<u64> {
        let x = self.first_row(segment, g) / self.partitions;
        let x = x.saturating_sub(segment.drain.map_or(0, |d| d.len()));
        self.stages[segment.stage].epochs(x)
    }

    /// Checks that a cursor read from a checkpoint fits this order.
    pub fn check_segment(&self, segment: &Segment) -> Result<()> {
        let bad = |m: String| Error::Checkpoint { message: m };
        if segment.stage >= self.stages.len() {
            return Err(bad(format!(
                "cursor stage {} does not exist",
                segment.stage
            )));
        }
        if let Some(d) = segment.drain {
            let order = self.stages.get(d.stage);
            let fits = order.is_some_and(|o| {
                d.from <= d.to
                    && d.to <= MAX_POSITION
                    && o.partition_rows().is_none_or(|total| d.to <= total)
                    && o.window_end(d.from) >= d.to
            });
            if !fits {
                return Err(bad(format!(
                    "cursor drain {d:?} is not a part of one shuffle window of stage {}",
                    d.stage
                )));
            }
        }
        Ok(())
    }

    /// Checks that a cursor read from a checkpoint (its segment and next global batch) is one
    /// this order reaches: positions stay below [`MAX_POSITION`], and a finite segment's cursor
    /// is not past its end (a validation pass's padded final round of `world_size` batches
    /// included).
    pub fn check_cursor(&self, segment: &Segment, next_batch: u64, world_size: u64) -> Result<()> {
        self.check_segment(segment)?;
        let bad = |m: String| Error::Checkpoint { message: m };
        if segment.start_batch > next_batch {
            return Err(bad(format!(
                "the cursor's segment starts at global batch {}, after its next batch {next_batch}",
                segment.start_batch
            )));
        }
        let batches = next_batch - segment.start_batch;
        let rows = self.batching(segment).start(batches);
        if next_batch > MAX_POSITION || rows.is_none_or(|rows| rows > MAX_POSITION) {
            return Err(bad(format!(
                "next batch {next_batch} is beyond any position a stream reaches (2^62 rows)"
            )));
        }
        if let (Some(total), Some(whole)) =
            (self.segment_rows(segment), self.whole_batches(segment))
        {
            let batching = self.batching(segment);
            let full = if self.validation {
                batching.batches_covering(total) + world_size.max(1) - 1
            } else {
                whole
            };
            if batches > full {
                return Err(bad(format!(
                    "next batch {next_batch} is past the end of finite stage {}, which has {full} \
                     batches from global batch {}",
                    segment.stage, segment.start_batch
                )));
            }
        }
        Ok(())
    }
}
