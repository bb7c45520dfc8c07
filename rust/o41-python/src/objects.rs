//! Objects opened for reading from Python: `_core.StorageObject`, byte ranges of one object
//! pinned to the version seen at open.

use o41_engine::storage::Object;
use pyo3::prelude::*;
use pyo3::types::PyBytes;

use crate::blocking::blocking_with;

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
        // The object's reads obey the flag it was opened with: Ctrl-C stops this one.
        let data = blocking_with(py, self.inner.cancel(), |_| {
            self.inner.read_range(start..end)
        })?;
        Ok(PyBytes::new(py, &data))
    }
}
