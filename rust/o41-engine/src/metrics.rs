//! The counters a stream keeps while it runs (`docs/metrics.md`): what each source read, the
//! retries of its remote reads and why, and the time decoders spent on each format.
//!
//! Counting is meant to stay on: every counter is a relaxed atomic added to once per read call,
//! read job or retry, never per row, and nothing here takes a lock. Storage waits are also
//! added to a per-thread total, so a decode worker can take the time its reader spent waiting
//! for bytes out of the time it spent in the reader, leaving the decode time alone.

use std::cell::Cell;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use crate::encoding::Encoding;

/// Why a remote request was tried again.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum RetryCause {
    /// The service asked the client to slow down (HTTP 429, or S3's 503 `SlowDown`).
    Throttled,
    /// The service failed the request (another 5xx status).
    ServerError,
    /// No answer, or a response that went silent, within the policy's timeouts (or HTTP 408).
    Timeout,
    /// The connection failed before a response arrived (refused, reset, lost).
    Connection,
    /// A response body broke off, or ended, before its last byte; the read resumes there.
    Interrupted,
}

impl RetryCause {
    /// Every cause, in the order counters list them.
    pub const ALL: [RetryCause; 5] = [
        RetryCause::Throttled,
        RetryCause::ServerError,
        RetryCause::Timeout,
        RetryCause::Connection,
        RetryCause::Interrupted,
    ];

    /// The cause's name in stats.
    pub fn name(self) -> &'static str {
        match self {
            RetryCause::Throttled => "throttled",
            RetryCause::ServerError => "server_error",
            RetryCause::Timeout => "timeout",
            RetryCause::Connection => "connection",
            RetryCause::Interrupted => "interrupted",
        }
    }

    fn index(self) -> usize {
        self as usize
    }
}

/// Retries by cause, in [`RetryCause::ALL`] order.
pub type Retries = [u64; RetryCause::ALL.len()];

thread_local! {
    /// Nanoseconds this thread has spent waiting on metered storage reads.
    static WAITED: Cell<u64> = const { Cell::new(0) };
}

/// Nanoseconds the calling thread has waited on metered storage reads so far; the difference of
/// two readings is the wait between them.
pub fn thread_waited() -> u64 {
    WAITED.with(Cell::get)
}

fn nanos(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

/// What one source of a stream (or the stream's open) read: storage counters, which the storage
/// layer adds to, and decode counters, which the pipeline adds to.
#[derive(Debug, Default)]
pub struct Meter {
    bytes: AtomicU64,
    wait_nanos: AtomicU64,
    retries: [AtomicU64; RetryCause::ALL.len()],
    rows: AtomicU64,
    shards_opened: AtomicU64,
}

/// A reading of a [`Meter`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct MeterReading {
    /// Bytes received from storage.
    pub bytes_read: u64,
    /// Time threads spent waiting for those bytes.
    pub read_wait: Duration,
    /// Retries of remote requests, by cause.
    pub retries: Retries,
    /// Rows decoded.
    pub rows_read: u64,
    /// Shard readers opened.
    pub shards_opened: u64,
}

impl Meter {
    /// Counts `bytes` received by a read that started waiting at `since`.
    pub fn read(&self, bytes: u64, since: Instant) {
        let waited = nanos(since.elapsed());
        self.bytes.fetch_add(bytes, Ordering::Relaxed);
        self.wait_nanos.fetch_add(waited, Ordering::Relaxed);
        WAITED.with(|w| w.set(w.get().saturating_add(waited)));
    }

    /// Counts `bytes` received without timing their read.
    pub fn bytes(&self, bytes: u64) {
        self.bytes.fetch_add(bytes, Ordering::Relaxed);
    }

    /// Counts one retry of a remote request.
    pub fn retry(&self, cause: RetryCause) {
        self.retries[cause.index()].fetch_add(1, Ordering::Relaxed);
    }

