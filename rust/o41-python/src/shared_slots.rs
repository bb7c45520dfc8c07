//! Batch slots in shared memory (the engine's `shared_slots`): a worker process copies a batch
//! into a slot, another process views it from a small handle.

use arrow_array::{Array, RecordBatch};
use arrow_pyarrow::{FromPyArrow, ToPyArrow};
use o41_engine::shared_slots::{self, Handle, Slot, SlotRing as EngineSlotRing};
use pyo3::exceptions::PyOSError;
use pyo3::prelude::*;

/// A handle as it crosses a queue: `(path, slot, generation, start, len)`.
type HandleTuple = (String, usize, u64, usize, usize);

/// The system's errors keep their errno; the slots' own refusals are messages alone.
fn os_error(error: &std::io::Error) -> PyErr {
    match error.raw_os_error() {
        Some(errno) => PyOSError::new_err((errno, error.to_string())),
        None => PyOSError::new_err(error.to_string()),
    }
}

/// A worker process's shared-memory segments.
#[pyclass(module = "o41_training_data", frozen)]
pub struct SlotRing {
    inner: EngineSlotRing,
}

#[pymethods]
impl SlotRing {
    #[new]
    fn new() -> Self {
        Self {
            inner: EngineSlotRing::new(),
        }
    }

    /// The process that created the ring.
    #[getter]
    fn pid(&self) -> u32 {
        self.inner.pid()
    }

    /// Copies the columns of `columns` (a `pyarrow.RecordBatch` of fixed-shape columns) into a
    /// free slot, leased while the returned slot or a view of it lives.
    fn put(&self, py: Python<'_>, columns: &Bound<'_, PyAny>) -> PyResult<BatchSlot> {
        let batch = RecordBatch::from_pyarrow_bound(columns)?;
        let slot = py
            .detach(|| self.inner.put_batch(&batch))
            .map_err(|e| os_error(&e))?;
        Ok(BatchSlot { inner: slot })
    }

    /// Unlinks the segments no receiver mapped (run as the worker exits).
    fn unlink_unreceived(&self) {
        self.inner.unlink_unreceived();
    }
}

/// A filled slot in a worker.
#[pyclass(module = "o41_training_data", frozen)]
pub struct BatchSlot {
    inner: Slot,
}

#[pymethods]
impl BatchSlot {
    /// The slot's number in its segment.
    #[getter]
    fn index(&self) -> usize {
        self.inner.index()
    }

    /// Each column's offset in the slot.
    #[getter]
    fn offsets(&self) -> Vec<usize> {
        self.inner.offsets().to_vec()
    }

    /// The slot's bytes as a `pyarrow` uint8 array; the lease lives while it is viewed.
    fn view(&self, py: Python<'_>) -> PyResult<Py<PyAny>> {
        Ok(self.inner.view().to_data().to_pyarrow(py)?.unbind())
    }

    /// The handle another process receives it by; the slot stays held until that process's
    /// view of it is gone. Call it only when the handle is sent.
    fn handle(&self) -> HandleTuple {
        let Handle {
            path,
            slot,
            generation,
            start,
            len,
        } = self.inner.handle();
        (path, slot, generation, start, len)
    }
}

/// The slot a handle names, viewed in this process as a `pyarrow` uint8 array (no copy).
#[pyfunction]
pub fn receive_slot(py: Python<'_>, handle: HandleTuple) -> PyResult<Py<PyAny>> {
    let (path, slot, generation, start, len) = handle;
    let handle = Handle {
        path,
        slot,
        generation,
        start,
        len,
    };
    let view = shared_slots::receive(&handle).map_err(|e| os_error(&e))?;
    Ok(view.to_data().to_pyarrow(py)?.unbind())
}

/// The received segment whose memory holds `address`, if any.
#[pyfunction]
pub fn shared_segment_of(address: usize) -> Option<String> {
    shared_slots::segment_of(address)
}

/// Where segments are created, in order of preference.
#[pyfunction]
pub fn shared_segment_directories() -> Vec<String> {
    shared_slots::segment_directories()
        .into_iter()
        .map(|p| p.to_string_lossy().into_owned())
        .collect()
}
