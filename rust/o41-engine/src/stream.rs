//! The public batch stream: open, resume, deliver, advance, checkpoint and close.
//!
//! A stream is safe to share between threads. Consumers take turns (`next` from two threads
//! gets distinct whole batches, in order); counters, positions and checkpoints read a small
//! state under a lock that is never held while waiting for data, so they answer at once; and
//! `close` from any thread stops the running pipeline, cancelling reads in flight.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{RecvTimeoutError, TryRecvError};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use arrow_array::RecordBatch;
use arrow_schema::SchemaRef;

use crate::checkpoint::check_config;
use crate::checkpoint::{Checkpoint, Cursor, Position, Switch};
use crate::config::{ResolvedConfig, StreamConfig};
use crate::error::{Error, Result};
use crate::memory::MemoryBound;
use crate::metrics::{DecodeReading, Meter, MeterReading};
use crate::order::{Segment, MAX_POSITION};
use crate::pipeline::{Assembled, Pipeline};
use crate::plan::{Plan, Planner};
use crate::resolve::{reopen, resolve, Resolved};
use crate::storage::Storage;

/// How long [`BatchStream::batches`] waits between looks at the stream's state.
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
    /// The rank's position once this batch (and every one before it) is consumed.
    pub position: Position,
}

/// Result of waiting for the next batch.
#[derive(Debug)]
pub enum Next {
    /// A batch.
    Batch(Box<Batch>),
    /// The stream has ended.
    End,
    /// Nothing arrived within the timeout; ask again.
    Pending,
}

/// Counters a stream exposes (`docs/metrics.md`). The first three belong to the run and
/// continue from a checkpoint; the rest count this stream object's work since it was opened or
/// resumed.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct StreamStats {
    /// Batches delivered to this rank over the whole run.
    pub batches_yielded: u64,
    /// Rows delivered to this rank over the whole run.
    pub rows_yielded: u64,
    /// Rows of the active finite stage that no rank will receive (the final unfillable round of
    /// `world_size` batches and any partial batch).
    pub dropped_rows: u64,
    /// This rank's batches in skipped ranges that the stream passed by since it was opened or
    /// resumed (`crate::skips`).
    pub skipped_batches: u64,
    /// The rows those batches would have held.
    pub skipped_rows: u64,
    /// Batches this stream delivered since it was opened or resumed.
    pub batches_delivered: u64,
    /// Of those, the ones that were not ready when `next` was called.
    pub batches_waited: u64,
    /// Time `next` blocked waiting for a batch the pipeline had not yet assembled.
    pub consumer_wait: Duration,
    /// Time between a delivery and the following call of `next`: the consumer's own time.
    pub consumer_time: Duration,
    /// Batches assembled and waiting for the consumer now.
    pub prefetch_depth: u64,
    /// The most batches that can wait for the consumer (`prefetch_batches`).
    pub prefetch_capacity: u64,
    /// What each source read, in stage then source order.
    pub sources: Vec<SourceStats>,
    /// What opening (or resuming) the stream read: manifests, and the shards it inspected.
    pub open: MeterReading,
    /// Decode time and rows of each encoding the stream reads, in first-seen order.
    pub decode: Vec<DecodeReading>,
}

/// What one source of a stream read.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct SourceStats {
    /// The stage it belongs to.
    pub stage: usize,
    /// Its index within the stage.
    pub source: usize,
    /// Its counters.
    pub read: MeterReading,
    /// Rows delivered from it since the stream was opened or resumed.
    pub rows_delivered: u64,
    /// Tokens a token stage's windows delivered from it (padding excluded); 0 for records.
    pub tokens_delivered: u64,
    /// Rows of its shards that a field's overflow rule `drop` leaves out of each pass over it
    /// (found at open: the same on every rank and after every resume).
    pub dropped_rows: u64,
    /// Its configured share of its stage's rows: its weight over the stage's weights.
    pub weight_share: f64,
}

/// The delivery timings, added to by `next`.
#[derive(Debug, Default)]
struct Delivery {
    delivered: AtomicU64,
    waited: AtomicU64,
    wait_nanos: AtomicU64,
    consumer_nanos: AtomicU64,
}

fn add_nanos(counter: &AtomicU64, d: Duration) {
    counter.fetch_add(
        u64::try_from(d.as_nanos()).unwrap_or(u64::MAX),
        Ordering::Relaxed,
    );
}

