//! What an open stream knows and never changes, and the planner.
//!
//! [`Plan`] holds the resolved config, its order, the projected fields, every shard's metadata
//! and the pipeline's sizes. [`Planner`] walks this stream's own global batches in order: for
//! each it asks the order function which shard row fills every slot, then groups the rows of a
//! window's worth of batches by shard into sorted ranges, the read jobs. A rank therefore reads
//! only its own rows, and content is fixed before any thread decodes a byte.

use std::collections::VecDeque;
use std::ops::Range;
use std::sync::{Arc, OnceLock};

use arrow_schema::SchemaRef;

use crate::columns::{batch_schema, Chunk};
use crate::config::ResolvedConfig;
use crate::dtype::{DType, Element};
use crate::encoding::Encoding;
use crate::error::{Error, Result};
use crate::fields::{ProjectedColumn, Projection, Synthetic};
use crate::formats::{fill_window, PageCache, Prefetch, ShardMeta, TokenIndex, WindowColumn};
use crate::memory::{MemoryBound, ShardScratch, MAX_JOB_ROWS};
use crate::metrics::DecodeMeter;
use crate::order::{LayoutCache, Order, Segment, Slot};
use crate::pool::BufferPool;
use crate::resolve::Resolved;
use crate::shards::{InspectionLimits, ShardEntry, Shards};
use crate::storage::Storage;

/// How much more decode scratch than the largest known the stream reserves for shards it has
/// not inspected yet: shards of one source come from one writer and differ little.
const SCRATCH_MARGIN: u64 = 4;
/// The least decode scratch reserved for shards not inspected yet.
const MIN_SCRATCH_RESERVE: u64 = 64 << 20;

/// Everything the threads of a stream share; immutable once built, except for the shards'
/// inspections, each made once when the shard is first needed.
pub struct Plan {
    /// The resolved document (shared with the stream's checkpoints).
    pub resolved: Arc<ResolvedConfig>,
    /// Where shards are read from (without a cancellation flag: each pipeline adds its own).
    pub storage: Storage,
    /// The order function.
    pub order: Order,
    /// Every delivered column, synthetic ones included.
    pub projection: Projection,
    /// The columns read from records.
    pub records: Projection,
    /// Where each record column goes in a batch row.
    pub record_map: Vec<crate::fields::RecordSlot>,
    /// Every shard, with its inspection once made.
    pub shards: Shards,
    /// Schema of delivered batches.
    pub schema: SchemaRef,
    /// The working-set bound, checked at open.
    pub bound: MemoryBound,
    /// Decode scratch one job may use: a shard inspected later that needs more fails closed.
    pub scratch_reserved: u64,
    /// Rows planned together.
    pub group_rows: u64,
    /// Read jobs in flight at most.
    pub max_jobs: usize,
    /// Pages of remote shards kept for later jobs; None when every shard is local.
    pub pages: Option<Arc<PageCache>>,
    /// The resolved config's fingerprint: a resumed stream's is its checkpoint's, an opened
    /// one's is computed at the first position asked for (it hashes every shard entry, which
    /// open itself does not need).
    fingerprint: OnceLock<String>,
    /// Decode time and rows by encoding.
    pub decode: DecodeMeter,
    /// The encodings of the stream's shards, in first-seen order.
    pub encodings: Vec<Encoding>,
    /// The token stages' window columns the planner fills (`@segment_ids`, `@positions`,
    /// `@segment_lengths`), by batch column.
    pub window_columns: Vec<(usize, WindowColumn)>,
    /// Buffers of batches being filled and delivered, within the bound's batches term.
    pub batch_buffers: Arc<BufferPool>,
    /// Buffers of read jobs' decoded rows, within the bound's decode units term.
    pub job_buffers: Arc<BufferPool>,
    /// Rows each source leaves out for a field's overflow rule `drop`, per pass over it, in
    /// stage then source order.
    pub dropped_rows: Vec<u64>,
    /// By flat shard id, the rows its source's earlier shards leave out (empty when none
    /// does): `@row_id` counts the records as listed, left-out ones included.
    dropped_before: Vec<u64>,
    /// The `@labels` column, filled from the tokens once a batch's rows are read.
    pub labels: Option<crate::labels::Labels>,
}

