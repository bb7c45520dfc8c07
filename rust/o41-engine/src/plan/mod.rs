//! What an open stream knows and never changes, and the planner.
//!
//! [`Plan`] holds the resolved config, its order, the projected fields, every shard's metadata
//! and the pipeline's sizes. [`Planner`] walks this stream's own global batches in order: for
//! each it asks the order function which shard row fills every slot, then groups the rows of a
//! window's worth of batches by shard into sorted ranges, the read jobs. A rank therefore reads
//! only its own rows, and content is fixed before any thread decodes a byte.
//!
//! The module holds the [`Plan`]; `planner` the [`Planner`] and its read jobs; `columns` what
//! the planner writes into a batch itself (synthetic columns, token windows).

use std::sync::{Arc, OnceLock};

use arrow_schema::SchemaRef;

use crate::columns::batch_schema;
use crate::config::ResolvedConfig;
use crate::encoding::Encoding;
use crate::error::Result;
use crate::fields::{ProjectedColumn, Projection};
use crate::formats::{PageCache, ShardMeta, TokenIndex, WindowColumn};
use crate::memory::{MemoryBound, ShardScratch};
use crate::metrics::DecodeMeter;
use crate::order::Order;
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
mod columns;
mod planner;

use columns::check_window_columns;
pub use planner::{Dest, Job, MixCount, Pending, Planner};
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

#[cfg(test)]
mod tests {
    use std::collections::VecDeque;

    use super::*;
    use crate::formats;
    use crate::order::Segment;
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
