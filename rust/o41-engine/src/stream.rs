//! The batch stream: a planner and assembler thread, a pool of decode workers, and delivery.
//!
//! The planner walks this stream's own global batches in order. For each it asks the order
//! function which shard row fills every slot, groups the rows of a window's worth of batches by
//! shard into sorted ranges, and sends them to the workers as read jobs; a rank therefore reads
//! only its own rows. Workers decode jobs in any order; the assembler copies each decoded row
//! into its batch slot and hands complete batches over, strictly in order, through a channel of
//! `prefetch_batches` slots. Content is fixed by the order function: threads and timing change
//! only speed.

use std::collections::{HashMap, VecDeque};
use std::ops::Range;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError, Sender, SyncSender};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use arrow_array::RecordBatch;
use arrow_schema::SchemaRef;

use crate::checkpoint::{Checkpoint, Cursor, Position, CHECKPOINT_VERSION};
use crate::columns::{batch_schema, Chunk};
use crate::config::{ResolvedConfig, StreamConfig};
use crate::error::{Error, Result};
use crate::formats::{self, Encoding, ShardMeta, ShardReader};
use crate::memory::MemoryBound;
use crate::order::{LayoutCache, Order, Segment, Slot};
use crate::projection::{Projection, Synthetic};
use crate::resolve::{reopen, resolve, Resolved};
use crate::storage::Storage;

/// Most unique rows one read job decodes.
const MAX_JOB_ROWS: usize = 1024;
/// Rows planned together at least (a group reads each shard range once).
const MIN_GROUP_ROWS: u64 = 4096;
/// Open shard readers each worker keeps, so consecutive jobs on a shard continue in place.
const READERS_PER_WORKER: usize = 4;
/// How often blocked threads look at the stop flag.
const POLL: Duration = Duration::from_millis(50);

/// One delivered batch.
#[derive(Debug, Clone)]
pub struct Batch {
    /// Projected columns, one fixed-shape Arrow array each.
    pub columns: RecordBatch,
    /// Stage that was active when the batch was produced.
    pub stage: usize,
    /// Global batch number (rank-independent).
    pub batch_index: u64,
    /// This rank's batch number since the stream's origin.
    pub local_index: u64,
    /// The segment the batch was cut from.
    pub segment: Segment,
}

/// Result of waiting for the next batch.
#[derive(Debug)]
pub enum Next {
    /// A batch.
    Batch(Batch),
    /// The stream has ended.
    End,
    /// Nothing arrived within the timeout; ask again.
    Pending,
}

/// Counters a stream exposes.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct StreamStats {
    /// Batches delivered to this rank over the whole run.
    pub batches_yielded: u64,
    /// Rows delivered to this rank over the whole run.
    pub rows_yielded: u64,
    /// Rows of the active finite stage that no rank will receive (the final unfillable round of
    /// `world_size` batches and any partial batch).
    pub dropped_rows: u64,
}

/// Where a stream starts and which of the rank's batches it yields.
#[derive(Debug, Clone, Copy)]
pub struct Start {
    /// Active segment.
    pub segment: Segment,
    /// Round origin: every global batch before it has been consumed.
    pub origin: u64,
    /// Rank-level counters at the origin.
    pub batches_base: u64,
    /// Rank-level counters at the origin.
    pub rows_base: u64,
    /// First local batch (since the origin) this stream yields.
    pub offset: u64,
    /// Distance between the local batches this stream yields (1: all of the rank's).
    pub stride: u64,
}

impl Start {
    fn fresh() -> Self {
        Start {
            segment: Segment::first(),
            origin: 0,
            batches_base: 0,
            rows_base: 0,
            offset: 0,
            stride: 1,
        }
    }
}

struct ShardEntry {
    path: String,
    encoding: Encoding,
    meta: ShardMeta,
}