impl Plan {
    /// Builds the plan of a resolved config and checks its memory bound.
    pub fn new(resolved: Resolved) -> Result<Self> {
        let Resolved {
            config,
            projection,
            inspected,
            scratch,
            resumed_from,
            storage,
        } = resolved;
        let order = Order::new(&config)?;
        let mut projection = projection;
        if config.validation_pass {
            // The same columns as `Projection::delivered`, from the projection resolve built.
            projection.columns.push(ProjectedColumn::valid_mask());
        }
        let (records, record_map) = projection.record_columns();
        let window_columns: Vec<(usize, WindowColumn)> = projection
            .columns
            .iter()
            .enumerate()
            .filter_map(|(k, c)| WindowColumn::of(&c.source).map(|kind| (k, kind)))
            .collect();
        let token_plans = inspected
            .iter()
            .filter_map(|(_, meta)| meta.tokens())
            .map(TokenIndex::bytes)
            .sum();
        let mut shards = Shards::new(config.clone(), resumed_from.is_some(), inspected)?;
        let encodings = shards.encodings();
        let prefetching = shards.any_remote();
        let pages = encodings
            .iter()
            .any(|e| matches!(e, Encoding::Parquet | Encoding::Mds | Encoding::JsonlGz));
        let shape = config.pipeline_shape()?;
        let known = MemoryBound::compute(
            &shape,
            &projection,
            ShardScratch {
                largest: scratch.largest,
                prefetching,
                pages,
                token_plans,
            },
        )?;
        let scratch_reserved = if scratch.complete {
            scratch.largest
        } else {
            // Room for shards not inspected yet, within what the limit leaves.
            let holders = if prefetching {
                shape.max_jobs
            } else {
                shape.threads
            };
            let room = scratch.largest + (known.limit - known.total()) / holders.max(1);
            scratch
                .largest
                .saturating_mul(SCRATCH_MARGIN)
                .max(MIN_SCRATCH_RESERVE)
                .min(room)
        };
        let bound = MemoryBound::compute(
            &shape,
            &projection,
            ShardScratch {
                largest: scratch_reserved,
                prefetching,
                pages,
                token_plans,
            },
        )?;
        shards.hold_to(InspectionLimits {
            records: records.clone(),
            scratch_reserved,
            plan_room: bound.limit - bound.total(),
        });
        let (dropped_rows, dropped_before) = shards.dropped_rows();
        let labels = crate::labels::Labels::of(&config, &projection)?;
        let page_budget = shape.page_cache_bytes(records.row_bytes() as u64)?;
        let plan = Plan {
            schema: batch_schema(&projection),
            resolved: config,
            // Reads of the stream's shards count into their source's meter, not open's.
            storage: storage
                .without_meter()
                .with_cancel(crate::cancel::Cancel::new()),
            order,
            projection,
            records,
            record_map,
            shards,
            bound,
            scratch_reserved,
            group_rows: shape.group_rows,
            max_jobs: shape.max_jobs as usize,
            pages: if pages {
                Some(Arc::new(PageCache::new(page_budget)))
            } else {
                None
            },
            fingerprint: resumed_from.map_or_else(OnceLock::new, OnceLock::from),
            decode: DecodeMeter::default(),
            encodings,
            window_columns,
            batch_buffers: BufferPool::new(bound.batches),
            job_buffers: BufferPool::new(bound.decode_units),
            dropped_rows,
            dropped_before,
            labels,
        };
        check_window_columns(&plan)?;
        Ok(plan)
    }