/// Which of the rank's local batches a stream yields: `offset, offset + stride, ...` (a
/// `DataLoader` worker's share); the default is all of them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Share {
    /// First local batch (since the origin) this stream yields.
    pub offset: u64,
    /// Distance between the local batches this stream yields.
    pub stride: u64,
}

impl Share {
    /// Refuses a share that yields nothing or overlaps another: `stride` must be at least 1 and
    /// `offset` below it.
    pub fn check(&self) -> Result<()> {
        if self.stride == 0 || self.offset >= self.stride {
            return Err(Error::config(
                "share",
                format!(
                    "({}, {}) is not (offset, stride) with 0 <= offset < stride",
                    self.offset, self.stride
                ),
            ));
        }
        Ok(())
    }
}

impl Default for Share {
    fn default() -> Self {
        Share {
            offset: 0,
            stride: 1,
        }
    }
}

/// What a resumed stream must match besides the checkpoint's own consistency.
#[derive(Debug, Clone, Copy, Default)]
pub struct Expect<'a> {
    /// This process's rank, when known.
    pub rank: Option<usize>,
    /// This process's world size, when known.
    pub world_size: Option<usize>,
    /// The config the checkpoint must have been taken from.
    pub config: Option<&'a StreamConfig>,
}

/// Where a stream starts.
#[derive(Debug, Clone, Copy)]
struct Start {
    /// Active segment.
    segment: Segment,
    /// Round origin: every global batch before it has been consumed.
    origin: u64,
    /// Rank-level counters at the origin.
    batches_base: u64,
    /// Rank-level counters at the origin.
    rows_base: u64,
    share: Share,
}

/// Where a stream starts: its [`Start`] and the curriculum switches pending there.
struct Origin {
    start: Start,
    switches: Vec<Switch>,
}

/// From local batch `local` on, the stream reads `segment`, whose first round there begins at
/// global batch `round`. Local batches map to global ones through the span holding them: in
/// turn (`world_size` global batches per local one), or one for one in a ramped segment, where
/// every rank reads a share of every batch.
#[derive(Debug, Clone, Copy)]
struct Span {
    local: u64,
    round: u64,
    segment: Segment,
}

/// The part of a stream that changes as it delivers.
struct State {
    pipeline: Option<Pipeline>,
    /// Bumped whenever the pipeline is replaced, so a consumer that waited on the old one's
    /// output drops it instead of putting it back.
    generation: u64,
    segment: Segment,
    /// Next local batch this stream will deliver.
    next_local: u64,
    /// Rank-level local batches consumed once the last delivered batch is (its index + 1).
    consumed: u64,
    /// The segments read since the origin, in order; the last is the active one.
    spans: Vec<Span>,
    end_batch: Option<u64>,
    /// Advances at later local batches than this stream's next one, `(stage, at)` by
    /// increasing `at`: each applies once the stream reaches it.
    pending: Vec<(usize, u64)>,
    closed: bool,
    /// When the last batch was delivered, until the next call of `next` starts.
    last_delivered: Option<Instant>,
    /// The batch `next` is waiting for was not ready when first asked for.
    waiting: bool,
    /// Rows and tokens delivered since open or resume, by flat source index.
    delivered: Vec<(u64, u64)>,
}

/// An open stream.
pub struct BatchStream {
    plan: Arc<Plan>,
    start: Start,
    /// Consumers (and `advance`) take turns; nothing else waits on it.
    turn: Mutex<()>,
    state: Mutex<State>,
    /// What open or resume read.
    open_meter: Arc<Meter>,
    delivery: Delivery,
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    // Nothing panics while holding these locks; a poisoned one still holds consistent state.
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

impl BatchStream {
    /// Resolves `config` and starts the stream at its beginning, yielding `share` of the rank's
    /// batches.
    pub fn open(config: &StreamConfig, storage: &Storage, share: Share) -> Result<Self> {
        share.check()?;
        let start = Start {
            segment: Segment::first(),
            origin: 0,
            batches_base: 0,
            rows_base: 0,
            share,
        };
        let meter = Arc::new(Meter::default());
        let resolved = resolve(config, &storage.with_meter(meter.clone()))?;
        let origin = Origin {
            start,
            switches: Vec::new(),
        };
        Self::start(resolved, origin, meter)
    }

