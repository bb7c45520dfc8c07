//! The batch stream: a planner, a pool of decode workers and an assembler on Rust threads.
//!
//! Content is fixed by the row plan; threads and timing change only speed. Workers decode units
//! in any order; the assembler waits for the unit each row needs, copies rows into the batch
//! buffers, and hands finished batches over a bounded channel of `prefetch_batches` slots.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError, Sender, SyncSender};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use arrow_array::RecordBatch;
use arrow_schema::SchemaRef;

use crate::columns::{batch_schema, Chunk};
use crate::config::{ResolvedConfig, ResolvedSource, StreamConfig};
use crate::error::{Error, Result};
use crate::formats::{self, ShardMeta, ShardReader};
use crate::memory::{MemoryBound, UNIT_TARGET_BYTES};
use crate::plan::{RowPlan, UnitSpec};
use crate::projection::Projection;
use crate::resolve::{resolve, Resolved};

/// Most rows a decode unit holds.
const MAX_UNIT_ROWS: u64 = 1024;
/// Open shard readers each worker keeps, so consecutive units of a shard continue in place.
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
    /// Batches delivered to this rank.
    pub batches_yielded: u64,
    /// Rows delivered to this rank.
    pub rows_yielded: u64,
    /// Rows of the finite stage that no rank will receive (the final unfillable round).
    pub dropped_rows: u64,
}

/// An open stream.
pub struct BatchStream {
    output: Option<Receiver<Result<Batch>>>,
    stop: Arc<AtomicBool>,
    handles: Vec<JoinHandle<()>>,
    resolved: ResolvedConfig,
    schema: SchemaRef,
    bound: MemoryBound,
    stats: StreamStats,
}

struct Job {
    seq: u64,
    unit: UnitSpec,
}

type UnitResult = (u64, Result<Chunk>);

struct Shared {
    projection: Projection,
    metas: Vec<Vec<ShardMeta>>,
    paths: Vec<Vec<(String, formats::Encoding)>>,
    stop: Arc<AtomicBool>,
}

impl BatchStream {
    /// Resolves `config` and starts the stream.
    pub fn open(config: &StreamConfig) -> Result<Self> {
        Self::start(resolve(config)?)
    }

    fn start(resolved: Resolved) -> Result<Self> {
        let Resolved {
            config,
            projection,
            metas,
        } = resolved;
        let stage_index = 0;
        let stage = &config.stages[stage_index];
        let row_bytes = projection.row_bytes().max(1);
        let unit_rows = (UNIT_TARGET_BYTES / row_bytes).clamp(1, MAX_UNIT_ROWS as usize) as u64;
        let max_units = config.threads * 2 + stage.sources.len();
        let bound = MemoryBound::compute(&config, &projection, unit_rows, max_units)?;

        let total_rows: u64 = stage.sources.iter().map(ResolvedSource::rows).sum();
        let world = config.world_size as u64;
        let (batch_limit, dropped_rows) = if stage.infinite {
            (None, 0)
        } else {
            let full = total_rows / stage.batch_size as u64;
            let usable = full - full % world;
            (Some(usable), total_rows - usable * stage.batch_size as u64)
        };

        let stop = Arc::new(AtomicBool::new(false));
        let stage_metas = metas.into_iter().nth(stage_index).expect("stage exists");
        let shared = Arc::new(Shared {
            projection,
            paths: stage
                .sources
                .iter()
                .map(|s| {
                    s.shards
                        .iter()
                        .map(|f| (f.path.clone(), f.encoding))
                        .collect()
                })
                .collect(),
            metas: stage_metas,
            stop: stop.clone(),
        });

        let (job_tx, job_rx) = mpsc::channel::<Job>();
        let job_rx = Arc::new(Mutex::new(job_rx));
        let (unit_tx, unit_rx) = mpsc::channel::<UnitResult>();
        let (out_tx, out_rx) = mpsc::sync_channel::<Result<Batch>>(config.prefetch_batches);
        let mut handles = Vec::with_capacity(config.threads + 1);
        for w in 0..config.threads {
            let (shared, job_rx, unit_tx) = (shared.clone(), job_rx.clone(), unit_tx.clone());
            handles.push(
                std::thread::Builder::new()
                    .name(format!("o41-decode-{w}"))
                    .spawn(move || decode_worker(&shared, &job_rx, &unit_tx))
                    .map_err(|e| Error::io("decode thread", e))?,
            );
        }
        drop(unit_tx);
        let assembler = Assembler {
            plan: RowPlan::new(stage, &shared.metas, unit_rows),
            ahead: RowPlan::new(stage, &shared.metas, unit_rows),
            shared: shared.clone(),
            schema: batch_schema(&shared.projection),
            batch_size: stage.batch_size,
            stage: stage_index,
            rank: config.rank as u64,
            world,
            batch_limit,
            max_units,
            jobs: job_tx,
            units: unit_rx,
            out: out_tx,
        };
        handles.push(
            std::thread::Builder::new()
                .name("o41-assemble".to_owned())
                .spawn(move || assembler.run())
                .map_err(|e| Error::io("assembler thread", e))?,
        );
        Ok(BatchStream {
            output: Some(out_rx),
            stop,
            handles,
            schema: batch_schema(&shared.projection),
            resolved: config,
            bound,
            stats: StreamStats {
                dropped_rows,
                ..StreamStats::default()
            },
        })
    }

