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
use std::ops::Range;
use std::panic::AssertUnwindSafe;
use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError, Sender, SyncSender};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use arrow_array::RecordBatch;

use crate::cancel::Cancel;
use crate::columns::Chunk;
use crate::error::{Error, Result};
use crate::formats::{self, ReadFailure, ShardReader};
use crate::memory::READERS_PER_WORKER;
use crate::metrics;
use crate::order::Segment;
use crate::plan::{Dest, Job, MixCount, Pending, Plan, Planner};
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
    /// What the batch holds of each source it draws from.
    pub mix: Vec<MixCount>,
}

/// The running threads of one pipeline run.
pub struct Pipeline {
    /// Complete batches in order; taken by the consumer while it waits.
    pub output: Option<Receiver<Result<Assembled>>>,
    /// Batches handed over and not yet received: the assembler adds one after each hand-over,
    /// the consumer takes one off after each receipt (so it may briefly read -1).
    pub ready: Arc<AtomicI64>,
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
        let ready = Arc::new(AtomicI64::new(0));
        let mut pipeline = Pipeline {
            output: Some(out_rx),
            ready: ready.clone(),
            cancel: cancel.clone(),
            handles: Vec::new(),
            pid: std::process::id(),
        };
        let threads = plan.resolved.threads;
        for w in 0..threads {
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
                    // The workers started wait for jobs: with no sender left they stop, and
                    // can be joined (joining them with it alive waited for good).
                    drop(job_tx);
                    pipeline.handles = handles;
                    pipeline.stop();
                    return Err(Error::config(
                        "threads",
                        format!(
                            "{} decode threads could not be started: the system refused thread \
                             {} ({e}); lower threads",
                            threads,
                            w + 1
                        ),
                    ));
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
            ready,
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
        self.ready.store(0, Ordering::Relaxed);
        if std::process::id() != self.pid {
            self.handles.clear();
            return;
        }
        for handle in self.handles.drain(..) {
            let _ = handle.join();
        }
    }
}

/// A decoded job: its id, the chunk (its first `rows_done` rows valid when it failed), and the
/// failure, if any.
type JobResult = (u64, Chunk, Option<ReadFailure>);

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
        let rows: u64 = job.ranges.iter().map(|r| r.end - r.start).sum();
        // Every reader writes each row it hands over whole, pads included, so the chunk is
        // not filled first.
        let mut chunk = Chunk::dirty_from(&plan.job_buffers, &plan.records, rows as usize);
        let outcome = std::panic::catch_unwind(AssertUnwindSafe(|| {
            decode(plan, storage, &mut readers, &mut job, &mut chunk)
        }))
        .unwrap_or_else(|panic| Err(ReadFailure::from(Error::from_panic(panic.as_ref()))));
        if outcome.is_err() {
            // A reader that failed (or panicked) is in no known state: the next job opens anew.
            readers.retain(|(shard, _)| *shard != job.shard);
        }
        if results.send((job.id, chunk, outcome.err())).is_err() {
            return;
        }
    }
}

fn decode(
    plan: &Plan,
    storage: &Storage,
    readers: &mut ReaderCache,
    job: &mut Job,
    chunk: &mut Chunk,
) -> std::result::Result<(), ReadFailure> {
    let entry = plan.shard(job.shard);
    if let Some(pos) = readers.iter().position(|(k, _)| *k == job.shard) {
        readers[..=pos].rotate_right(1);
    } else {
        let meta = plan.meta(storage, job.shard)?;
        let storage = plan.metered(storage, job.shard);
        let reader = formats::open(&storage, entry.path(), meta, plan.pages.as_ref())?;
        entry.meter().shard_opened();
        // A few open readers per worker, so consecutive jobs on a shard continue in place.
        if readers.len() as u64 == READERS_PER_WORKER {
            readers.pop();
        }
        readers.insert(0, (job.shard, reader));
    }
    // Decode time is the time in the reader less its storage waits, which the reader's metered
    // object adds to this thread's total.
    let (start, waited) = (Instant::now(), metrics::thread_waited());
    let outcome = readers[0].1.read_ranges(
        &job.ranges,
        plan.records_of(job.shard),
        chunk,
        job.prefetch.take(),
    );
    let decode = start
        .elapsed()
        .saturating_sub(Duration::from_nanos(metrics::thread_waited() - waited));
    let rows = match &outcome {
        Ok(()) => job.ranges.iter().map(|r| r.end - r.start).sum(),
        Err(failure) => failure.rows_done as u64,
    };
    entry.meter().rows(rows);
    plan.decode.decoded(entry.encoding(), rows, decode);
    outcome
}

