//! The planner: this stream's global batches in order, each slot's row from the order
//! function, and a window's rows grouped by shard into sorted read jobs.

use std::collections::VecDeque;
use std::ops::Range;
use std::sync::Arc;

use super::columns::{fill_synthetic, fill_windows, window_tokens};
use super::Plan;
use crate::columns::Chunk;
use crate::formats::Prefetch;
use crate::memory::MAX_JOB_ROWS;
use crate::order::{LayoutCache, Segment};
use crate::storage::Storage;

/// Rows of one shard to decode.
pub struct Job {
    /// Dispatch number, unique within a pipeline run.
    pub id: u64,
    /// Flat shard id.
    pub shard: usize,
    /// Sorted, disjoint shard row ranges.
    pub ranges: Vec<Range<u64>>,
    /// The job's bytes, being fetched since it was dispatched (remote Parquet shards).
    pub prefetch: Option<Prefetch>,
}

/// Where one decoded row goes: (row index in the job's chunk, batch sequence number, slot).
pub type Dest = (u32, u64, u32);

/// A batch being filled.
pub struct Pending {
    /// Sequence number within the pipeline run.
    pub seq: u64,
    /// The rank's local batch number since the origin.
    pub local: u64,
    /// Global batch number.
    pub global: u64,
    /// The batch's columns, synthetic ones already filled.
    pub buffer: Chunk,
    /// Slots still waiting for a decoded row.
    pub missing: usize,
    /// What the batch holds of each source it draws from.
    pub mix: Vec<MixCount>,
}

/// The rows (and, in a token stage, the tokens) a batch holds of one source.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct MixCount {
    /// The source's flat index over every stage's sources ([`Shards::source_index`]).
    pub source: usize,
    /// Rows of the batch drawn from it.
    pub rows: u64,
    /// Tokens of a token stage's windows drawn from it (padding excluded); 0 for records.
    pub tokens: u64,
}

/// Counts one row of `source` holding `tokens` tokens into `mix`.
fn count_row(mix: &mut Vec<MixCount>, source: usize, tokens: u64) {
    // A batch draws from few sources: a scan beats a map.
    match mix.iter_mut().find(|m| m.source == source) {
        Some(count) => {
            count.rows += 1;
            count.tokens += tokens;
        }
        None => mix.push(MixCount {
            source,
            rows: 1,
            tokens,
        }),
    }
}

/// Decides the rows of this stream's batches, group by group.
pub struct Planner {
    /// The stream's plan.
    pub plan: Arc<Plan>,
    /// The segment batches are cut from.
    pub segment: Segment,
    /// The local batch from which this stream reads `segment`, and the global batch that
    /// begins its round there: local batches map to global ones from this pair on.
    pub span: (u64, u64),
    /// Next local batch to plan.
    pub next_local: u64,
    /// Distance between the local batches this stream yields.
    pub stride: u64,
    /// First global batch no rank receives (finite segments).
    pub end_batch: Option<u64>,
    next_seq: u64,
    layouts: LayoutCache,
}

impl Planner {
    /// A planner that starts at local batch `next_local` of `segment`, which this stream reads
    /// from local batch `span.0` (global round `span.1`) on.
    pub fn new(
        plan: Arc<Plan>,
        segment: Segment,
        span: (u64, u64),
        next_local: u64,
        stride: u64,
        end_batch: Option<u64>,
    ) -> Self {
        Planner {
            plan,
            segment,
            span,
            next_local,
            stride,
            end_batch,
            next_seq: 0,
            layouts: LayoutCache::default(),
        }
    }

    /// A batch's buffer of `rows` rows, its values undefined: every slot is written whole
    /// before the batch is delivered (a padding row's zeros, or its synthetic values,
    /// [`fill_windows`] and the rows its reads copy in), so filling it first would be a second
    /// pass over every batch.
    fn batch_buffer(plan: &Plan, rows: usize) -> Chunk {
        Chunk::dirty_from(&plan.batch_buffers, &plan.projection, rows)
    }