    /// Waits up to `timeout` for the next batch.
    pub fn next_timeout(&mut self, timeout: Duration) -> Result<Next> {
        let output = self.output.as_ref().ok_or(Error::Closed)?;
        match output.recv_timeout(timeout) {
            Ok(Ok(batch)) => {
                self.stats.batches_yielded += 1;
                self.stats.rows_yielded += batch.columns.num_rows() as u64;
                Ok(Next::Batch(batch))
            }
            Ok(Err(e)) => Err(e),
            Err(RecvTimeoutError::Timeout) => Ok(Next::Pending),
            Err(RecvTimeoutError::Disconnected) => Ok(Next::End),
        }
    }

    /// Stops every thread, waiting for reads in flight. Idempotent.
    pub fn close(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        // Dropping the receiver unblocks an assembler waiting to hand over a batch.
        self.output = None;
        for handle in self.handles.drain(..) {
            let _ = handle.join();
        }
    }

    /// True once `close` has run.
    pub fn is_closed(&self) -> bool {
        self.output.is_none()
    }

    /// The resolved document the stream runs.
    pub fn resolved(&self) -> &ResolvedConfig {
        &self.resolved
    }

    /// Schema of delivered batches.
    pub fn schema(&self) -> &SchemaRef {
        &self.schema
    }

    /// The working-set bound computed at open.
    pub fn memory_bound(&self) -> &MemoryBound {
        &self.bound
    }