/// A dispatched job: its shard, rows and where each decoded row goes.
struct InFlight {
    shard: usize,
    ranges: Vec<Range<u64>>,
    dests: Vec<Dest>,
}

/// The first batch a failed read keeps from being completed, and why. The stream delivers
/// every batch before it, then the error.
struct Poison {
    seq: u64,
    error: Error,
}

impl Poison {
    fn keep_earliest(poison: &mut Option<Poison>, seq: u64, error: Error) {
        if poison.as_ref().is_none_or(|p| seq < p.seq) {
            *poison = Some(Poison { seq, error });
        }
    }
}

/// The shard row of an error that names one row, when the error is about that row's data and
/// the rows after it may still be read (a malformed line, a value that does not fit).
fn bad_row(error: &Error) -> Option<u64> {
    match error {
        Error::Format { row: Some(row), .. } | Error::Projection { row, .. } => Some(*row),
        _ => None,
    }
}

/// Whether the assembler plans another group now, with `pending` batches planned and not yet
/// delivered (the earliest numbered `first`) and `queued` jobs not yet dispatched.
///
/// It plans ahead up to two groups, so reads of the next group overlap delivery; a new group
/// only when it fits beside those pending, since the memory bound counts two groups, not three.
/// Nothing past the first batch (sequence 0, a group of its own) until it is delivered:
/// planning a group inspects the shards it reads for the first time, a shuffle window's worth,
/// on the assembler's thread, and the first batch would wait for that.
fn plans_next(
    first: Option<u64>,
    pending: usize,
    group_batches: usize,
    queued: usize,
    max_jobs: usize,
) -> bool {
    first != Some(0) && pending <= group_batches && queued < max_jobs
}