/// What every thread of a stream shares; immutable once built.
struct Shared {
    resolved: ResolvedConfig,
    storage: Storage,
    order: Order,
    projection: Projection,
    records: Projection,
    /// Batch column of each record column.
    record_map: Vec<usize>,
    shards: Vec<ShardEntry>,
    /// Flat shard id by stage, source and shard.
    shard_ids: Vec<Vec<Vec<usize>>>,
    schema: SchemaRef,
    bound: MemoryBound,
    group_rows: u64,
    max_jobs: usize,
    /// The resolved config's fingerprint, computed once.
    fingerprint: String,
}

impl Shared {
    fn new(resolved: Resolved) -> Result<Self> {
        let Resolved {
            config,
            projection,
            metas,
            storage,
        } = resolved;
        let order = Order::new(&config)?;
        let (records, record_map) = projection.record_columns();
        let mut shards = Vec::new();
        let mut shard_ids = Vec::new();
        for (stage, stage_metas) in config.stages.iter().zip(metas) {
            let mut ids = Vec::new();
            for (source, source_metas) in stage.sources.iter().zip(stage_metas) {
                let mut source_ids = Vec::new();
                for (shard, meta) in source.shards.iter().zip(source_metas) {
                    source_ids.push(shards.len());
                    shards.push(ShardEntry {
                        path: shard.path.clone(),
                        encoding: shard.encoding,
                        meta,
                    });
                }
                ids.push(source_ids);
            }
            shard_ids.push(ids);
        }
        let largest_window = order.stages().iter().map(|s| s.window).max().unwrap_or(0);
        let largest_batch = order
            .stages()
            .iter()
            .map(|s| s.batch_size)
            .max()
            .unwrap_or(1);
        let group_rows = largest_window.max(MIN_GROUP_ROWS).div_ceil(largest_batch) * largest_batch;
        let max_jobs = config.threads * 2;
        let scratch = shards
            .iter()
            .map(|s| s.meta.scratch_bytes)
            .max()
            .unwrap_or(0);
        // Remote reads are fetched from dispatch on, so every job in flight may hold its bytes,
        // not only those being decoded.
        let prefetching = shards.iter().any(|s| s.meta.version.is_some());
        let scratch = if prefetching {
            scratch * (max_jobs / config.threads.max(1)) as u64
        } else {
            scratch
        };
        let bound = MemoryBound::compute(
            &config,
            &projection,
            group_rows,
            max_jobs * MAX_JOB_ROWS,
            scratch,
        )?;
        let fingerprint = config.fingerprint();
        Ok(Shared {
            schema: batch_schema(&projection),
            resolved: config,
            storage,
            order,
            projection,
            records,
            record_map,
            shards,
            shard_ids,
            bound,
            group_rows,
            max_jobs,
            fingerprint,
        })
    }

    fn world(&self) -> u64 {
        self.resolved.world_size as u64
    }

    fn rank(&self) -> u64 {
        self.resolved.rank as u64
    }
}

/// The threads of one run of the pipeline, from a start position until the stream closes or
/// advances.
struct Pipeline {
    output: Option<Receiver<Result<Batch>>>,
    stop: Arc<AtomicBool>,
    handles: Vec<JoinHandle<()>>,
    /// The process that started the threads: a forked child holds a copy of this value but
    /// none of the threads, and must not wait for them.
    pid: u32,
}

impl Pipeline {
    fn stop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        // Dropping the receiver unblocks an assembler waiting to hand over a batch.
        self.output = None;
        if std::process::id() != self.pid {
            self.handles.clear();
            return;
        }
        for handle in self.handles.drain(..) {
            let _ = handle.join();
        }
    }
}

/// An open stream.
pub struct BatchStream {
    shared: Arc<Shared>,
    pipeline: Option<Pipeline>,
    start: Start,
    segment: Segment,
    /// Next local batch this stream will deliver.
    next_local: u64,
    /// Rank-level local batches consumed once the last delivered batch is (its index + 1).
    consumed: u64,
    /// `(first local batch, rows per batch)` from each segment start since the origin.
    batch_rows: Vec<(u64, u64)>,
    end_batch: Option<u64>,
    /// An advance at a later local batch than this stream's next one: `(stage, at)`.
    pending_advance: Option<(usize, u64)>,
    closed: bool,
}