    /// Re-opens the stream a checkpoint describes, at the checkpoint's position, after checking
    /// it against `expect`: the process's rank and world size and the config it must come from.
    /// `share` counts from the checkpoint's position.
    pub fn resume(
        checkpoint: &Checkpoint,
        storage: &Storage,
        share: Share,
        expect: Expect<'_>,
    ) -> Result<Self> {
        share.check()?;
        checkpoint.check_process(expect.rank, expect.world_size)?;
        // A config may add skipped ranges ahead of the checkpoint: the stream it resumes is
        // the checkpoint's with those skips (and their fingerprint).
        let skipping;
        let checkpoint = match expect.config {
            Some(config) if config.skip_batches != checkpoint.resolved.skip_batches => {
                skipping = checkpoint.with_skips(&config.skip_batches)?;
                &skipping
            }
            _ => checkpoint,
        };
        if let Some(config) = expect.config {
            check_config(&checkpoint.resolved, config)?;
        }
        let meter = Arc::new(Meter::default());
        let resolved = reopen(checkpoint, &storage.with_meter(meter.clone()))?;
        let start = Start {
            segment: checkpoint.position.cursor.segment,
            origin: checkpoint.position.cursor.next_batch,
            batches_base: checkpoint.position.batches_yielded,
            rows_base: checkpoint.position.rows_yielded,
            share,
        };
        let origin = Origin {
            start,
            switches: checkpoint.position.switches.clone(),
        };
        Self::start(resolved, origin, meter)
    }

    fn start(resolved: Resolved, origin: Origin, open_meter: Arc<Meter>) -> Result<Self> {
        let Origin { start, switches } = origin;
        let plan = Arc::new(Plan::new(resolved)?);
        plan.order
            .check_cursor(&start.segment, start.origin, plan.world())?;
        if start.batches_base > MAX_POSITION || start.rows_base > MAX_POSITION {
            return Err(Error::Checkpoint {
                message: format!(
                    "its counters ({} batches, {} rows) are beyond any a stream reaches",
                    start.batches_base, start.rows_base
                ),
            });
        }
        crate::skips::check_rounds(
            &plan.resolved.skip_batches,
            start.origin,
            plan.world(),
            plan.order.split(&start.segment),
        )?;
        let end_batch = plan
            .order
            .end_batch(&start.segment, start.origin, plan.world());
        let sources = plan.shards.meters.len();
        let stream = BatchStream {
            plan,
            start,
            turn: Mutex::new(()),
            state: Mutex::new(State {
                pipeline: None,
                generation: 0,
                segment: start.segment,
                next_local: start.share.offset,
                consumed: 0,
                spans: vec![Span {
                    local: 0,
                    round: start.origin,
                    segment: start.segment,
                }],
                end_batch,
                pending: Vec::new(),
                closed: false,
                last_delivered: None,
                waiting: false,
                delivered: vec![(0, 0); sources],
            }),
            open_meter,
            delivery: Delivery::default(),
        };
        {
            let mut state = lock(&stream.state);
            // The checkpoint's pending switches, placed before the first launch so that a switch
            // at its first batch starts no pipeline for the old stage.
            for Switch { stage, at } in switches {
                let local = stream.local_at(&state, at);
                stream.advance_locked(&mut state, stage, local)?;
            }
            stream.launch(&mut state)?;
        }
        Ok(stream)
    }

    fn launch(&self, state: &mut State) -> Result<()> {
        let span = state.spans.last().expect("a stream always has a span");
        let planner = Planner::new(
            self.plan.clone(),
            state.segment,
            (span.local, span.round),
            state.next_local,
            self.start.share.stride,
            state.end_batch,
        );
        state.pipeline = Some(Pipeline::launch(&self.plan, planner)?);
        state.generation += 1;
        Ok(())
    }

