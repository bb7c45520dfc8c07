//! The threads of one run of a stream, from a start position until the stream closes or
//! advances: decode workers and the assembler.
//!
//! Workers decode read jobs in any order. The assembler plans ahead with the [`Planner`],
//! dispatches jobs, copies each decoded row into its batch slot and hands complete batches
//! over strictly in order, through a channel of `prefetch_batches` slots. Content is fixed by
//! the plan: threads and timing change only speed.
//!
//! Stopping sets the run's [`Cancel`] flag, which the run's storage reads obey too, so a worker
//! blocked on a stalled remote read returns at once instead of after its retry budget.

use std::collections::{HashMap, VecDeque};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError, Sender, SyncSender};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use arrow_array::RecordBatch;

use crate::cancel::Cancel;
use crate::columns::Chunk;
use crate::error::{Error, Result};
use crate::formats::{self, ShardReader};
use crate::memory::READERS_PER_WORKER;
use crate::order::Segment;
use crate::plan::{Dest, Job, Pending, Plan, Planner};
use crate::storage::Storage;

/// How often the assembler looks at the stop flag while it waits for decoded rows.
const POLL: Duration = Duration::from_millis(50);

/// A batch the pipeline completed, before the stream attaches its position.
pub struct Assembled {
    /// Projected columns.
    pub columns: RecordBatch,
    /// Stage active when the batch was produced.
    pub stage: usize,
    /// Global batch number.
    pub batch_index: u64,
    /// The rank's local batch number since the origin.
    pub local_index: u64,
    /// The segment the batch was cut from.
    pub segment: Segment,
}

/// The running threads of one pipeline run.
pub struct Pipeline {
    /// Complete batches in order; taken by the consumer while it waits.
    pub output: Option<Receiver<Result<Assembled>>>,
    cancel: Cancel,
    handles: Vec<JoinHandle<()>>,
    /// The process that started the threads: a forked child holds a copy of this value but
    /// none of the threads, and must not wait for them.
    pid: u32,
}

impl Pipeline {
    /// Starts the threads of a run that `planner` plans.
    pub fn launch(plan: &Arc<Plan>, planner: Planner) -> Result<Self> {
        let cancel = Cancel::new();
        let storage = plan.storage.with_cancel(cancel.clone());
        let (job_tx, job_rx) = mpsc::channel::<Job>();
        let job_rx = Arc::new(Mutex::new(job_rx));
        let (done_tx, done_rx) = mpsc::channel::<JobResult>();
        let (out_tx, out_rx) = mpsc::sync_channel(plan.resolved.prefetch_batches);
        let mut handles = Vec::with_capacity(plan.resolved.threads + 1);
        let mut pipeline = Pipeline {
            output: Some(out_rx),
            cancel: cancel.clone(),
            handles: Vec::new(),
            pid: std::process::id(),
        };
        for w in 0..plan.resolved.threads {
            let (plan, storage, job_rx, done_tx, cancel) = (
                plan.clone(),
                storage.clone(),
                job_rx.clone(),
                done_tx.clone(),
                cancel.clone(),
            );
            let spawned = std::thread::Builder::new()
                .name(format!("o41-decode-{w}"))
                .spawn(move || decode_worker(&plan, &storage, &job_rx, &done_tx, &cancel));
            match spawned {
                Ok(handle) => handles.push(handle),
                Err(e) => {
                    pipeline.handles = handles;
                    pipeline.stop();
                    return Err(Error::io("decode thread", e));
                }
            }
        }
        drop(done_tx);
        let assembler = Assembler {
            planner,
            plan: plan.clone(),
            storage,
            cancel,
            jobs: job_tx,
            done: done_rx,
            out: out_tx,
        };
        let spawned = std::thread::Builder::new()
            .name("o41-assemble".to_owned())
            .spawn(move || assembler.run());
        match spawned {
            Ok(handle) => handles.push(handle),
            Err(e) => {
                pipeline.handles = handles;
                pipeline.stop();
                return Err(Error::io("assembler thread", e));
            }
        }
        pipeline.handles = handles;
        Ok(pipeline)
    }