impl BatchStream {
    /// Resolves `config` and starts the stream at its beginning.
    pub fn open(config: &StreamConfig, storage: &Storage) -> Result<Self> {
        Self::start(resolve(config, storage)?, Start::fresh())
    }

    /// Like [`BatchStream::open`], yielding only the rank's local batches `offset, offset +
    /// stride, ...` (a `DataLoader` worker's share).
    pub fn open_part(
        config: &StreamConfig,
        storage: &Storage,
        offset: u64,
        stride: u64,
    ) -> Result<Self> {
        let start = Start {
            offset,
            stride: stride.max(1),
            ..Start::fresh()
        };
        Self::start(resolve(config, storage)?, start)
    }

    /// Re-opens the stream a checkpoint describes, at the checkpoint's position.
    pub fn resume(checkpoint: &Checkpoint, storage: &Storage) -> Result<Self> {
        Self::resume_part(checkpoint, storage, 0, 1)
    }

    /// Like [`BatchStream::resume`], yielding only local batches `offset, offset + stride, ...`
    /// (a `DataLoader` worker's share).
    pub fn resume_part(
        checkpoint: &Checkpoint,
        storage: &Storage,
        offset: u64,
        stride: u64,
    ) -> Result<Self> {
        let resolved = reopen(checkpoint.resolved.clone(), storage)?;
        let start = Start {
            segment: checkpoint.cursor.segment,
            origin: checkpoint.cursor.next_batch,
            batches_base: checkpoint.batches_yielded,
            rows_base: checkpoint.rows_yielded,
            offset,
            stride: stride.max(1),
        };
        Self::start(resolved, start)
    }

    /// Starts from a resolved config at `start`.
    pub fn start(resolved: Resolved, start: Start) -> Result<Self> {
        let shared = Arc::new(Shared::new(resolved)?);
        shared.order.check_segment(&start.segment)?;
        if start.segment.start_batch > start.origin {
            return Err(Error::Checkpoint {
                message: "the cursor's segment starts after its next batch".to_owned(),
            });
        }
        let bs = shared.order.batch_size(&start.segment);
        let mut stream = BatchStream {
            end_batch: shared
                .order
                .end_batch(&start.segment, start.origin, shared.world()),
            shared,
            pipeline: None,
            segment: start.segment,
            next_local: start.offset,
            consumed: 0,
            batch_rows: vec![(0, bs)],
            start,
            pending_advance: None,
            closed: false,
        };
        stream.launch()?;
        Ok(stream)
    }

    fn launch(&mut self) -> Result<()> {
        let shared = self.shared.clone();
        let stop = Arc::new(AtomicBool::new(false));
        let (job_tx, job_rx) = mpsc::channel::<Job>();
        let job_rx = Arc::new(Mutex::new(job_rx));
        let (done_tx, done_rx) = mpsc::channel::<JobResult>();
        let (out_tx, out_rx) =
            mpsc::sync_channel::<Result<Batch>>(shared.resolved.prefetch_batches);
        let mut handles = Vec::with_capacity(shared.resolved.threads + 1);
        for w in 0..shared.resolved.threads {
            let (shared, job_rx, done_tx, stop) = (
                shared.clone(),
                job_rx.clone(),
                done_tx.clone(),
                stop.clone(),
            );
            handles.push(
                std::thread::Builder::new()
                    .name(format!("o41-decode-{w}"))
                    .spawn(move || decode_worker(&shared, &job_rx, &done_tx, &stop))
                    .map_err(|e| Error::io("decode thread", e))?,
            );
        }
        drop(done_tx);
        let assembler = Assembler {
            planner: Planner {
                shared: shared.clone(),
                segment: self.segment,
                origin: self.start.origin,
                next_local: self.next_local,
                stride: self.start.stride,
                end_batch: self.end_batch,
                next_seq: 0,
                layouts: LayoutCache::default(),
            },
            shared,
            stop: stop.clone(),
            jobs: job_tx,
            done: done_rx,
            out: out_tx,
        };
        handles.push(
            std::thread::Builder::new()
                .name("o41-assemble".to_owned())
                .spawn(move || assembler.run())
                .map_err(|e| Error::io("assembler thread", e))?,
        );
        self.pipeline = Some(Pipeline {
            output: Some(out_rx),
            stop,
            handles,
            pid: std::process::id(),
        });
        Ok(())
    }

