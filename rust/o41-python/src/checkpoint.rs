//! `Checkpoint`: a rank's stream position, as the engine's checkpoint document.

use o41_engine::checkpoint::Checkpoint as EngineCheckpoint;
use pyo3::prelude::*;
use pyo3::types::PyTuple;

use crate::errors::to_py;

/// A rank's position in a batch stream: the resolved config (no credentials), the cursor and
/// the counters `stage`, `batches_yielded`, `rows_yielded` and per-source `epochs`.
///
/// Write `to_json()` next to the model checkpoint; `Checkpoint.from_json` reads it back and
/// `resume_batch_stream` continues exactly after the last consumed batch.
#[pyclass(module = "o41_training_data", frozen, eq)]
#[derive(PartialEq)]
pub struct Checkpoint {
    pub inner: EngineCheckpoint,
}

#[pymethods]
impl Checkpoint {
    /// Parses a checkpoint document; raises `CheckpointError` when it is corrupt, of another
    /// version, or altered.
    #[staticmethod]
    fn from_json(py: Python<'_>, text: &str) -> PyResult<Self> {
        EngineCheckpoint::from_json(text)
            .map(|inner| Checkpoint { inner })
            .map_err(|e| to_py(py, &e))
    }

    /// The checkpoint at `position_json` (from `Stream.position_at`) of the stream whose resolved
    /// config is `resolved_json`.
    #[staticmethod]
    fn from_position(py: Python<'_>, resolved_json: &str, position_json: &str) -> PyResult<Self> {
        let bad = |e: serde_json::Error| {
            to_py(
                py,
                &o41_engine::Error::Checkpoint {
                    message: format!("malformed position: {e}"),
                },
            )
        };
        let resolved = serde_json::from_str(resolved_json).map_err(bad)?;
        let position = serde_json::from_str(position_json).map_err(bad)?;
        EngineCheckpoint::from_position(resolved, position)
            .map(|inner| Checkpoint { inner })
            .map_err(|e| to_py(py, &e))
    }

    /// The position part (JSON), as `Stream.position_at` returns it.
    fn position_json(&self) -> String {
        serde_json::to_string(&self.inner.position()).expect("a position always serialises")
    }

    /// The checkpoint as a JSON document.
    fn to_json(&self) -> String {
        self.inner.to_json()
    }

    /// The same position for another rank and world size (elastic resume).
    fn for_world(&self, py: Python<'_>, rank: usize, world_size: usize) -> PyResult<Self> {
        self.inner
            .for_world(rank, world_size)
            .map(|inner| Checkpoint { inner })
            .map_err(|e| to_py(py, &e))
    }

    /// Document version.
    #[getter]
    fn version(&self) -> u32 {
        self.inner.version
    }

    /// Fingerprint of the resolved sources, fields and seed.
    #[getter]
    fn fingerprint(&self) -> &str {
        &self.inner.fingerprint
    }

    /// Active stage.
    #[getter]
    fn stage(&self) -> usize {
        self.inner.stage
    }

    /// Batches this rank has received over the whole run.
    #[getter]
    fn batches_yielded(&self) -> u64 {
        self.inner.batches_yielded
    }

    /// Rows this rank has received over the whole run.
    #[getter]
    fn rows_yielded(&self) -> u64 {
        self.inner.rows_yielded
    }

    /// Completed passes over each source of the active stage.
    #[getter]
    fn epochs(&self) -> Vec<u64> {
        self.inner.epochs.clone()
    }

    /// The rank this checkpoint belongs to.
    #[getter]
    fn rank(&self) -> usize {
        self.inner.resolved.rank
    }

    /// The world size it was taken in.
    #[getter]
    fn world_size(&self) -> usize {
        self.inner.resolved.world_size
    }

    /// First global batch of the next round: every earlier one was consumed.
    #[getter]
    fn next_batch(&self) -> u64 {
        self.inner.cursor.next_batch
    }

    /// The resolved config document (JSON) the checkpoint pins.
    fn resolved_json(&self) -> String {
        self.inner.resolved.to_json()
    }

    fn __reduce__<'py>(slf: &Bound<'py, Self>) -> PyResult<Bound<'py, PyTuple>> {
        let py = slf.py();
        let from_json = py.get_type::<Checkpoint>().getattr("from_json")?;
        let args = PyTuple::new(py, [slf.get().inner.to_json()])?;
        PyTuple::new(py, [from_json.into_any(), args.into_any()])
    }

    fn __repr__(&self) -> String {
        format!(
            "Checkpoint(rank={}, world_size={}, stage={}, batches_yielded={}, rows_yielded={}, epochs={:?})",
            self.inner.resolved.rank,
            self.inner.resolved.world_size,
            self.inner.stage,
            self.inner.batches_yielded,
            self.inner.rows_yielded,
            self.inner.epochs
        )
    }
}