    /// Waits up to `timeout` for the next batch. Concurrent callers take turns, each receiving
    /// distinct batches in order.
    pub fn next_timeout(&self, timeout: Duration) -> Result<Next> {
        let called = Instant::now();
        let _turn = lock(&self.turn);
        let (output, generation) = {
            let mut state = lock(&self.state);
            if let Some(delivered) = state.last_delivered.take() {
                add_nanos(
                    &self.delivery.consumer_nanos,
                    called.saturating_duration_since(delivered),
                );
            }
            if state.closed {
                return Err(Error::Closed);
            }
            while let Some(&(stage, at)) = state.pending.first() {
                if state.next_local < at {
                    break;
                }
                let g = self.round_of(&state, at);
                let segment = self.plan.order.advance(&state.segment, g, stage)?;
                if segment == state.segment {
                    state.pending.remove(0);
                    continue;
                }
                self.switch(&mut state, segment, at, g)?;
            }
            let generation = state.generation;
            match state.pipeline.as_mut().and_then(|p| p.output.take()) {
                Some(output) => (output, generation),
                None => return Ok(Next::End),
            }
        };
        // The state lock is free while waiting: stats, checkpoints and close answer at once.
        let (received, empty) = match output.try_recv() {
            Ok(received) => (Ok(received), false),
            Err(TryRecvError::Disconnected) => (Err(RecvTimeoutError::Disconnected), false),
            Err(TryRecvError::Empty) => {
                // The batch's position needs the fingerprint, which hashes every shard entry:
                // hash while the workers read, not after (once; the first batch of a large
                // corpus otherwise waits for both). Not counted as waiting for the pipeline.
                self.plan.fingerprint();
                let waiting = Instant::now();
                let received = output.recv_timeout(timeout);
                add_nanos(&self.delivery.wait_nanos, waiting.elapsed());
                (received, true)
            }
        };
        let mut state = lock(&self.state);
        state.waiting |= empty;
        if state.closed {
            return Err(Error::Closed);
        }
        if state.generation == generation {
            if let Some(pipeline) = state.pipeline.as_mut() {
                pipeline.output = Some(output);
                if matches!(received, Ok(Ok(_))) {
                    pipeline.ready.fetch_sub(1, Ordering::Relaxed);
                }
            }
        }
        match received {
            Ok(Ok(batch)) => {
                self.delivery.delivered.fetch_add(1, Ordering::Relaxed);
                if std::mem::take(&mut state.waiting) {
                    self.delivery.waited.fetch_add(1, Ordering::Relaxed);
                }
                state.last_delivered = Some(Instant::now());
                state.next_local = batch.local_index + self.start.share.stride;
                state.consumed = batch.local_index + 1;
                for count in &batch.mix {
                    let (rows, tokens) = &mut state.delivered[count.source];
                    *rows += count.rows;
                    *tokens += count.tokens;
                }
                let position = self.position_in(&state, batch.local_index + 1, batch.segment);
                Ok(Next::Batch(Box::new(deliver(batch, position))))
            }
            Ok(Err(e)) => Err(e),
            Err(RecvTimeoutError::Timeout) => Ok(Next::Pending),
            Err(RecvTimeoutError::Disconnected) => Ok(Next::End),
        }
    }

    /// The remaining batches, each waited for as long as it takes.
    pub fn batches(&self) -> impl Iterator<Item = Result<Batch>> + '_ {
        std::iter::from_fn(move || loop {
            match self.next_timeout(POLL) {
                Ok(Next::Batch(b)) => return Some(Ok(*b)),
                Ok(Next::End) => return None,
                Ok(Next::Pending) => {}
                Err(e) => return Some(Err(e)),
            }
        })
    }

    /// Switches to `stage` at the next batch boundary: after the batches already delivered.
    /// Prefetched batches are discarded (their rows are not lost) and the rows left in the
    /// current stage's shuffle window are delivered first. A same-stage advance is a no-op.
    pub fn advance(&self, stage: usize) -> Result<()> {
        let _turn = lock(&self.turn);
        let mut state = lock(&self.state);
        let offset = self.start.share.offset;
        let at = state
            .consumed
            .max(state.next_local.min(state.consumed.max(offset)));
        self.advance_locked(&mut state, stage, at)
    }

    /// Switches to `stage` at global batch `at`: the new stage's batches start at the first
    /// round of `world_size` batches (counted from the stream's origin) that begins at or after
    /// `at`. Every rank and every `DataLoader` worker of a rank that passes the same `at` switches
    /// at the same batch, whenever each makes the call, as long as none has delivered a batch
    /// of that round yet.
    pub fn advance_at(&self, stage: usize, at: u64) -> Result<()> {
        let _turn = lock(&self.turn);
        let mut state = lock(&self.state);
        if at < self.start.origin {
            return Err(Error::config(
                "advance.at",
                format!(
                    "global batch {at} is before this stream's first batch {}",
                    self.start.origin
                ),
            ));
        }
        let local = self.local_at(&state, at);
        self.advance_locked(&mut state, stage, local)
    }