    /// Waits up to `timeout` for the next batch.
    pub fn next_timeout(&mut self, timeout: Duration) -> Result<Next> {
        if self.closed {
            return Err(Error::Closed);
        }
        if let Some((stage, at)) = self.pending_advance {
            if self.next_local >= at {
                let g = self.start.origin + at * self.shared.world();
                let segment = self.shared.order.advance(&self.segment, g, stage)?;
                self.switch(segment, at)?;
            }
        }
        let Some(output) = self.pipeline.as_ref().and_then(|p| p.output.as_ref()) else {
            return Ok(Next::End);
        };
        match output.recv_timeout(timeout) {
            Ok(Ok(batch)) => {
                self.next_local = batch.local_index + self.start.stride;
                self.consumed = batch.local_index + 1;
                Ok(Next::Batch(batch))
            }
            Ok(Err(e)) => Err(e),
            Err(RecvTimeoutError::Timeout) => Ok(Next::Pending),
            Err(RecvTimeoutError::Disconnected) => Ok(Next::End),
        }
    }

    /// Switches to `stage` at the next batch boundary: after the batches already delivered.
    /// Prefetched batches are discarded (their rows are not lost) and the rows left in the
    /// current stage's shuffle window are delivered first. A same-stage advance is a no-op.
    pub fn advance(&mut self, stage: usize) -> Result<()> {
        let at = self
            .consumed
            .max(self.next_local.min(self.consumed.max(self.start.offset)));
        self.advance_at(stage, at)
    }

    /// Like [`BatchStream::advance`], at rank-level local batch `at` (every rank and every
    /// worker of a rank must use the same value). Batches at or after `at` that this stream
    /// has not delivered yet are recomputed for the new stage.
    pub fn advance_at(&mut self, stage: usize, at: u64) -> Result<()> {
        if self.closed {
            return Err(Error::Closed);
        }
        if at < self.consumed {
            return Err(Error::config(
                "advance",
                format!(
                    "the switch at local batch {at} comes after batches already delivered (through {})",
                    self.consumed - 1
                ),
            ));
        }
        let g = self.start.origin + at * self.shared.world();
        if g < self.segment.start_batch {
            return Err(Error::config(
                "advance",
                format!("local batch {at} is before the active stage began"),
            ));
        }
        let segment = self.shared.order.advance(&self.segment, g, stage)?;
        if segment == self.segment {
            return Ok(());
        }
        if at > self.next_local {
            // This stream still owes batches of the old stage before `at` (other workers of the
            // rank delivered the ones in between): switch once they are delivered.
            self.pending_advance = Some((stage, at));
            return Ok(());
        }
        self.switch(segment, at)
    }

    fn switch(&mut self, segment: Segment, at: u64) -> Result<()> {
        self.pending_advance = None;
        if let Some(mut pipeline) = self.pipeline.take() {
            pipeline.stop();
        }
        self.segment = segment;
        self.end_batch =
            self.shared
                .order
                .end_batch(&segment, self.start.origin, self.shared.world());
        self.batch_rows.retain(|&(from, _)| from < at);
        self.batch_rows
            .push((at, self.shared.order.batch_size(&segment)));
        // The first local batch at or after `at` in this stream's share.
        let (offset, stride) = (self.start.offset, self.start.stride);
        self.next_local = if at <= offset {
            offset
        } else {
            offset + (at - offset).div_ceil(stride) * stride
        };
        self.consumed = self.consumed.max(at);
        self.launch()
    }

