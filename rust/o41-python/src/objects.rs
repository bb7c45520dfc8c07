//! Objects opened for reading from Python: `_core.StorageObject` (byte ranges of one object,
//! pinned to the version seen at open) and `_core.MsgpackRecords` (a shard's records as JSON).

use std::sync::Mutex;

use o41_engine::formats::MsgpackRecords as EngineRecords;
use o41_engine::storage::Object;
use pyo3::exceptions::PyRuntimeError;
use pyo3::prelude::*;
use pyo3::types::PyBytes;

use crate::blocking::blocking;
use crate::errors::to_py;
use crate::storage::{engine, Storage};

/// One object opened by `Storage.open`: its size, and byte ranges of the version seen then.
#[pyclass(module = "o41_training_data._core", frozen)]
pub struct StorageObject {
    pub inner: Object,
}

#[pymethods]
impl StorageObject {
    /// Location the object was opened from.
    #[getter]
    fn uri(&self) -> &str {
        self.inner.uri()
    }

    /// Size in bytes.
    #[getter]
    fn size(&self) -> u64 {
        self.inner.size()
    }

    /// Bytes `start..end`.
    fn read_range<'py>(
        &self,
        py: Python<'py>,
        start: u64,
        end: u64,
    ) -> PyResult<Bound<'py, PyBytes>> {
        let data = blocking(py, |_| self.inner.read_range(start..end))?;
        Ok(PyBytes::new(py, &data))
    }
}

/// The records of a framed `MessagePack` shard, in order, as JSON texts, in one forward read.
#[pyclass(module = "o41_training_data._core")]
pub struct MsgpackRecords {
    inner: Mutex<EngineRecords>,
}

#[pymethods]
impl MsgpackRecords {
    #[new]
    #[pyo3(signature = (path, storage=None))]
    fn new(py: Python<'_>, path: &str, storage: Option<&Storage>) -> PyResult<Self> {
        let storage = engine(storage);
        let inner = blocking(py, |cancel| {
            EngineRecords::open(&storage.with_cancel(cancel.clone()), path)
        })?;
        Ok(MsgpackRecords {
            inner: Mutex::new(inner),
        })
    }

    /// The next records, up to `count`; fewer only at the end of the shard.
    fn next_chunk(&self, py: Python<'_>, count: usize) -> PyResult<Vec<String>> {
        let next = py.detach(|| {
            self.inner
                .lock()
                .map(|mut inner| inner.next_json(count))
                .map_err(|_| PyRuntimeError::new_err("the reader's lock is poisoned"))
        })?;
        next.map_err(|e| to_py(py, &e))
    }
}