    fn advance_locked(&self, state: &mut State, stage: usize, at: u64) -> Result<()> {
        if state.closed {
            return Err(Error::Closed);
        }
        if at < state.consumed {
            return Err(Error::config(
                "advance",
                format!(
                    "the switch at local batch {at} comes after batches already delivered (through {})",
                    state.consumed - 1
                ),
            ));
        }
        let g = self.round_of(state, at);
        if g < state.segment.start_batch {
            return Err(Error::config(
                "advance",
                format!("local batch {at} is before the active stage began"),
            ));
        }
        let (at, g) = self.aligned_switch(state, at, g)?;
        // The latest request wins over those at or after it.
        state.pending.retain(|&(_, pending)| pending < at);
        if let Some(&(current, _)) = state.pending.last() {
            // Another switch comes first: this one is checked against its stage when reached.
            if stage != current {
                state.pending.push((stage, at));
            }
            return Ok(());
        }
        let segment = self.plan.order.advance(&state.segment, g, stage)?;
        if segment == state.segment {
            return Ok(());
        }
        if at > state.next_local {
            // This stream still owes batches of the old stage before `at` (other workers of the
            // rank delivered the ones in between): switch once they are delivered.
            state.pending.push((stage, at));
            return Ok(());
        }
        self.switch(state, segment, at, g)
    }

    /// The first local batch from `at` on (whose round begins at `g`) where a partitioned
    /// stream may switch stages: its round begins a multiple of `partitions` batches after the
    /// active segment's start. Every rank finds the same one; a world whose rounds never meet
    /// such a batch is refused.
    fn aligned_switch(&self, state: &State, at: u64, g: u64) -> Result<(u64, u64)> {
        let order = &self.plan.order;
        let start = state.segment.start_batch;
        let step = self.per_local(&state.segment);
        for k in 0..order.partitions() {
            let round = g + k * step;
            if order.switch_aligned(start, round) {
                return Ok((at + k, round));
            }
        }
        Err(Error::config(
            "advance",
            format!(
                "no round of {step} batches after global batch {g} begins a multiple of \
                 partitions={} batches after the active stage began at {start}; resume on a \
                 world size that divides the partitions to switch stages",
                order.partitions()
            ),
        ))
    }

    /// Switches to `segment` from local batch `at`, whose round begins at global batch `g`.
    fn switch(&self, state: &mut State, segment: Segment, at: u64, g: u64) -> Result<()> {
        state.pending.retain(|&(_, pending)| pending > at);
        if let Some(mut pipeline) = state.pipeline.take() {
            pipeline.stop();
        }
        state.segment = segment;
        state.end_batch = self.plan.order.end_batch(&segment, g, self.plan.world());
        state.spans.retain(|span| span.local < at);
        state.spans.push(Span {
            local: at,
            round: g,
            segment,
        });
        // The first local batch at or after `at` in this stream's share.
        let Share { offset, stride } = self.start.share;
        state.next_local = if at <= offset {
            offset
        } else {
            offset + (at - offset).div_ceil(stride) * stride
        };
        state.consumed = state.consumed.max(at);
        if state.generation == 0 {
            // Not launched yet: `start` places a checkpoint's switches, then launches once.
            return Ok(());
        }
        self.launch(state)
    }

    /// The span holding local batch `local`.
    fn span_of(state: &State, local: u64) -> &Span {
        let i = state.spans.partition_point(|span| span.local <= local);
        &state.spans[i.max(1) - 1]
    }

    /// Global batches per local batch in `segment`.
    fn per_local(&self, segment: &Segment) -> u64 {
        if self.plan.order.split(segment) {
            1
        } else {
            self.plan.world()
        }
    }

    /// The global batch that begins the round of local batch `local`.
    fn round_of(&self, state: &State, local: u64) -> u64 {
        let span = Self::span_of(state, local);
        span.round + (local - span.local) * self.per_local(&span.segment)
    }