    /// Rows in the rank's local batches `[0, local)` since the origin.
    fn rows_before(&self, local: u64) -> u64 {
        let mut rows = 0;
        for (i, &(from, bs)) in self.batch_rows.iter().enumerate() {
            let to = self
                .batch_rows
                .get(i + 1)
                .map_or(local, |&(next, _)| next.min(local));
            rows += to.saturating_sub(from) * bs;
        }
        rows
    }

    /// The position after the rank's first `consumed` local batches since the origin, with
    /// `segment` active (the stream's own after its last delivered batch by default). Cheap
    /// enough to compute for every batch.
    pub fn position_at(&self, consumed: u64, segment: Option<Segment>) -> Position {
        let segment = segment.unwrap_or(self.segment);
        let next_batch = self.start.origin + consumed * self.shared.world();
        Position {
            fingerprint: self.shared.fingerprint.clone(),
            cursor: Cursor {
                segment,
                next_batch,
            },
            stage: segment.stage,
            batches_yielded: self.start.batches_base + consumed,
            rows_yielded: self.start.rows_base + self.rows_before(consumed),
            epochs: self.shared.order.epochs(&segment, next_batch),
        }
    }

    /// The checkpoint after the rank's first `consumed` local batches since the origin, with
    /// `segment` active (the stream's own after its last delivered batch by default).
    pub fn checkpoint_at(&self, consumed: u64, segment: Option<Segment>) -> Checkpoint {
        let p = self.position_at(consumed, segment);
        Checkpoint {
            version: CHECKPOINT_VERSION,
            fingerprint: p.fingerprint,
            cursor: p.cursor,
            stage: p.stage,
            batches_yielded: p.batches_yielded,
            rows_yielded: p.rows_yielded,
            epochs: p.epochs,
            resolved: self.shared.resolved.clone(),
        }
    }

    /// The checkpoint after the last delivered batch (which counts as consumed).
    pub fn checkpoint(&self) -> Checkpoint {
        self.checkpoint_at(self.consumed, None)
    }

    /// Stops every thread, waiting for reads in flight. Idempotent.
    pub fn close(&mut self) {
        if let Some(mut pipeline) = self.pipeline.take() {
            pipeline.stop();
        }
        self.closed = true;
    }

    /// True once `close` has run.
    pub fn is_closed(&self) -> bool {
        self.closed
    }

    /// The resolved document the stream runs.
    pub fn resolved(&self) -> &ResolvedConfig {
        &self.shared.resolved
    }

    /// Schema of delivered batches.
    pub fn schema(&self) -> &SchemaRef {
        &self.shared.schema
    }

    /// The working-set bound computed at open.
    pub fn memory_bound(&self) -> &MemoryBound {
        &self.shared.bound
    }

    /// The active stage.
    pub fn stage(&self) -> usize {
        self.segment.stage
    }

    /// Delivery counters.
    pub fn stats(&self) -> StreamStats {
        StreamStats {
            batches_yielded: self.start.batches_base + self.consumed,
            rows_yielded: self.start.rows_base + self.rows_before(self.consumed),
            dropped_rows: self
                .end_batch
                .map_or(0, |end| self.shared.order.dropped_rows(&self.segment, end)),
        }
    }
}

impl Drop for BatchStream {
    fn drop(&mut self) {
        self.close();
    }
}

impl Iterator for BatchStream {
    type Item = Result<Batch>;

    fn next(&mut self) -> Option<Result<Batch>> {
        loop {
            match self.next_timeout(POLL) {
                Ok(Next::Batch(b)) => return Some(Ok(b)),
                Ok(Next::End) => return None,
                Ok(Next::Pending) => {}
                Err(e) => return Some(Err(e)),
            }
        }
    }
}

/// Rows of one shard to decode, and where each goes.
struct Job {
    id: u64,
    shard: usize,
    ranges: Vec<Range<u64>>,
    /// The job's bytes, being fetched since it was dispatched (remote Parquet shards).
    prefetch: Option<formats::Prefetch>,
}

type JobResult = (u64, Result<Chunk>);

/// Where one decoded row goes: (row index in the job's chunk, batch sequence number, slot).
type Dest = (u32, u64, u32);

