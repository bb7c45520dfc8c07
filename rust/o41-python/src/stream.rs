//! `_core.Stream`: the engine's batch stream, driven from Python one batch at a time.
//!
//! The engine stream is safe to share between threads, so this class holds it without a lock
//! of its own: a monitoring thread reading `stats` or taking a checkpoint never waits for a
//! `next` that is blocked on storage, and `close` from any thread stops it.

use arrow_pyarrow::ToPyArrow;
use o41_engine::metrics::{MeterReading, RetryCause};
use o41_engine::resolve::resolve;
use o41_engine::stream::{Expect, Next, Share};
use o41_engine::{BatchStream, StreamConfig};
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyList};

use crate::blocking::{blocking, wait, Step};
use crate::checkpoint::{config_of, Checkpoint};
use crate::errors::to_py;
use crate::position::Position;
use crate::storage::{engine, Storage};

/// Resolves a stream config (JSON) and returns the resolved document (JSON).
#[pyfunction]
#[pyo3(signature = (config_json, storage=None))]
pub fn resolve_config(
    py: Python<'_>,
    config_json: &str,
    storage: Option<&Storage>,
) -> PyResult<String> {
    let storage = engine(storage);
    blocking(py, |cancel| {
        let config = StreamConfig::from_json(config_json)?;
        resolve(&config, &storage.with_cancel(cancel.clone())).map(|r| r.config.to_json())
    })
}

/// One batch as handed to Python: columns, stage, global index, local index and the position
/// after it.
type BatchTuple<'py> = (Bound<'py, PyAny>, usize, u64, u64, Position);

/// An open batch stream. Use `o41_training_data.open_batch_stream`, not this class.
#[pyclass(module = "o41_training_data._core", frozen)]
pub struct Stream {
    inner: BatchStream,
}

impl Stream {
    /// The open engine stream; `StreamClosedError` once closed.
    fn open(&self, py: Python<'_>) -> PyResult<&BatchStream> {
        if self.inner.is_closed() {
            Err(to_py(py, &o41_engine::Error::Closed))
        } else {
            Ok(&self.inner)
        }
    }
}

fn share(offset: u64, stride: u64) -> Share {
    Share { offset, stride }
}

#[pymethods]
impl Stream {
    /// Resolves the config (JSON) and starts the stream; raises at open on any bad input.
    /// `offset`/`stride` select a share of the rank's local batches (a `DataLoader` worker's).
    #[new]
    #[pyo3(signature = (config_json, offset=0, stride=1, storage=None))]
    fn new(
        py: Python<'_>,
        config_json: &str,
        offset: u64,
        stride: u64,
        storage: Option<&Storage>,
    ) -> PyResult<Self> {
        let storage = engine(storage);
        let inner = blocking(py, |cancel| {
            let config = StreamConfig::from_json(config_json)?;
            let storage = storage.with_cancel(cancel.clone());
            BatchStream::open(&config, &storage, share(offset, stride))
        })?;
        Ok(Stream { inner })
    }

