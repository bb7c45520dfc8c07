//! Provenance (`docs/order.md`, "Provenance"): the rows a global batch holds, from the order
//! function alone. The order is a pure function of the resolved document and the position, so
//! which source, shard and row fed a step is answered without reading any shard.

use std::ops::Range;

use crate::config::ResolvedConfig;
use crate::error::{Error, Result};
use crate::order::{LayoutCache, Order, Segment};

/// Most rows one trace returns: a trace is for a step or a range of steps, not an epoch.
pub const MAX_TRACE_ROWS: u64 = 1 << 24;

/// One row of a traced global batch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TracedRow {
    /// The global batch.
    pub global_batch: u64,
    /// The rank that receives the row, for the world size traced.
    pub rank: u64,
    /// The row's place in that rank's batch.
    pub slot: u64,
    /// The stage the row comes from (a drained row's is the stage it was drawn in).
    pub stage: usize,
    /// The source within that stage.
    pub source: usize,
    /// The shard within that source.
    pub shard: usize,
    /// The record (or, in a token stage, the window) within that shard.
    pub row: u64,
    /// A validation pass's padding row: no data.
    pub padding: bool,
    /// The batch is in a skipped range (`crate::skips`): no rank receives the row.
    pub skipped: bool,
}

/// Where a trace starts: the segment the batches are in, and the global batch its rounds of
/// `world_size` batches are counted from (0 for a stream from its start, a checkpoint's next
/// batch for one resumed from it).
#[derive(Debug, Clone, Copy)]
pub struct TraceFrom {
    /// The active segment.
    pub segment: Segment,
    /// The first global batch of a round.
    pub origin: u64,
}

/// The rows of global batches `batches` of the stream `config` describes, in global order (rank
/// by rank in a ramped stage, whose every batch is shared), for `world_size` ranks.
pub fn trace(
    config: &ResolvedConfig,
    from: TraceFrom,
    batches: Range<u64>,
    world_size: u64,
) -> Result<Vec<TracedRow>> {
    if world_size == 0 || world_size > crate::limits::MAX_WORLD_SIZE {
        return Err(Error::config(
            "world_size",
            format!(
                "{world_size}: a world has 1 to {} ranks",
                crate::limits::MAX_WORLD_SIZE
            ),
        ));
    }
    let order = Order::new(config)?;
    let segment = from.segment;
    if segment.stage >= order.stages().len() {
        return Err(Error::config(
            "segment",
            format!(
                "stage {} is not one of the stream's {} stages",
                segment.stage,
                order.stages().len()
            ),
        ));
    }
    if batches.start < segment.start_batch {
        return Err(Error::config(
            "global_batch",
            format!(
                "{} is before the segment this position is in (stage {} from global batch {}); \
                 trace it from the config or an earlier checkpoint",
                batches.start, segment.stage, segment.start_batch
            ),
        ));
    }
    let end = order.end_batch(&segment, from.origin, world_size);
    if let Some(end) = end.filter(|&end| batches.end > end) {
        return Err(Error::config(
            "global_batch",
            format!(
                "{}: the stream's stage {} ends before global batch {end} for {world_size} ranks",
                batches.end - 1,
                segment.stage
            ),
        ));
    }
    let rows = order
        .first_row(&segment, batches.end)
        .saturating_sub(order.first_row(&segment, batches.start));
    if rows > MAX_TRACE_ROWS {
        return Err(Error::config(
            "global_batch",
            format!(
                "{} batches hold {rows} rows, more than the {MAX_TRACE_ROWS} one trace returns; \
                 trace fewer batches",
                batches.end - batches.start
            ),
        ));
    }
    let split = order.split(&segment);
    let mut cache = LayoutCache::default();
    let mut out = Vec::with_capacity(rows as usize);
    for g in batches {
        let skipped = crate::skips::holding(&config.skip_batches, g).is_some();
        // Whole batches go to the ranks in turn; a ramped stage shares every batch.
        let ranks = if split {
            0..world_size
        } else {
            let owner = (g - from.origin.min(g)) % world_size;
            owner..owner + 1
        };
        for rank in ranks {
            for (slot, t) in order.rank_rows(&segment, g, rank, world_size).enumerate() {
                let (stage, source, shard, row, padding) = if order.padding(&segment, t) {
                    (segment.stage, 0, 0, 0, true)
                } else {
                    let at = order.slot_at(&segment, t, &mut cache);
                    (
                        at.stage,
                        at.row.source,
                        at.row.at.shard,
                        at.row.at.row,
                        false,
                    )
                };
                out.push(TracedRow {
                    global_batch: g,
                    rank,
                    slot: slot as u64,
                    stage,
                    source,
                    shard,
                    row,
                    padding,
                    skipped,
                });
            }
        }
    }
    Ok(out)
}

