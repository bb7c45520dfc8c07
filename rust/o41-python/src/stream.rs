//! `_core.Stream`: the engine's batch stream, driven from Python one batch at a time.

use std::sync::Mutex;
use std::time::Duration;

use arrow_pyarrow::ToPyArrow;
use o41_engine::order::{Drain, Segment};
use o41_engine::resolve::resolve;
use o41_engine::{BatchStream, Next, StreamConfig};
use pyo3::exceptions::PyRuntimeError;
use pyo3::prelude::*;
use pyo3::types::PyDict;

use crate::checkpoint::Checkpoint;
use crate::errors::to_py;
use crate::storage::{engine, Storage};

/// How long one GIL-free wait lasts before Python gets a chance to see Ctrl-C.
const SIGNAL_POLL: Duration = Duration::from_millis(100);

/// Parses and resolves a config with the GIL released.
fn parse(py: Python<'_>, config_json: &str) -> PyResult<StreamConfig> {
    let json = config_json.to_owned();
    py.detach(move || StreamConfig::from_json(&json))
        .map_err(|e| to_py(py, &e))
}

/// Resolves a stream config (JSON) and returns the resolved document (JSON).
#[pyfunction]
#[pyo3(signature = (config_json, storage=None))]
pub fn resolve_config(
    py: Python<'_>,
    config_json: &str,
    storage: Option<&Storage>,
) -> PyResult<String> {
    let config = parse(py, config_json)?;
    let storage = engine(storage);
    py.detach(move || resolve(&config, &storage).map(|r| r.config.to_json()))
        .map_err(|e| to_py(py, &e))
}

/// Reads and checks a data manifest; returns it as JSON.
#[pyfunction]
#[pyo3(signature = (uri, storage=None))]
pub fn load_manifest(py: Python<'_>, uri: &str, storage: Option<&Storage>) -> PyResult<String> {
    let storage = engine(storage);
    py.detach(|| o41_engine::manifest::Manifest::load(uri, &storage))
        .map(|m| m.to_json())
        .map_err(|e| to_py(py, &e))
}

/// Where the shard `location` of the manifest at `manifest_uri` is (`docs/manifest.md`).
#[pyfunction]
pub fn shard_location(manifest_uri: &str, location: &str) -> String {
    o41_engine::manifest::shard_path(manifest_uri, location)
}

/// Checks a data manifest document (JSON) against the format's rules; `uri` names it in errors.
#[pyfunction]
pub fn check_manifest(py: Python<'_>, text: &str, uri: &str) -> PyResult<String> {
    o41_engine::manifest::Manifest::from_json(text, uri)
        .map(|m| m.to_json())
        .map_err(|e| to_py(py, &e))
}

/// Physical memory of the host in bytes, or None where it cannot be read.
#[pyfunction]
pub fn host_memory_bytes() -> Option<u64> {
    o41_engine::memory::host_memory_bytes()
}

/// A segment as a flat tuple: (stage, `start_batch`, `drain_stage`, `drain_from`, `drain_to`), the
/// drain fields -1 when there is none.
type SegmentTuple = (usize, u64, i64, i64, i64);

fn segment_tuple(s: &Segment) -> SegmentTuple {
    match s.drain {
        Some(d) => (
            s.stage,
            s.start_batch,
            d.stage as i64,
            d.from as i64,
            d.to as i64,
        ),
        None => (s.stage, s.start_batch, -1, -1, -1),
    }
}

fn tuple_segment(t: SegmentTuple) -> Segment {
    Segment {
        stage: t.0,
        start_batch: t.1,
        drain: (t.2 >= 0).then_some(Drain {
            stage: t.2 as usize,
            from: t.3 as u64,
            to: t.4 as u64,
        }),
    }
}

/// One batch as handed to Python: columns, stage, global index, local index and segment.
type BatchTuple<'py> = (Bound<'py, PyAny>, usize, u64, u64, SegmentTuple);

/// An open batch stream. Use `o41_training_data.open_batch_stream`, not this class.
#[pyclass(module = "o41_training_data._core")]
pub struct Stream {
    inner: Mutex<Option<BatchStream>>,
}