/// Open readers of one worker, most recently used first, keyed by flat shard id.
type ReaderCache = Vec<(usize, Box<dyn ShardReader>)>;

fn decode_worker(
    shared: &Shared,
    jobs: &Mutex<Receiver<Job>>,
    results: &Sender<JobResult>,
    stop: &AtomicBool,
) {
    let mut readers: ReaderCache = Vec::new();
    loop {
        let mut job = {
            let Ok(rx) = jobs.lock() else { return };
            let Ok(job) = rx.recv() else { return };
            job
        };
        if stop.load(Ordering::Relaxed) {
            return;
        }
        let result = decode(shared, &mut readers, &mut job);
        if results.send((job.id, result)).is_err() {
            return;
        }
    }
}

fn decode(shared: &Shared, readers: &mut ReaderCache, job: &mut Job) -> Result<Chunk> {
    if let Some(pos) = readers.iter().position(|(k, _)| *k == job.shard) {
        readers[..=pos].rotate_right(1);
    } else {
        let entry = &shared.shards[job.shard];
        let reader = formats::open(&shared.storage, &entry.path, entry.encoding, &entry.meta)?;
        if readers.len() == READERS_PER_WORKER {
            readers.pop();
        }
        readers.insert(0, (job.shard, reader));
    }
    let rows: u64 = job.ranges.iter().map(|r| r.end - r.start).sum();
    let mut chunk = Chunk::padded(&shared.records, rows as usize);
    readers[0].1.read_ranges(
        &job.ranges,
        &shared.records,
        &mut chunk,
        job.prefetch.take(),
    )?;
    Ok(chunk)
}

/// A batch being filled.
struct Pending {
    seq: u64,
    local: u64,
    global: u64,
    buffer: Chunk,
    missing: usize,
}

/// Decides the rows of this stream's batches, group by group.
struct Planner {
    shared: Arc<Shared>,
    segment: Segment,
    origin: u64,
    next_local: u64,
    stride: u64,
    end_batch: Option<u64>,
    next_seq: u64,
    layouts: LayoutCache,
}