    /// Plans the next group of batches: appends them to `pending` and their reads to `jobs`.
    /// Returns false once the stream has no more batches.
    pub fn plan_group(
        &mut self,
        storage: &Storage,
        pending: &mut VecDeque<Pending>,
        jobs: &mut VecDeque<(Job, Vec<Dest>)>,
        next_job: &mut u64,
    ) -> bool {
        let plan = self.plan.clone();
        let order = &plan.order;
        let split = order.split(&self.segment);
        let reads = !plan.records.columns.is_empty();
        let mut wanted: Vec<(usize, u64, u64, u32)> = Vec::new();
        let mut pieces = Vec::new();
        let mut planned_rows = 0;
        // The first group is one batch: the consumer's first batch then waits for its own
        // rows alone, not for a whole group's (a shuffle window of them) to be decoded. The
        // rows each batch holds do not depend on how batches are grouped.
        let group_rows = if self.next_seq == 0 {
            1
        } else {
            plan.group_rows
        };
        while planned_rows < group_rows {
            let (first_local, round) = self.span;
            let global = if split {
                round + (self.next_local - first_local)
            } else {
                round + (self.next_local - first_local) * plan.world() + plan.rank()
            };
            if self.end_batch.is_some_and(|end| global >= end) {
                break;
            }
            if let Some([_, end]) = crate::skips::holding(&plan.resolved.skip_batches, global) {
                // Passed by whole: the first of this stream's local batches at or after `end`.
                let per_local = if split { 1 } else { plan.world() };
                let steps = (end - global).div_ceil(per_local * self.stride);
                self.next_local += steps * self.stride;
                continue;
            }
            let seq = self.next_seq;
            let rows = order.rank_rows(&self.segment, global, plan.rank(), plan.world());
            let mut buffer = Self::batch_buffer(&plan, (rows.end - rows.start) as usize);
            let mut missing = 0;
            let mut mix = Vec::new();
            for (slot, t) in rows.clone().enumerate() {
                if order.padding(&self.segment, t) {
                    buffer.zero_row(&plan.projection, slot);
                    continue;
                }
                let at = order.slot_at(&self.segment, t, &mut self.layouts);
                fill_synthetic(&plan, &mut buffer, slot, &at);
                let shard = plan.shards.id(at.stage, at.row.source, at.row.at.shard);
                fill_windows(
                    &plan,
                    &mut buffer,
                    (slot, shard, at.row.at.row),
                    &mut pieces,
                );
                let tokens = window_tokens(&plan, shard, at.row.at.row, &mut pieces);
                count_row(
                    &mut mix,
                    plan.shards.source_index(at.stage, at.row.source),
                    tokens,
                );
                wanted.push((shard, at.row.at.row, seq, slot as u32));
                missing += usize::from(reads);
            }
            pending.push_back(Pending {
                seq,
                local: self.next_local,
                global,
                buffer,
                missing,
                mix,
            });
            self.next_seq += 1;
            self.next_local += self.stride;
            // At least one row, so a stream of empty shares still moves on.
            planned_rows += (rows.end - rows.start).max(1);
        }
        if planned_rows == 0 {
            return false;
        }
        if reads {
            // Shards this group reads for the first time are inspected now, together: open
            // inspected none but one per source.
            let shards: Vec<usize> = wanted.iter().map(|w| w.0).collect();
            plan.inspect_all(storage, &shards);
            split_jobs(wanted, jobs, next_job, |shard, row| {
                plan.inspected(shard).map_or(0, |m| m.block_of(row))
            });
        }
        true
    }
}

/// Groups wanted rows by shard into sorted, merged ranges of at most `MAX_JOB_ROWS` unique rows.
/// A contiguous run of rows is cut where it enters a new storage block (`block_of(shard, row)`,
/// a Parquet row group), so a sequential job reads no more blocks than its rows need.
fn split_jobs(
    mut wanted: Vec<(usize, u64, u64, u32)>,
    jobs: &mut VecDeque<(Job, Vec<Dest>)>,
    next_job: &mut u64,
    block_of: impl Fn(usize, u64) -> u64,
) {
    wanted.sort_unstable();
    let mut i = 0;
    while i < wanted.len() {
        let shard = wanted[i].0;
        let mut ranges: Vec<Range<u64>> = Vec::new();
        let mut dests: Vec<Dest> = Vec::new();
        let mut unique = 0u32;
        let block = block_of(shard, wanted[i].1);
        while i < wanted.len() && wanted[i].0 == shard {
            let (_, row, seq, slot) = wanted[i];
            // A contiguous read stops at the block's end; scattered (shuffled) rows do not, or
            // their jobs would shrink to a few rows each.
            if ranges.last().is_some_and(|r| r.end == row) && block_of(shard, row) != block {
                break;
            }
            match ranges.last_mut() {
                // The same row again (a small source repeating inside one group).
                Some(r) if r.end == row + 1 => {}
                Some(r) if r.end == row => {
                    if u64::from(unique) == MAX_JOB_ROWS {
                        break;
                    }
                    r.end += 1;
                    unique += 1;
                }
                _ => {
                    if u64::from(unique) == MAX_JOB_ROWS {
                        break;
                    }
                    ranges.push(row..row + 1);
                    unique += 1;
                }
            }
            dests.push((unique - 1, seq, slot));
            i += 1;
        }
        jobs.push_back((
            Job {
                id: *next_job,
                shard,
                ranges,
                prefetch: None,
            },
            dests,
        ));
        *next_job += 1;
    }
}