    /// Re-opens the stream a checkpoint describes, after checking it against this process's
    /// `rank`/`world_size` and the `config` (a `BatchStreamConfig`) it must come from, when
    /// given. `offset`/`stride` select a share of the rank's local batches.
    #[staticmethod]
    #[pyo3(signature = (checkpoint, offset=0, stride=1, storage=None, *, rank=None, world_size=None, config=None))]
    #[allow(clippy::too_many_arguments)]
    fn resume(
        py: Python<'_>,
        checkpoint: &Checkpoint,
        offset: u64,
        stride: u64,
        storage: Option<&Storage>,
        rank: Option<usize>,
        world_size: Option<usize>,
        config: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<Self> {
        let config = config.map(|c| config_of(py, c)).transpose()?;
        let storage = engine(storage);
        let expect = Expect {
            rank,
            world_size,
            config: config.as_ref(),
        };
        let inner = blocking(py, |cancel| {
            let storage = storage.with_cancel(cancel.clone());
            BatchStream::resume(&checkpoint.inner, &storage, share(offset, stride), expect)
        })?;
        Ok(Stream { inner })
    }

    /// The next batch as `(record_batch, stage, batch_index, local_index, position)`, or None.
    fn next_batch<'py>(&self, py: Python<'py>) -> PyResult<Option<BatchTuple<'py>>> {
        let stream = &self.inner;
        let next = wait(
            py,
            |timeout| match stream.next_timeout(timeout)? {
                Next::Pending => Ok(Step::Pending),
                other => Ok(Step::Done(other)),
            },
            // An interrupted wait leaves the stream as it was: the next call continues.
            || {},
        )?;
        let Next::Batch(batch) = next else {
            return Ok(None);
        };
        let batch = *batch;
        Ok(Some((
            batch.columns.to_pyarrow(py)?,
            batch.stage,
            batch.batch_index,
            batch.local_index,
            Position {
                inner: batch.position,
            },
        )))
    }

    /// Switches stage: at the next batch boundary, or at global batch `at` (the first round
    /// that starts at or after it) when given.
    #[pyo3(signature = (stage, at=None))]
    fn advance(&self, py: Python<'_>, stage: usize, at: Option<u64>) -> PyResult<()> {
        let stream = &self.inner;
        blocking(py, |_| match at {
            Some(at) => stream.advance_at(stage, at),
            None => stream.advance(stage),
        })
    }

    /// The position after the last delivered batch.
    fn position(&self, py: Python<'_>) -> PyResult<Position> {
        Ok(Position {
            inner: self.open(py)?.position(),
        })
    }

    /// The checkpoint after the last delivered batch, or at `position` (one of this stream's,
    /// also once the stream is closed).
    #[pyo3(signature = (position=None))]
    fn checkpoint(&self, py: Python<'_>, position: Option<&Position>) -> PyResult<Py<Checkpoint>> {
        // A position names its point itself, so its checkpoint is there after close too (a
        // loop that ends, closes the stream, then saves the last consumed batch's position).
        let inner = match position {
            None => self.open(py)?.checkpoint().map_err(|e| to_py(py, &e))?,
            Some(position) => self
                .inner
                .checkpoint_at(&position.inner)
                .map_err(|e| to_py(py, &e))?,
        };
        Checkpoint::wrap(py, inner)
    }

    /// The active stage.
    #[getter]
    fn stage(&self, py: Python<'_>) -> PyResult<usize> {
        Ok(self.open(py)?.stage())
    }

    /// Stops the stream's threads, cancelling reads in flight. Idempotent; any thread may call it.
    fn close(&self, py: Python<'_>) -> PyResult<()> {
        let stream = &self.inner;
        blocking(py, |_| {
            stream.close();
            Ok(())
        })
    }

    /// True once closed.
    #[getter]
    fn closed(&self) -> bool {
        self.inner.is_closed()
    }

    /// The resolved config document (JSON).
    fn resolved_json(&self, py: Python<'_>) -> PyResult<String> {
        Ok(self.open(py)?.resolved().to_json())
    }

    /// Counters and timings: `batches_yielded`, `rows_yielded`, `dropped_rows`,
    /// `batches_delivered`, `batches_waited`, `consumer_wait_seconds`, `consumer_seconds`,
    /// `prefetch_depth`, `prefetch_capacity`, `sources` (a list of dicts), `open` (a dict) and
    /// `decode` (encoding name to `(rows, seconds)`). The engine counts with atomics; this
    /// reads them without waiting for any batch, also once the stream is closed (the counters it
    /// ended with).
    fn stats<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let stats = self.inner.stats();
        let d = PyDict::new(py);
        d.set_item("batches_yielded", stats.batches_yielded)?;
        d.set_item("rows_yielded", stats.rows_yielded)?;
        d.set_item("dropped_rows", stats.dropped_rows)?;
        d.set_item("skipped_batches", stats.skipped_batches)?;
        d.set_item("skipped_rows", stats.skipped_rows)?;
        d.set_item("batches_delivered", stats.batches_delivered)?;
        d.set_item("batches_waited", stats.batches_waited)?;
        d.set_item("consumer_wait_seconds", stats.consumer_wait.as_secs_f64())?;
        d.set_item("consumer_seconds", stats.consumer_time.as_secs_f64())?;
        d.set_item("prefetch_depth", stats.prefetch_depth)?;
        d.set_item("prefetch_capacity", stats.prefetch_capacity)?;
        let sources = PyList::empty(py);
        for source in &stats.sources {
            let s = meter_dict(py, &source.read)?;
            s.set_item("stage", source.stage)?;
            s.set_item("source", source.source)?;
            s.set_item("rows_delivered", source.rows_delivered)?;
            s.set_item("tokens_delivered", source.tokens_delivered)?;
            s.set_item("dropped_rows", source.dropped_rows)?;
            s.set_item("weight_share", source.weight_share)?;
            sources.append(s)?;
        }
        d.set_item("sources", sources)?;
        d.set_item("open", meter_dict(py, &stats.open)?)?;
        let decode = PyDict::new(py);
        for reading in &stats.decode {
            decode.set_item(
                reading.encoding.name(),
                (reading.rows, reading.time.as_secs_f64()),
            )?;
        }
        d.set_item("decode", decode)?;
        Ok(d)
    }

    /// Per stage, what a token stage's windows hold (`None` for a stage of records).
    fn token_stats<'py>(&self, py: Python<'py>) -> PyResult<Vec<Option<Bound<'py, PyDict>>>> {
        let stats = self.open(py)?.token_stats();
        stats
            .into_iter()
            .map(|stage| {
                stage
                    .map(|s| {
                        let d = PyDict::new(py);
                        d.set_item("tokens", s.tokens)?;
                        d.set_item("windows", s.windows)?;
                        d.set_item("row_tokens", s.row_tokens)?;
                        d.set_item("most_segments", s.most_segments)?;
                        d.set_item("padding_fraction", s.padding_fraction())?;
                        Ok(d)
                    })
                    .transpose()
            })
            .collect()
    }

    /// The working-set bound computed at open, by term, in bytes.
    fn memory_bound<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let bound = *self.open(py)?.memory_bound();
        let d = PyDict::new(py);
        d.set_item("batches", bound.batches)?;
        d.set_item("decode_units", bound.decode_units)?;
        d.set_item("readers", bound.readers)?;
        d.set_item("decode_scratch", bound.decode_scratch)?;
        d.set_item("token_plans", bound.token_plans)?;
        d.set_item("total", bound.total())?;
        d.set_item("limit", bound.limit)?;
        Ok(d)
    }
}

/// One meter's counters: `bytes_read`, `read_wait_seconds`, `rows_read`, `shards_opened` and
/// `retries` (cause name to count).
fn meter_dict<'py>(py: Python<'py>, reading: &MeterReading) -> PyResult<Bound<'py, PyDict>> {
    let d = PyDict::new(py);
    d.set_item("bytes_read", reading.bytes_read)?;
    d.set_item("read_wait_seconds", reading.read_wait.as_secs_f64())?;
    d.set_item("rows_read", reading.rows_read)?;
    d.set_item("shards_opened", reading.shards_opened)?;
    let retries = PyDict::new(py);
    for (cause, count) in RetryCause::ALL.iter().zip(reading.retries) {
        retries.set_item(cause.name(), count)?;
    }
    d.set_item("retries", retries)?;
    Ok(d)
}