impl Planner {
    /// Plans the next group of batches: appends them to `pending` and their reads to `jobs`.
    /// Returns false once the stream has no more batches.
    fn plan_group(
        &mut self,
        pending: &mut VecDeque<Pending>,
        jobs: &mut VecDeque<(Job, Vec<Dest>)>,
        next_job: &mut u64,
    ) -> bool {
        let shared = self.shared.clone();
        let bs = shared.order.batch_size(&self.segment);
        let mut wanted: Vec<(usize, u64, u64, u32)> = Vec::new();
        let mut planned_rows = 0;
        while planned_rows < shared.group_rows {
            let global = self.origin + shared.rank() + self.next_local * shared.world();
            if self.end_batch.is_some_and(|end| global >= end) {
                break;
            }
            let seq = self.next_seq;
            let mut buffer = Chunk::padded(&shared.projection, bs as usize);
            for slot in 0..bs {
                let at = shared
                    .order
                    .slot(&self.segment, global, slot, &mut self.layouts);
                fill_synthetic(&shared, &mut buffer, slot as usize, &at);
                let shard = shared.shard_ids[at.stage][at.row.source][at.row.at.shard];
                wanted.push((shard, at.row.at.row, seq, slot as u32));
            }
            pending.push_back(Pending {
                seq,
                local: self.next_local,
                global,
                buffer,
                missing: if shared.records.columns.is_empty() {
                    0
                } else {
                    bs as usize
                },
            });
            self.next_seq += 1;
            self.next_local += self.stride;
            planned_rows += bs;
        }
        if planned_rows == 0 {
            return false;
        }
        if !shared.records.columns.is_empty() {
            split_jobs(wanted, jobs, next_job, |shard, row| {
                shared.shards[shard].meta.block_of(row)
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
                    if unique as usize == MAX_JOB_ROWS {
                        break;
                    }
                    r.end += 1;
                    unique += 1;
                }
                _ => {
                    if unique as usize == MAX_JOB_ROWS {
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

fn fill_synthetic(shared: &Shared, buffer: &mut Chunk, slot: usize, at: &Slot) {
    for (column, buf) in shared
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
                let source = &shared.order.stages()[at.stage].sources()[at.row.source];
                ((at.stage as i64) << 56)
                    | ((at.row.source as i64) << 40)
                    | source.listed_index(at.row.at.shard, at.row.at.row) as i64
            }
            Synthetic::Source => at.row.source as i64,
            Synthetic::Shard => at.row.at.shard as i64,
            Synthetic::Row => at.row.at.row as i64,
            Synthetic::Epoch => at.row.at.epoch as i64,
            Synthetic::Stage => at.stage as i64,
        };
        buf.set_int(slot, value);
    }
}

struct Assembler {
    planner: Planner,
    shared: Arc<Shared>,
    stop: Arc<AtomicBool>,
    jobs: Sender<Job>,
    done: Receiver<JobResult>,
    out: SyncSender<Result<Batch>>,
}

impl Assembler {
    fn run(mut self) {
        if let Err(e) = self.assemble() {
            let _ = self.out.send(Err(e));
        }
    }

    fn assemble(&mut self) -> Result<()> {
        let shared = self.shared.clone();
        let mut pending: VecDeque<Pending> = VecDeque::new();
        let mut queued: VecDeque<(Job, Vec<Dest>)> = VecDeque::new();
        let mut in_flight: HashMap<u64, Vec<Dest>> = HashMap::new();
        let mut next_job = 0u64;
        let mut planning = true;
        let group_batches =
            (shared.group_rows / shared.order.batch_size(&self.planner.segment)).max(1) as usize;
        loop {
            // Plan ahead up to two groups so reads of the next group overlap delivery.
            while planning && pending.len() < 2 * group_batches && queued.len() < shared.max_jobs {
                planning = self
                    .planner
                    .plan_group(&mut pending, &mut queued, &mut next_job);
            }
            while in_flight.len() < shared.max_jobs {
                let Some((mut job, dests)) = queued.pop_front() else {
                    break;
                };
                let entry = &shared.shards[job.shard];
                job.prefetch = formats::prefetch(
                    &shared.storage,
                    &entry.path,
                    &entry.meta,
                    &job.ranges,
                    &shared.records,
                );
                in_flight.insert(job.id, dests);
                if self.jobs.send(job).is_err() {
                    return Ok(());
                }
            }
            // One batch at a time, topping up reads in between, so workers never wait for the
            // consumer to drain a whole group.
            if pending.front().is_some_and(|p| p.missing == 0) {
                let done = pending.pop_front().expect("front exists");
                let batch = Batch {
                    columns: done
                        .buffer
                        .into_record_batch(&shared.projection, &shared.schema)?,
                    stage: self.planner.segment.stage,
                    batch_index: done.global,
                    local_index: done.local,
                    segment: self.planner.segment,
                };
                if self.out.send(Ok(batch)).is_err() {
                    return Ok(());
                }
                continue;
            }
            if pending.is_empty() && !planning {
                return Ok(());
            }
            if in_flight.is_empty() && queued.is_empty() {
                continue;
            }
            let (id, chunk) = match self.done.recv_timeout(POLL) {
                Ok((id, result)) => (id, result?),
                Err(RecvTimeoutError::Timeout) => {
                    if self.stop.load(Ordering::Relaxed) {
                        return Ok(());
                    }
                    continue;
                }
                Err(RecvTimeoutError::Disconnected) => return Ok(()),
            };
            let dests = in_flight
                .remove(&id)
                .expect("a result for a dispatched job");
            let front = pending.front().map_or(0, |p| p.seq);
            for (row, seq, slot) in dests {
                let batch = &mut pending[(seq - front) as usize];
                for (k, column) in shared.records.columns.iter().enumerate() {
                    batch.buffer.columns[shared.record_map[k]].copy_rows(
                        slot as usize,
                        &chunk.columns[k],
                        row as usize,
                        1,
                        column.width,
                    );
                }
                batch.missing -= 1;
            }
        }
    }
}