impl Stream {
    fn with<T>(&self, f: impl FnOnce(&mut BatchStream) -> T) -> PyResult<T> {
        let mut guard = self
            .inner
            .lock()
            .map_err(|_| PyRuntimeError::new_err("the stream's lock is poisoned"))?;
        match guard.as_mut() {
            Some(stream) => Ok(f(stream)),
            None => Python::attach(|py| Err(to_py(py, &o41_engine::Error::Closed))),
        }
    }
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
        let config = parse(py, config_json)?;
        let storage = engine(storage);
        let stream = py
            .detach(move || BatchStream::open_part(&config, &storage, offset, stride))
            .map_err(|e| to_py(py, &e))?;
        Ok(Stream {
            inner: Mutex::new(Some(stream)),
        })
    }

    /// Re-opens the stream a checkpoint describes. `offset`/`stride` select a share of the
    /// rank's local batches (a `DataLoader` worker's).
    #[staticmethod]
    #[pyo3(signature = (checkpoint, offset=0, stride=1, storage=None))]
    fn resume(
        py: Python<'_>,
        checkpoint: &Checkpoint,
        offset: u64,
        stride: u64,
        storage: Option<&Storage>,
    ) -> PyResult<Self> {
        let inner = checkpoint.inner.clone();
        let storage = engine(storage);
        let stream = py
            .detach(move || BatchStream::resume_part(&inner, &storage, offset, stride))
            .map_err(|e| to_py(py, &e))?;
        Ok(Stream {
            inner: Mutex::new(Some(stream)),
        })
    }

    /// The next batch as `(record_batch, stage, batch_index, local_index, segment)`, or None.
    fn next_batch<'py>(&self, py: Python<'py>) -> PyResult<Option<BatchTuple<'py>>> {
        loop {
            let next = self.with(|stream| py.detach(|| stream.next_timeout(SIGNAL_POLL)))?;
            match next.map_err(|e| to_py(py, &e))? {
                Next::Batch(batch) => {
                    let columns = batch.columns.to_pyarrow(py)?;
                    return Ok(Some((
                        columns,
                        batch.stage,
                        batch.batch_index,
                        batch.local_index,
                        segment_tuple(&batch.segment),
                    )));
                }
                Next::End => return Ok(None),
                Next::Pending => py.check_signals()?,
            }
        }
    }

    /// Switches stage at the next batch boundary (after the batches delivered so far).
    fn advance(&self, py: Python<'_>, stage: usize) -> PyResult<()> {
        self.with(|s| py.detach(|| s.advance(stage)))?
            .map_err(|e| to_py(py, &e))
    }

    /// Switches stage at rank-level local batch `at` (for streams that yield a share).
    fn advance_at(&self, py: Python<'_>, stage: usize, at: u64) -> PyResult<()> {
        self.with(|s| py.detach(|| s.advance_at(stage, at)))?
            .map_err(|e| to_py(py, &e))
    }

    /// The checkpoint after the last delivered batch.
    fn checkpoint(&self) -> PyResult<Checkpoint> {
        self.with(|s| Checkpoint {
            inner: s.checkpoint(),
        })
    }

    /// The checkpoint once the rank's first `consumed` local batches are consumed, with
    /// `segment` active.
    fn checkpoint_at(&self, consumed: u64, segment: SegmentTuple) -> PyResult<Checkpoint> {
        self.with(|s| Checkpoint {
            inner: s.checkpoint_at(consumed, Some(tuple_segment(segment))),
        })
    }

    /// The position (JSON, without the resolved config) once the rank's first `consumed` local
    /// batches are consumed, with `segment` active.
    fn position_at(&self, consumed: u64, segment: SegmentTuple) -> PyResult<String> {
        self.with(|s| {
            let position = s.position_at(consumed, Some(tuple_segment(segment)));
            serde_json::to_string(&position).expect("a position always serialises")
        })
    }

    /// The active stage.
    #[getter]
    fn stage(&self) -> PyResult<usize> {
        self.with(|s| s.stage())
    }

    /// Stops the stream's threads, waiting for reads in flight. Idempotent.
    fn close(&self, py: Python<'_>) -> PyResult<()> {
        let taken = self
            .inner
            .lock()
            .map_err(|_| PyRuntimeError::new_err("the stream's lock is poisoned"))?
            .take();
        if let Some(mut stream) = taken {
            py.detach(move || stream.close());
        }
        Ok(())
    }

    /// True once closed.
    #[getter]
    fn closed(&self) -> PyResult<bool> {
        Ok(self
            .inner
            .lock()
            .map_err(|_| PyRuntimeError::new_err("the stream's lock is poisoned"))?
            .is_none())
    }

    /// The resolved config document (JSON).
    fn resolved_json(&self) -> PyResult<String> {
        self.with(|s| s.resolved().to_json())
    }

    /// Delivery counters: `batches_yielded`, `rows_yielded`, `dropped_rows`.
    fn stats<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let stats = self.with(|s| s.stats())?;
        let d = PyDict::new(py);
        d.set_item("batches_yielded", stats.batches_yielded)?;
        d.set_item("rows_yielded", stats.rows_yielded)?;
        d.set_item("dropped_rows", stats.dropped_rows)?;
        Ok(d)
    }

    /// The working-set bound computed at open, by term, in bytes.
    fn memory_bound<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let bound = self.with(|s| *s.memory_bound())?;
        let d = PyDict::new(py);
        d.set_item("batches", bound.batches)?;
        d.set_item("decode_units", bound.decode_units)?;
        d.set_item("readers", bound.readers)?;
        d.set_item("decode_scratch", bound.decode_scratch)?;
        d.set_item("total", bound.total())?;
        d.set_item("limit", bound.limit)?;
        Ok(d)
    }
}