    /// The first local batch whose round begins at or after global batch `g` (not before the
    /// origin).
    fn local_at(&self, state: &State, g: u64) -> u64 {
        let i = state.spans.partition_point(|span| span.round <= g);
        let span = &state.spans[i.max(1) - 1];
        span.local + (g.saturating_sub(span.round)).div_ceil(self.per_local(&span.segment))
    }

    /// The rank's local batches `[0, local)` since the origin, span by span: the span, the
    /// global batch its first local batch reads, and how many local batches it holds.
    fn span_runs<'a>(
        &'a self,
        state: &'a State,
        local: u64,
    ) -> impl Iterator<Item = (&'a Span, u64, u64)> + 'a {
        state.spans.iter().enumerate().map(move |(i, span)| {
            let to = state
                .spans
                .get(i + 1)
                .map_or(local, |next| next.local.min(local));
            let first = if self.plan.order.split(&span.segment) {
                span.round
            } else {
                span.round + self.plan.rank()
            };
            (span, first, to.saturating_sub(span.local))
        })
    }

    /// What the rank received in its local batches `[0, local)` since the origin, `(batches,
    /// rows)` (padding excluded), and what it passed by in skipped ranges: skipped batches are
    /// never delivered, so they are not counted as received.
    fn received_before(&self, state: &State, local: u64) -> ((u64, u64), (u64, u64)) {
        let world = self.plan.world();
        let order = &self.plan.order;
        let skips = &self.plan.resolved.skip_batches;
        let (mut rows, mut skipped) = (0, (0, 0));
        for (span, first, count) in self.span_runs(state, local) {
            rows += order.rows_received(&span.segment, first, count, world);
            let step = self.per_local(&span.segment);
            for (from, n) in crate::skips::runs_in(skips, first, step, count) {
                skipped.0 += n;
                skipped.1 += order.rows_received(&span.segment, first + from * step, n, world);
            }
        }
        ((local - skipped.0, rows - skipped.1), skipped)
    }

    /// The switches a stream at global batch `next_batch` in `segment` has not reached: those
    /// it applied since (a consumer may hold batches from before a switch) and those pending.
    fn switches_after(&self, state: &State, next_batch: u64, segment: &Segment) -> Vec<Switch> {
        let applied = state
            .spans
            .iter()
            .filter(|span| {
                span.round > next_batch || (span.round == next_batch && span.segment != *segment)
            })
            .map(|span| Switch {
                stage: span.segment.stage,
                at: span.round,
            });
        let pending = state.pending.iter().map(|&(stage, at)| Switch {
            stage,
            at: self.round_of(state, at),
        });
        applied.chain(pending).collect()
    }

    /// The position after the rank's first `consumed` local batches since the origin, with
    /// `segment` active.
    fn position_in(&self, state: &State, consumed: u64, segment: Segment) -> Position {
        let next_batch = self.round_of(state, consumed);
        let ((batches, rows), _) = self.received_before(state, consumed);
        Position {
            fingerprint: self.plan.fingerprint().to_owned(),
            rank: self.plan.resolved.rank,
            world_size: self.plan.resolved.world_size,
            cursor: Cursor {
                segment,
                next_batch,
            },
            stage: segment.stage,
            batches_yielded: self.start.batches_base + batches,
            rows_yielded: self.start.rows_base + rows,
            epochs: self.plan.order.epochs(&segment, next_batch),
            switches: self.switches_after(state, next_batch, &segment),
        }
    }

    /// The position after the last delivered batch (which counts as consumed).
    pub fn position(&self) -> Position {
        let state = lock(&self.state);
        self.position_in(&state, state.consumed, state.segment)
    }

    /// The checkpoint after the last delivered batch (which counts as consumed). A stream's
    /// own position always fits its document; were it not to, the caller gets the checkpoint
    /// check's refusal, never a panic.
    pub fn checkpoint(&self) -> Result<Checkpoint> {
        let position = self.position();
        Checkpoint::from_fingerprinted(
            self.plan.resolved.clone(),
            self.plan.fingerprint(),
            position,
        )
    }

    /// The checkpoint at `position`, one of this stream's positions (a batch's, possibly
    /// delivered by another worker of the rank), with the curriculum switches this stream
    /// received since that batch was delivered.
    pub fn checkpoint_at(&self, position: &Position) -> Result<Checkpoint> {
        let known = {
            let state = lock(&self.state);
            let cursor = &position.cursor;
            self.switches_after(&state, cursor.next_batch, &cursor.segment)
        };
        let position = known
            .iter()
            .fold(position.clone(), |p, s| p.with_switch(s.stage, s.at));
        Checkpoint::from_fingerprinted(
            self.plan.resolved.clone(),
            self.plan.fingerprint(),
            position,
        )
    }

    /// Stops every thread, cancelling reads in flight. Idempotent; any thread may call it.
    pub fn close(&self) {
        let pipeline = {
            let mut state = lock(&self.state);
            state.closed = true;
            state.pipeline.take()
        };
        if let Some(mut pipeline) = pipeline {
            pipeline.stop();
        }
    }

    /// True once `close` has run.
    pub fn is_closed(&self) -> bool {
        lock(&self.state).closed
    }

    /// The resolved document the stream runs.
    pub fn resolved(&self) -> &ResolvedConfig {
        &self.plan.resolved
    }

    /// Schema of delivered batches.
    pub fn schema(&self) -> &SchemaRef {
        &self.plan.schema
    }

    /// The working-set bound computed at open.
    pub fn memory_bound(&self) -> &MemoryBound {
        &self.plan.bound
    }

    /// What each token stage's windows hold (`None` for a stage of records): tokens, windows
    /// and the padding fraction of one epoch.
    pub fn token_stats(&self) -> Vec<Option<crate::plan::TokenStats>> {
        self.plan.token_stats()
    }

    /// The active stage.
    pub fn stage(&self) -> usize {
        lock(&self.state).segment.stage
    }

    /// Delivery counters, timings and what the stream read (`docs/metrics.md`).
    pub fn stats(&self) -> StreamStats {
        let (batches_yielded, rows_yielded, dropped_rows, prefetch_depth, delivered, skipped) = {
            let state = lock(&self.state);
            let ((batches, rows), skipped) = self.received_before(&state, state.consumed);
            (
                self.start.batches_base + batches,
                self.start.rows_base + rows,
                state
                    .end_batch
                    .map_or(0, |end| self.plan.order.dropped_rows(&state.segment, end)),
                state
                    .pipeline
                    .as_ref()
                    .map_or(0, |p| p.ready.load(Ordering::Relaxed).max(0) as u64),
                state.delivered.clone(),
                skipped,
            )
        };
        let plan = &self.plan;
        let mut sources = Vec::with_capacity(plan.shards.meters.len());
        for (stage, config) in plan.resolved.stages.iter().enumerate() {
            let weights: f64 = config.sources.iter().map(|s| s.weight).sum();
            for (source, resolved) in config.sources.iter().enumerate() {
                let (rows_delivered, tokens_delivered) = delivered[sources.len()];
                sources.push(SourceStats {
                    stage,
                    source,
                    read: plan.shards.meters[sources.len()].reading(),
                    rows_delivered,
                    tokens_delivered,
                    dropped_rows: plan.dropped_rows[sources.len()],
                    weight_share: resolved.weight / weights,
                });
            }
        }
        let nanos = |counter: &AtomicU64| Duration::from_nanos(counter.load(Ordering::Relaxed));
        StreamStats {
            batches_yielded,
            rows_yielded,
            dropped_rows,
            skipped_batches: skipped.0,
            skipped_rows: skipped.1,
            batches_delivered: self.delivery.delivered.load(Ordering::Relaxed),
            batches_waited: self.delivery.waited.load(Ordering::Relaxed),
            consumer_wait: nanos(&self.delivery.wait_nanos),
            consumer_time: nanos(&self.delivery.consumer_nanos),
            prefetch_depth,
            prefetch_capacity: plan.resolved.prefetch_batches as u64,
            sources,
            open: self.open_meter.reading(),
            decode: plan.decode.reading(&plan.encodings),
        }
    }
}

fn deliver(batch: Assembled, position: Position) -> Batch {
    Batch {
        columns: batch.columns,
        stage: batch.stage,
        batch_index: batch.batch_index,
        local_index: batch.local_index,
        segment: batch.segment,
        position,
    }
}

impl Drop for BatchStream {
    fn drop(&mut self) {
        self.close();
    }
}