/// The documents each traced window holds, located in its shard (empty for a record or a
/// padding row): what a packed batch was made of. Each token shard traced is inspected once as
/// open inspects it (its document boundaries: a Parquet column's list lengths, an eos scan),
/// held to the document's promise; `known` are inspections open already made, by flat shard id
/// (stage, then source, then shard order).
pub fn window_documents(
    config: &ResolvedConfig,
    storage: &crate::storage::Storage,
    known: &[(usize, Box<crate::formats::ShardMeta>)],
    traced: &[TracedRow],
) -> Result<Vec<Vec<crate::formats::LocatedPiece>>> {
    use crate::config::{renamed_fields, renamed_layout};
    use crate::formats::{ShardMeta, TokenInspection};
    use crate::memory::{MemoryBound, ShardScratch};
    // Flat ids of each source's first shard, to find what open inspected.
    let mut firsts = Vec::new();
    let mut count = 0;
    for stage in &config.stages {
        firsts.push(
            stage
                .sources
                .iter()
                .map(|source| {
                    let first = count;
                    count += source.shards.len();
                    first
                })
                .collect::<Vec<_>>(),
        );
    }
    let projection = crate::fields::Projection::new(&config.fields)?;
    let bound = MemoryBound::compute(
        &config.pipeline_shape()?,
        &projection,
        ShardScratch::default(),
    )?;
    let max_plan = bound.limit - bound.total();
    let cache = crate::inspect_cache::InspectCache::from_env();
    let mut inspected: std::collections::HashMap<(usize, usize, usize), ShardMeta> =
        std::collections::HashMap::new();
    let mut out = Vec::with_capacity(traced.len());
    for row in traced {
        let stage = &config.stages[row.stage];
        let Some(layout) = stage.token_layout().filter(|_| !row.padding) else {
            out.push(Vec::new());
            continue;
        };
        let flat = firsts[row.stage][row.source] + row.shard;
        let key = (row.stage, row.source, row.shard);
        let meta = if let Ok(k) = known.binary_search_by_key(&flat, |(id, _)| *id) {
            &*known[k].1
        } else {
            if let std::collections::hash_map::Entry::Vacant(slot) = inspected.entry(key) {
                let source = &stage.sources[row.source];
                let shard = &source.shards[row.shard];
                let fields = renamed_fields(&config.fields, &source.columns);
                let records = crate::fields::Projection::new(&fields)?.record_columns().0;
                let layout = renamed_layout(&layout, &source.columns);
                let promise = shard.promise(crate::formats::PromiseOrigin::Checkpoint);
                let meta = crate::formats::inspect_shard(
                    storage,
                    &shard.path,
                    shard.encoding,
                    Some(TokenInspection {
                        layout: &layout,
                        cache: cache.as_ref(),
                    }),
                    &records,
                    (crate::formats::MAX_RECORD_BYTES, max_plan),
                    crate::formats::Checks {
                        promise: Some(&promise),
                        cache: cache.as_ref(),
                        ..crate::formats::Checks::default()
                    },
                )?;
                slot.insert(meta);
            }
            &inspected[&key]
        };
        let pieces = meta
            .tokens()
            .map_or_else(Vec::new, |index| index.located_pieces(row.row));
        out.push(pieces);
    }
    Ok(out)
}

/// Turns the rows of `traced` into the shards' own record numbers where a field's overflow rule
/// `drop` left records out: the order counts a shard's kept records, so each shard traced is
/// read once, its `drop` fields only, as open reads it. Nothing is read for any other stream.
pub fn file_rows(
    config: &ResolvedConfig,
    storage: &crate::storage::Storage,
    traced: &mut [TracedRow],
) -> Result<()> {
    let (records, _) = crate::fields::Projection::new(&config.fields)?.record_columns();
    if !crate::formats::drops_rows(&records) {
        return Ok(());
    }
    let mut dropped: std::collections::HashMap<(usize, usize, usize), crate::formats::Dropped> =
        std::collections::HashMap::new();
    for row in traced.iter_mut().filter(|r| !r.padding) {
        let stage = &config.stages[row.stage];
        if stage.token_layout().is_some() {
            continue; // a window, not a record: drops are for stages of records
        }
        let key = (row.stage, row.source, row.shard);
        let known = match dropped.entry(key) {
            std::collections::hash_map::Entry::Occupied(known) => known.into_mut(),
            std::collections::hash_map::Entry::Vacant(slot) => {
                let shard = &stage.sources[row.source].shards[row.shard];
                // Held to the document: a shard changed since fails closed, as a resume would.
                let promise = shard.promise(crate::formats::PromiseOrigin::Checkpoint);
                let meta = crate::formats::inspect(
                    storage,
                    &shard.path,
                    shard.encoding,
                    &records,
                    crate::formats::MAX_RECORD_BYTES,
                    crate::formats::Checks {
                        promise: Some(&promise),
                        ..crate::formats::Checks::default()
                    },
                )?;
                slot.insert(meta.dropped)
            }
        };
        row.row = known.file_row(row.row);
    }
    Ok(())
}
