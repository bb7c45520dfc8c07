//! `Position`, `Segment` and `Drain`: a rank's place in a stream, as small typed values that
//! every batch carries and that cross process boundaries as a few hundred bytes of JSON.

use o41_engine::checkpoint::Position as EnginePosition;
use o41_engine::order::{Drain as EngineDrain, Segment as EngineSegment};
use pyo3::prelude::*;
use pyo3::types::PyTuple;

use crate::errors::to_py;

/// A rank's place in a batch stream after some batch: everything a checkpoint holds except the
/// resolved config.
///
/// Every `Batch` carries the position after it (`batch.position`). Combine it with the stream's
/// resolved config through `Checkpoint.from_position` or `BatchStream.checkpoint(position)`.
/// It pickles as its JSON, so adapters can send it from worker processes with each batch.
#[pyclass(module = "o41_training_data", frozen, eq, subclass)]
#[derive(PartialEq)]
pub struct Position {
    pub inner: EnginePosition,
}

#[pymethods]
impl Position {
    /// Parses a position document (from `to_json`); raises `CheckpointError` when malformed.
    #[staticmethod]
    fn from_json(py: Python<'_>, text: &str) -> PyResult<Self> {
        EnginePosition::from_json(text)
            .map(|inner| Position { inner })
            .map_err(|e| to_py(py, &e))
    }

    /// The position as a small JSON document.
    fn to_json(&self) -> String {
        self.inner.to_json()
    }

    /// Fingerprint of the stream the position belongs to.
    #[getter]
    fn fingerprint(&self) -> &str {
        &self.inner.fingerprint
    }

    /// The rank the position belongs to.
    #[getter]
    fn rank(&self) -> usize {
        self.inner.rank
    }

    /// The number of ranks sharing the global batch sequence.
    #[getter]
    fn world_size(&self) -> usize {
        self.inner.world_size
    }

    /// The active stage.
    #[getter]
    fn stage(&self) -> usize {
        self.inner.stage
    }

    /// The active segment: the stretch of the stream since the last stage switch.
    #[getter]
    fn segment(&self) -> Segment {
        Segment {
            inner: self.inner.cursor.segment,
        }
    }

    /// First global batch of the next round: every earlier global batch was consumed by its
    /// rank. This rank's next batch is `next_batch + rank`.
    #[getter]
    fn next_batch(&self) -> u64 {
        self.inner.cursor.next_batch
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

    /// Curriculum switches requested and not reached yet, as `(stage, at)` pairs by increasing
    /// `at` (a global batch): a stream resumed at this position applies them.
    #[getter]
    fn switches(&self) -> Vec<(usize, u64)> {
        self.inner
            .switches
            .iter()
            .map(|s| (s.stage, s.at))
            .collect()
    }

    /// This position with a switch to `stage` at global batch `at` requested (the engine's rule,
    /// docs/checkpoint.md): kept when the position has not reached `at` and another stage is in
    /// effect there, replacing requests at or after `at`; otherwise the position unchanged.
    fn with_switch(&self, stage: usize, at: u64) -> Position {
        Position {
            inner: self.inner.with_switch(stage, at),
        }
    }

    fn __reduce__<'py>(slf: &Bound<'py, Self>) -> PyResult<Bound<'py, PyTuple>> {
        let py = slf.py();
        let from_json = py.get_type::<Position>().getattr("from_json")?;
        let args = PyTuple::new(py, [slf.get().inner.to_json()])?;
        PyTuple::new(py, [from_json.into_any(), args.into_any()])
    }

    fn __repr__(&self) -> String {
        let p = &self.inner;
        format!(
            "Position(rank={}, world_size={}, stage={}, next_batch={}, batches_yielded={}, rows_yielded={})",
            p.rank, p.world_size, p.stage, p.cursor.next_batch, p.batches_yielded, p.rows_yielded
        )
    }
}

/// The stretch of a stream between two stage switches: global batches from `start_batch` on
/// are cut from `drain` (rows the previous stage still had in its shuffle window), then from
/// `stage`'s own rows.
#[pyclass(module = "o41_training_data", frozen, eq)]
#[derive(PartialEq)]
pub struct Segment {
    pub inner: EngineSegment,
}

#[pymethods]
impl Segment {
    /// The active stage.
    #[getter]
    fn stage(&self) -> usize {
        self.inner.stage
    }

    /// First global batch of the segment.
    #[getter]
    fn start_batch(&self) -> u64 {
        self.inner.start_batch
    }

    /// Rows of the previous stage delivered first, or None.
    #[getter]
    fn drain(&self) -> Option<Drain> {
        self.inner.drain.map(|inner| Drain { inner })
    }

    fn __repr__(&self) -> String {
        format!(
            "Segment(stage={}, start_batch={}, drain={})",
            self.inner.stage,
            self.inner.start_batch,
            self.inner
                .drain
                .map_or_else(|| "None".to_owned(), |d| Drain { inner: d }.__repr__())
        )
    }
}

/// Output positions `[start, end)` of stage `stage` that were still in its shuffle window when
/// the stream switched away from it; they fill the first batches after the switch.
#[pyclass(module = "o41_training_data", frozen, eq)]
#[derive(PartialEq)]
pub struct Drain {
    pub inner: EngineDrain,
}

#[pymethods]
impl Drain {
    /// The stage the rows belong to.
    #[getter]
    fn stage(&self) -> usize {
        self.inner.stage
    }

    /// First output position still to deliver.
    #[getter]
    fn start(&self) -> u64 {
        self.inner.from
    }

    /// End of the drained range.
    #[getter]
    fn end(&self) -> u64 {
        self.inner.to
    }

    fn __repr__(&self) -> String {
        format!(
            "Drain(stage={}, start={}, end={})",
            self.inner.stage, self.inner.from, self.inner.to
        )
    }
}