    /// Delivery counters.
    pub fn stats(&self) -> StreamStats {
        self.stats
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

/// Open readers of one worker, most recently used first, keyed by (source, shard).
type ReaderCache = Vec<((usize, usize), Box<dyn ShardReader>)>;

fn decode_worker(shared: &Shared, jobs: &Mutex<Receiver<Job>>, results: &Sender<UnitResult>) {
    let mut readers: ReaderCache = Vec::new();
    loop {
        let job = {
            let Ok(rx) = jobs.lock() else { return };
            let Ok(job) = rx.recv() else { return };
            job
        };
        if shared.stop.load(Ordering::Relaxed) {
            return;
        }
        let result = decode_unit(shared, &mut readers, &job.unit);
        if results.send((job.seq, result)).is_err() {
            return;
        }
    }
}

fn decode_unit(shared: &Shared, readers: &mut ReaderCache, unit: &UnitSpec) -> Result<Chunk> {
    let key = (unit.source, unit.shard);
    if let Some(pos) = readers.iter().position(|(k, _)| *k == key) {
        readers[..=pos].rotate_right(1);
    } else {
        let (path, encoding) = &shared.paths[unit.source][unit.shard];
        let reader = formats::open(path, *encoding, &shared.metas[unit.source][unit.shard])?;
        if readers.len() == READERS_PER_WORKER {
            readers.pop();
        }
        readers.insert(0, (key, reader));
    }
    let rows = (unit.rows.end - unit.rows.start) as usize;
    let mut chunk = Chunk::padded(&shared.projection, rows);
    readers[0]
        .1
        .read_into(unit.rows.clone(), &shared.projection, &mut chunk)?;
    Ok(chunk)
}

struct Assembler {
    plan: RowPlan,
    ahead: RowPlan,
    shared: Arc<Shared>,
    schema: SchemaRef,
    batch_size: usize,
    stage: usize,
    rank: u64,
    world: u64,
    batch_limit: Option<u64>,
    max_units: usize,
    jobs: Sender<Job>,
    units: Receiver<UnitResult>,
    out: SyncSender<Result<Batch>>,
}

/// Why assembly stopped early.
enum Halt {
    /// The consumer closed the stream.
    Stopped,
    /// A unit failed to decode; the error goes to the consumer.
    Failed(Error),
}

impl Assembler {
    fn run(mut self) {
        let mut ready: HashMap<u64, Chunk> = HashMap::new();
        let mut in_flight = 0usize;
        let mut g = 0u64;
        loop {
            if self.batch_limit.is_some_and(|limit| g >= limit) {
                return;
            }
            match self.assemble(g, &mut ready, &mut in_flight) {
                Ok(Some(batch)) => {
                    if self.out.send(Ok(batch)).is_err() {
                        return;
                    }
                }
                Ok(None) => {}
                Err(Halt::Stopped) => return,
                Err(Halt::Failed(e)) => {
                    let _ = self.out.send(Err(e));
                    return;
                }
            }
            g += 1;
        }
    }

    /// Builds global batch `g`, or only walks past its rows when it belongs to another rank.
    fn assemble(
        &mut self,
        g: u64,
        ready: &mut HashMap<u64, Chunk>,
        in_flight: &mut usize,
    ) -> Result<Option<Batch>, Halt> {
        let mine = g % self.world == self.rank;
        let shared = self.shared.clone();
        let projection = &shared.projection;
        let mut batch = mine.then(|| Chunk::padded(projection, self.batch_size));
        for r in 0..self.batch_size {
            let Some(step) = self.plan.next() else {
                // Only an infinite stage walks past its end; finite stages stop at the limit.
                return Err(Halt::Stopped);
            };
            *in_flight += self.dispatch(*in_flight)?;
            while !ready.contains_key(&step.seq) {
                match self.units.recv_timeout(POLL) {
                    Ok((seq, Ok(chunk))) => {
                        ready.insert(seq, chunk);
                    }
                    Ok((_, Err(e))) => return Err(Halt::Failed(e)),
                    Err(RecvTimeoutError::Timeout) => {
                        if self.shared.stop.load(Ordering::Relaxed) {
                            return Err(Halt::Stopped);
                        }
                    }
                    Err(RecvTimeoutError::Disconnected) => return Err(Halt::Stopped),
                }
            }
            let unit = &ready[&step.seq];
            if let Some(batch) = batch.as_mut() {
                for (k, column) in projection.columns.iter().enumerate() {
                    batch.columns[k].copy_rows(r, &unit.columns[k], step.offset, 1, column.width);
                }
            }
            if step.last {
                ready.remove(&step.seq);
                *in_flight -= 1;
            }
        }
        Ok(batch.map(|chunk| Batch {
            columns: chunk
                .into_record_batch(projection, &self.schema)
                .expect("batch columns match the schema"),
            stage: self.stage,
            batch_index: g,
        }))
    }

    /// Sends decode jobs for upcoming units while fewer than `max_units` are in flight.
    fn dispatch(&mut self, in_flight: usize) -> Result<usize, Halt> {
        let mut sent = 0;
        while in_flight + sent < self.max_units {
            let next = self
                .ahead
                .by_ref()
                .find_map(|step| step.new_unit.map(|u| (step.seq, u)));
            let Some((seq, unit)) = next else {
                break;
            };
            if self.jobs.send(Job { seq, unit }).is_err() {
                return Err(Halt::Stopped);
            }
            sent += 1;
        }
        Ok(sent)
    }
}