    /// Shard `id` (a flat id).
    pub fn shard(&self, id: usize) -> ShardEntry<'_> {
        self.shards.entry(id)
    }

    /// The record columns shard `id` is read with (its source may map them to other names).
    pub fn records_of(&self, id: usize) -> &Projection {
        self.shards.records(id, &self.records)
    }

    /// Shard `id`'s inspection, if it has been inspected.
    pub fn inspected(&self, id: usize) -> Option<&ShardMeta> {
        self.shards.inspected(id)
    }

    /// Shard `shard`'s inspection, made now if no read needed it before ([`Shards::meta`]).
    pub fn meta(&self, storage: &Storage, shard: usize) -> Result<&ShardMeta> {
        self.shards.meta(storage, shard)
    }

    /// `storage`, counting into the meter of shard `shard`'s source.
    pub fn metered(&self, storage: &Storage, shard: usize) -> Storage {
        self.shards.metered(storage, shard)
    }

    /// Inspects those of `shards` not inspected yet ([`Shards::inspect_all`]).
    pub fn inspect_all(&self, storage: &Storage, shards: &[usize]) {
        self.shards
            .inspect_all(storage, shards, self.resolved.threads);
    }

    /// The resolved config's fingerprint.
    pub fn fingerprint(&self) -> &str {
        self.fingerprint.get_or_init(|| self.resolved.fingerprint())
    }

    /// What the token stages' windows hold, per stage (`None` for a stage of records), from
    /// the shards' inspections at open.
    pub fn token_stats(&self) -> Vec<Option<TokenStats>> {
        self.resolved
            .stages
            .iter()
            .enumerate()
            .map(|(s, stage)| {
                let layout = stage.token_layout()?;
                let mut stats = TokenStats {
                    tokens: 0,
                    windows: 0,
                    row_tokens: layout.row_tokens(),
                    most_segments: 0,
                };
                for k in self.shards.stage_shards(s) {
                    if let Some(index) = self.inspected(k).and_then(ShardMeta::tokens) {
                        stats.tokens += index.placed();
                        stats.windows += index.windows();
                        stats.most_segments = stats.most_segments.max(index.most_pieces());
                    }
                }
                Some(stats)
            })
            .collect()
    }

    /// The number of ranks.
    pub fn world(&self) -> u64 {
        self.resolved.world_size as u64
    }

    /// This stream's rank.
    pub fn rank(&self) -> u64 {
        self.resolved.rank as u64
    }
}

/// What one epoch of a token stage's windows holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TokenStats {
    /// Tokens in the windows, padding excluded (a stream window's overlapping token counts in
    /// both windows).
    pub tokens: u64,
    /// Windows (rows) over all the stage's shards.
    pub windows: u64,
    /// Tokens per window, padding included.
    pub row_tokens: u64,
    /// The most segments any window holds: the shortest `@segment_lengths` row that fits.
    pub most_segments: u64,
}

impl TokenStats {
    /// The share of the windows' tokens that is padding.
    pub fn padding_fraction(&self) -> f64 {
        let slots = self.windows * self.row_tokens;
        if slots == 0 {
            return 0.0;
        }
        (slots - self.tokens) as f64 / slots as f64
    }
}

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

/// Fills the token stages' window columns of batch slot `slot`, which holds window `window`
/// of shard `shard`: every element of the slot's row, since these columns are not cleared first
/// (`Chunk` of a batch, [`Planner::batch_buffer`]). Token shards are inspected at open and
/// their windows checked against the columns there ([`check_window_columns`]), so this
/// cannot fail; a shard without its plan would get padding.
/// The tokens window `window` of token shard `shard` holds (0 for a shard of records).
fn window_tokens(
    plan: &Plan,
    shard: usize,
    window: u64,
    pieces: &mut Vec<crate::order::pack::Piece>,
) -> u64 {
    plan.inspected(shard)
        .and_then(ShardMeta::tokens)
        .map_or(0, |index| index.window_tokens(window, pieces))
}

fn fill_windows(
    plan: &Plan,
    buffer: &mut Chunk,
    (slot, shard, window): (usize, usize, u64),
    pieces: &mut Vec<crate::order::pack::Piece>,
) {
    let index = plan.inspected(shard).and_then(ShardMeta::tokens);
    for &(k, kind) in &plan.window_columns {
        let column = &plan.projection.columns[k];
        let row = slot * column.width..(slot + 1) * column.width;
        // The pad was validated against the dtype when the config was checked.
        let pad = i64::from_scalar(column.pad).unwrap_or_default();
        let out = &mut buffer.columns[k];
        let filled = match index {
            Some(index) => fill_window(index, window, kind, (out, row.clone()), pad, pieces),
            None => Err(0),
        };
        if filled.is_err() {
            debug_assert!(false, "token shards are inspected and checked at open");
            out.fill_int(row, pad);
        }
    }
}

/// Refuses, before the first batch, a window column some token shard's windows would not fit:
/// an `@positions` whose dtype cannot hold a position they reach (a document of more than 2^31
/// tokens in an `i32` column), an `@segment_lengths` shorter than the most segments a window
/// holds.
fn check_window_columns(plan: &Plan) -> Result<()> {
    for (k, column) in plan.projection.columns.iter().enumerate() {
        let kind = WindowColumn::of(&column.source);
        let positions = kind == Some(WindowColumn::Positions) && column.dtype == DType::I32;
        if !positions && kind != Some(WindowColumn::Lengths) {
            continue;
        }
        for id in 0..plan.shards.len() {
            let Some(index) = plan.inspected(id).and_then(ShardMeta::tokens) else {
                continue;
            };
            let path = plan.shard(id).path();
            if positions {
                let largest = index.largest_position();
                if largest > i32::MAX as u64 {
                    return Err(Error::config(
                        format!("fields[{k}].dtype"),
                        format!(
                            "{}: a document reaches position {largest}, which i32 cannot hold; \
                             declare '{}' as i64",
                            path, column.name
                        ),
                    ));
                }
                continue;
            }
            let most = index.most_pieces();
            if most > column.width as u64 {
                return Err(Error::config(
                    format!("fields[{k}].length"),
                    format!(
                        "{}: a window holds {most} segments, more than the {} of '{}'; declare \
                         a length of at least {most}",
                        path, column.width, column.name
                    ),
                ));
            }
        }
    }
    Ok(())
}