struct Assembler {
    planner: Planner,
    plan: Arc<Plan>,
    storage: Storage,
    cancel: Cancel,
    jobs: Sender<Job>,
    done: Receiver<JobResult>,
    out: SyncSender<Result<Assembled>>,
    ready: Arc<AtomicI64>,
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
        let mut in_flight: HashMap<u64, InFlight> = HashMap::new();
        let mut next_job = 0u64;
        let mut planning = true;
        let mut poison: Option<Poison> = None;
        let group_batches =
            (plan.group_rows / plan.order.batch_size(&self.planner.segment)).max(1) as usize;
        loop {
            // A failed read ends planning: the batches before the one it spoils are delivered,
            // then the error.
            while planning
                && poison.is_none()
                && plans_next(
                    pending.front().map(|p| p.seq),
                    pending.len(),
                    group_batches,
                    queued.len(),
                    plan.max_jobs,
                )
            {
                planning = self.planner.plan_group(
                    &self.storage,
                    &mut pending,
                    &mut queued,
                    &mut next_job,
                );
            }
            while in_flight.len() < plan.max_jobs {
                let Some((mut job, dests)) = queued.pop_front() else {
                    break;
                };
                let entry = plan.shard(job.shard);
                job.prefetch = entry.inspected().and_then(|meta| {
                    let storage = plan.metered(&self.storage, job.shard);
                    formats::prefetch(
                        &storage,
                        entry.path(),
                        meta,
                        &job.ranges,
                        plan.records_of(job.shard),
                        plan.pages.as_ref(),
                    )
                });
                in_flight.insert(
                    job.id,
                    InFlight {
                        shard: job.shard,
                        ranges: job.ranges.clone(),
                        dests,
                    },
                );
                if self.jobs.send(job).is_err() {
                    return Ok(());
                }
            }
            let front = pending.front().map(|p| (p.seq, p.missing));
            if let (Some((seq, _)), Some(p)) = (front, &poison) {
                if seq == p.seq {
                    // Every batch before it was delivered: now the error.
                    return Err(poison.take().expect("checked").error);
                }
            }
            // One batch at a time, topping up reads in between, so workers never wait for the
            // consumer to drain a whole group.
            if front.is_some_and(|(_, missing)| missing == 0) {
                let mut done = pending.pop_front().expect("front exists");
                if let Some(labels) = &plan.labels {
                    let width = plan.projection.columns[labels.column()].width;
                    let rows = done.buffer.rows;
                    labels.fill(&mut done.buffer, rows, width);
                }
                let batch = Assembled {
                    columns: done
                        .buffer
                        .into_record_batch(&plan.projection, &plan.schema)?,
                    stage: self.planner.segment.stage,
                    batch_index: done.global,
                    local_index: done.local,
                    segment: self.planner.segment,
                    mix: done.mix,
                };
                if self.out.send(Ok(batch)).is_err() {
                    return Ok(());
                }
                self.ready.fetch_add(1, Ordering::Relaxed);
                continue;
            }
            if pending.is_empty() && !planning {
                return Ok(());
            }
            if in_flight.is_empty() && queued.is_empty() {
                continue;
            }
            let (id, chunk, failure) = match self.done.recv_timeout(POLL) {
                Ok(result) => result,
                Err(RecvTimeoutError::Timeout) => {
                    if self.cancel.is_cancelled() {
                        return Ok(());
                    }
                    continue;
                }
                Err(RecvTimeoutError::Disconnected) => return Ok(()),
            };
            let job = in_flight
                .remove(&id)
                .expect("a result for a dispatched job");
            let rows_done = failure.as_ref().map_or(usize::MAX, |f| f.rows_done);
            let first_seq = pending.front().map_or(0, |p| p.seq);
            for &(row, seq, slot) in &job.dests {
                if (row as usize) >= rows_done {
                    continue;
                }
                let batch = &mut pending[(seq - first_seq) as usize];
                for (k, column) in plan.records.columns.iter().enumerate() {
                    let to = plan.record_map[k];
                    batch.buffer.columns[to.column].copy_row_into(
                        (
                            slot as usize,
                            plan.projection.columns[to.column].width,
                            to.offset,
                        ),
                        &chunk.columns[k],
                        row as usize,
                        column.width,
                    );
                }
                batch.missing -= 1;
            }
            if let Some(failure) = failure {
                Self::fail(&job, failure, &mut queued, &mut next_job, &mut poison);
            }
        }
    }

    /// Handles a read that failed after `rows_done` rows. When the error names one bad row, the
    /// batches that need it cannot be completed and the job's other undecoded rows are read
    /// again in a job of their own; otherwise no undecoded row of the job will come. Either way
    /// the earliest batch left incomplete is where the error surfaces.
    fn fail(
        job: &InFlight,
        failure: ReadFailure,
        queued: &mut VecDeque<(Job, Vec<Dest>)>,
        next_job: &mut u64,
        poison: &mut Option<Poison>,
    ) {
        let ReadFailure { rows_done, error } = failure;
        let shard_rows: Vec<u64> = job.ranges.iter().flat_map(Clone::clone).collect();
        let bad = bad_row(&error).and_then(|row| {
            shard_rows
                .iter()
                .skip(rows_done)
                .position(|&r| r == row)
                .map(|k| rows_done + k)
        });
        let Some(bad) = bad else {
            let seq = job
                .dests
                .iter()
                .filter(|d| d.0 as usize >= rows_done)
                .map(|d| d.1)
                .min();
            if let Some(seq) = seq {
                Poison::keep_earliest(poison, seq, error);
            }
            return;
        };
        if let Some(seq) = job
            .dests
            .iter()
            .filter(|d| d.0 as usize == bad)
            .map(|d| d.1)
            .min()
        {
            Poison::keep_earliest(poison, seq, error);
        }
        // The rows still to read: every undecoded one but the bad one, renumbered for the new
        // job's chunk.
        let retry: Vec<usize> = (rows_done..shard_rows.len())
            .filter(|&k| k != bad)
            .collect();
        if retry.is_empty() {
            return;
        }
        let mut ranges: Vec<Range<u64>> = Vec::new();
        let mut index_of = vec![u32::MAX; shard_rows.len()];
        for (new, &k) in retry.iter().enumerate() {
            index_of[k] = new as u32;
            let row = shard_rows[k];
            match ranges.last_mut() {
                Some(r) if r.end == row => r.end += 1,
                _ => ranges.push(row..row + 1),
            }
        }
        let dests: Vec<Dest> = job
            .dests
            .iter()
            .filter(|d| index_of[d.0 as usize] != u32::MAX)
            .map(|&(row, seq, slot)| (index_of[row as usize], seq, slot))
            .collect();
        queued.push_front((
            Job {
                id: *next_job,
                shard: job.shard,
                ranges,
                prefetch: None,
            },
            dests,
        ));
        *next_job += 1;
    }
}

#[cfg(test)]
mod tests {
    use super::plans_next;

    #[test]
    fn nothing_is_planned_past_the_first_batch_until_it_is_delivered() {
        let (group, jobs) = (128, 16);
        assert!(plans_next(None, 0, group, 0, jobs), "a fresh run plans");
        assert!(
            !plans_next(Some(0), 1, group, 0, jobs),
            "the next group's inspections would come before the first batch"
        );
        assert!(
            plans_next(Some(1), 1, group, 0, jobs),
            "then it plans ahead"
        );
        assert!(plans_next(Some(7), group, group, 0, jobs));
        assert!(
            !plans_next(Some(7), group + 1, group, 0, jobs),
            "two groups at most"
        );
        assert!(
            !plans_next(Some(7), 1, group, jobs, jobs),
            "and not while its reads wait"
        );
    }
}