    /// Counts `rows` decoded.
    pub fn rows(&self, rows: u64) {
        self.rows.fetch_add(rows, Ordering::Relaxed);
    }

    /// Counts one shard reader opened.
    pub fn shard_opened(&self) {
        self.shards_opened.fetch_add(1, Ordering::Relaxed);
    }

    /// The counters now.
    pub fn reading(&self) -> MeterReading {
        MeterReading {
            bytes_read: self.bytes.load(Ordering::Relaxed),
            read_wait: Duration::from_nanos(self.wait_nanos.load(Ordering::Relaxed)),
            retries: std::array::from_fn(|k| self.retries[k].load(Ordering::Relaxed)),
            rows_read: self.rows.load(Ordering::Relaxed),
            shards_opened: self.shards_opened.load(Ordering::Relaxed),
        }
    }
}

/// Decode counters of every encoding.
#[derive(Debug, Default)]
pub struct DecodeMeter {
    nanos: [AtomicU64; Encoding::ALL.len()],
    rows: [AtomicU64; Encoding::ALL.len()],
}

/// What decoders did with one encoding.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DecodeReading {
    /// The encoding.
    pub encoding: Encoding,
    /// Rows decoded.
    pub rows: u64,
    /// Time decode workers spent in readers of this encoding, less their storage waits.
    pub time: Duration,
}

fn encoding_index(encoding: Encoding) -> usize {
    Encoding::ALL
        .iter()
        .position(|&e| e == encoding)
        .expect("every encoding is listed")
}

impl DecodeMeter {
    /// Counts `rows` of `encoding` decoded in `time`.
    pub fn decoded(&self, encoding: Encoding, rows: u64, time: Duration) {
        let k = encoding_index(encoding);
        self.rows[k].fetch_add(rows, Ordering::Relaxed);
        self.nanos[k].fetch_add(nanos(time), Ordering::Relaxed);
    }

    /// The counters of `encodings` now, in that order.
    pub fn reading(&self, encodings: &[Encoding]) -> Vec<DecodeReading> {
        encodings
            .iter()
            .map(|&encoding| {
                let k = encoding_index(encoding);
                DecodeReading {
                    encoding,
                    rows: self.rows[k].load(Ordering::Relaxed),
                    time: Duration::from_nanos(self.nanos[k].load(Ordering::Relaxed)),
                }
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_meter_counts_and_the_thread_total_follows_its_waits() {
        let meter = Meter::default();
        let before = thread_waited();
        let since = Instant::now();
        std::thread::sleep(Duration::from_millis(2));
        meter.read(100, since);
        meter.read(20, Instant::now());
        meter.retry(RetryCause::Interrupted);
        meter.retry(RetryCause::Interrupted);
        meter.retry(RetryCause::Throttled);
        meter.rows(7);
        meter.shard_opened();
        let reading = meter.reading();
        assert_eq!(reading.bytes_read, 120);
        assert_eq!(reading.retries, [1, 0, 0, 0, 2]);
        assert_eq!((reading.rows_read, reading.shards_opened), (7, 1));
        assert!(reading.read_wait >= Duration::from_millis(2));
        assert_eq!(thread_waited() - before, nanos(reading.read_wait));
        // Another thread's waits are its own.
        std::thread::spawn(move || assert_eq!(thread_waited(), 0))
            .join()
            .unwrap();
    }

    #[test]
    fn decode_counters_are_kept_per_encoding() {
        let meter = DecodeMeter::default();
        meter.decoded(Encoding::Msgpack, 10, Duration::from_millis(3));
        meter.decoded(Encoding::Msgpack, 5, Duration::from_millis(1));
        meter.decoded(Encoding::Parquet, 1, Duration::from_millis(1));
        let got = meter.reading(&[Encoding::Msgpack, Encoding::Jsonl]);
        assert_eq!(got[0].rows, 15);
        assert_eq!(got[0].time, Duration::from_millis(4));
        assert_eq!((got[1].rows, got[1].time), (0, Duration::ZERO));
    }
}