/// The row in shard `id` itself of its kept row `row` (they differ where a field's overflow
/// rule left rows out).
fn file_row(plan: &Plan, id: usize, row: u64) -> u64 {
    plan.inspected(id)
        .map_or(row, |meta| meta.dropped.file_row(row))
}

fn fill_synthetic(plan: &Plan, buffer: &mut Chunk, slot: usize, at: &Slot) {
    for (column, buf) in plan
        .projection
        .columns
        .iter()
        .zip(buffer.columns.iter_mut())
    {
        let Some(kind) = column.synthetic else {
            continue;
        };
        let value = match kind {
            Synthetic::RowId => {
                let source = &plan.order.stages()[at.stage].sources()[at.row.source];
                let mut index = source.listed_index(at.row.at.shard, at.row.at.row);
                if !plan.dropped_before.is_empty() {
                    let id = plan.shards.id(at.stage, at.row.source, at.row.at.shard);
                    index +=
                        plan.dropped_before[id] + file_row(plan, id, at.row.at.row) - at.row.at.row;
                }
                ((at.stage as i64) << 56) | ((at.row.source as i64) << 40) | index as i64
            }
            Synthetic::Source => at.row.source as i64,
            Synthetic::Shard => at.row.at.shard as i64,
            // The row in the shard itself, also where a field's overflow rule left rows out.
            // Where no shard left a row out, a kept row is the file's: no lookup per row.
            Synthetic::Row if plan.dropped_before.is_empty() => at.row.at.row as i64,
            Synthetic::Row => {
                let id = plan.shards.id(at.stage, at.row.source, at.row.at.shard);
                file_row(plan, id, at.row.at.row) as i64
            }
            Synthetic::Epoch => at.row.at.epoch as i64,
            Synthetic::Stage => at.stage as i64,
            Synthetic::Valid => 1,
        };
        buf.set_int(slot, value);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::formats;
    use arrow_array::{ArrayRef, Int64Array, RecordBatch};
    use parquet::arrow::ArrowWriter;

    /// Writes a Parquet shard at `path` of one column `v` holding `0..rows`.
    fn write_values(path: &std::path::Path, rows: i64) {
        let values: ArrayRef = Arc::new(Int64Array::from_iter_values(0..rows));
        let batch = RecordBatch::try_from_iter([("v", values)]).unwrap();
        let file = std::fs::File::create(path).unwrap();
        let mut writer = ArrowWriter::try_new(file, batch.schema(), None).unwrap();
        writer.write(&batch).unwrap();
        writer.close().unwrap();
    }

    /// One shuffled stage over a shard (at `path`) of `rows` rows, batches of 8.
    fn plan(path: &std::path::Path, rows: i64) -> Arc<Plan> {
        write_values(path, rows);
        let config: crate::config::StreamConfig = serde_json::from_value(serde_json::json!({
            "fields": [{"name": "v", "source": "v", "dtype": "i64"}],
            "stages": [{
                "sources": [{"kind": "files", "files": [path.to_string_lossy()]}],
                "batch_size": 8,
                "shuffle": {"buffer_rows": 512},
            }],
            "seed": 3,
            "threads": 1,
        }))
        .unwrap();
        let resolved = crate::resolve::resolve(&config, &Storage::local()).unwrap();
        Arc::new(Plan::new(resolved).unwrap())
    }

    #[test]
    fn the_first_group_is_the_first_batch_alone() {
        let path =
            std::env::temp_dir().join(format!("o41-first-group-{}.parquet", std::process::id()));
        let plan = plan(&path, 2000);
        assert!(plan.group_rows > 8, "a group is more than one batch");
        let mut planner = Planner::new(plan.clone(), Segment::first(), (0, 0), 0, 1, None);
        let (mut pending, mut jobs, mut next_job) = (VecDeque::new(), VecDeque::new(), 0);
        assert!(planner.plan_group(&Storage::local(), &mut pending, &mut jobs, &mut next_job));
        assert_eq!(pending.len(), 1, "the first group plans one batch");
        let read: u64 = jobs
            .iter()
            .flat_map(|(job, _)| &job.ranges)
            .map(|r| r.end - r.start)
            .sum();
        assert_eq!(read, 8, "and reads its rows alone");
        assert!(planner.plan_group(&Storage::local(), &mut pending, &mut jobs, &mut next_job));
        assert_eq!(
            pending.len() as u64,
            1 + plan.group_rows / 8,
            "the next is a whole group"
        );
        std::fs::remove_file(path).unwrap();
    }

    #[test]
    fn a_shard_first_read_is_inspected_without_decoding_a_record() {
        // A manifest of two shards: open inspects the first (its first record checks the
        // projection), the second is inspected when a read first needs it.
        let dir = std::env::temp_dir().join(format!("o41-first-read-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let mut entries = Vec::new();
        for k in 0..2 {
            let path = dir.join(format!("s{k}.parquet"));
            write_values(&path, 100);
            let bytes = std::fs::metadata(&path).unwrap().len();
            entries.push(serde_json::json!({
                "location": format!("s{k}.parquet"), "rows": 100, "bytes": bytes,
                "checksum": "none:0",
            }));
        }
        let manifest = dir.join("manifest.json");
        let document = serde_json::json!({
            "format": "o41-data-manifest", "version": 1, "data_format": "parquet",
            "splits": {"train": {"shards": entries}},
        });
        std::fs::write(&manifest, document.to_string()).unwrap();
        let config: crate::config::StreamConfig = serde_json::from_value(serde_json::json!({
            "fields": [{"name": "v", "source": "v", "dtype": "i64"}],
            "stages": [{
                "sources": [{"kind": "manifest", "manifest_uri": manifest.to_string_lossy(),
                             "split": "train"}],
                "batch_size": 8,
            }],
        }))
        .unwrap();
        let resolved = crate::resolve::resolve(&config, &Storage::local()).unwrap();
        let plan = Plan::new(resolved).unwrap();
        assert!(
            plan.inspected(1).is_none(),
            "open left the second shard alone"
        );
        plan.meta(&Storage::local(), 1).unwrap();
        let at_first_read = plan.shard(1).meter().reading().bytes_read;

        let meter = Arc::new(crate::metrics::Meter::default());
        let checks = formats::Checks {
            promise: None,
            first_record: true,
            seen: None,
            cache: None,
        };
        let uri = dir.join("s1.parquet").to_string_lossy().into_owned();
        let storage = Storage::local().with_meter(meter.clone());
        formats::inspect(
            &storage,
            &uri,
            Encoding::Parquet,
            &plan.records,
            1 << 20,
            checks,
        )
        .unwrap();
        let as_open_does = meter.reading().bytes_read;
        assert!(
            0 < at_first_read && at_first_read < as_open_does,
            "{at_first_read} bytes at first read, {as_open_does} decoding the first record"
        );
        std::fs::remove_dir_all(dir).unwrap();
    }

    #[test]
    fn a_resumed_plan_takes_its_checkpoints_fingerprint() {
        use crate::checkpoint::{Checkpoint, Cursor, Position};
        let path =
            std::env::temp_dir().join(format!("o41-resumed-hash-{}.parquet", std::process::id()));
        let opened = plan(&path, 100);
        assert!(
            opened.fingerprint.get().is_none(),
            "open leaves the hash for later"
        );
        let fingerprint = opened.fingerprint().to_owned();
        let position = Position {
            fingerprint: fingerprint.clone(),
            rank: 0,
            world_size: 1,
            cursor: Cursor {
                segment: Segment::first(),
                next_batch: 1,
            },
            stage: 0,
            batches_yielded: 1,
            rows_yielded: 8,
            epochs: vec![0],
            switches: Vec::new(),
        };
        let checkpoint = Checkpoint::from_position(opened.resolved.clone(), position).unwrap();
        let reopened = crate::resolve::reopen(&checkpoint, &Storage::local()).unwrap();
        let resumed = Plan::new(reopened).unwrap();
        assert_eq!(
            resumed.fingerprint.get(),
            Some(&fingerprint),
            "not hashed again"
        );
        std::fs::remove_file(path).unwrap();
    }
}