    /// Stops every thread of the run: reads in flight are cancelled, then the threads joined.
    pub fn stop(&mut self) {
        self.cancel.cancel();
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

type JobResult = (u64, Result<Chunk>);

/// Open readers of one worker, most recently used first, keyed by flat shard id.
type ReaderCache = Vec<(usize, Box<dyn ShardReader>)>;

fn decode_worker(
    plan: &Plan,
    storage: &Storage,
    jobs: &Mutex<Receiver<Job>>,
    results: &Sender<JobResult>,
    cancel: &Cancel,
) {
    let mut readers: ReaderCache = Vec::new();
    loop {
        let mut job = {
            let Ok(rx) = jobs.lock() else { return };
            let Ok(job) = rx.recv() else { return };
            job
        };
        if cancel.is_cancelled() {
            return;
        }
        let result = Error::catch(|| decode(plan, storage, &mut readers, &mut job));
        if results.send((job.id, result)).is_err() {
            return;
        }
    }
}

fn decode(
    plan: &Plan,
    storage: &Storage,
    readers: &mut ReaderCache,
    job: &mut Job,
) -> Result<Chunk> {
    if let Some(pos) = readers.iter().position(|(k, _)| *k == job.shard) {
        readers[..=pos].rotate_right(1);
    } else {
        let entry = &plan.shards[job.shard];
        let reader = formats::open(storage, &entry.path, entry.encoding, &entry.meta)?;
        // A few open readers per worker, so consecutive jobs on a shard continue in place.
        if readers.len() as u64 == READERS_PER_WORKER {
            readers.pop();
        }
        readers.insert(0, (job.shard, reader));
    }
    let rows: u64 = job.ranges.iter().map(|r| r.end - r.start).sum();
    let mut chunk = Chunk::padded(&plan.records, rows as usize);
    readers[0]
        .1
        .read_ranges(&job.ranges, &plan.records, &mut chunk, job.prefetch.take())?;
    Ok(chunk)
}

struct Assembler {
    planner: Planner,
    plan: Arc<Plan>,
    storage: Storage,
    cancel: Cancel,
    jobs: Sender<Job>,
    done: Receiver<JobResult>,
    out: SyncSender<Result<Assembled>>,
}

impl Assembler {
    fn run(mut self) {
        if let Err(e) = Error::catch(|| self.assemble()) {
            let _ = self.out.send(Err(e));
        }
    }

    fn assemble(&mut self) -> Result<()> {
        let plan = self.plan.clone();
        let mut pending: VecDeque<Pending> = VecDeque::new();
        let mut queued: VecDeque<(Job, Vec<Dest>)> = VecDeque::new();
        let mut in_flight: HashMap<u64, Vec<Dest>> = HashMap::new();
        let mut next_job = 0u64;
        let mut planning = true;
        let group_batches =
            (plan.group_rows / plan.order.batch_size(&self.planner.segment)).max(1) as usize;
        loop {
            // Plan ahead up to two groups so reads of the next group overlap delivery.
            while planning && pending.len() < 2 * group_batches && queued.len() < plan.max_jobs {
                planning = self
                    .planner
                    .plan_group(&mut pending, &mut queued, &mut next_job);
            }
            while in_flight.len() < plan.max_jobs {
                let Some((mut job, dests)) = queued.pop_front() else {
                    break;
                };
                let entry = &plan.shards[job.shard];
                job.prefetch = formats::prefetch(
                    &self.storage,
                    &entry.path,
                    &entry.meta,
                    &job.ranges,
                    &plan.records,
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
                let batch = Assembled {
                    columns: done
                        .buffer
                        .into_record_batch(&plan.projection, &plan.schema)?,
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
                    if self.cancel.is_cancelled() {
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
                for (k, column) in plan.records.columns.iter().enumerate() {
                    batch.buffer.columns[plan.record_map[k]].copy_rows(
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
