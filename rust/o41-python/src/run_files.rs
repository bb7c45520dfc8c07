//! `RunFiles`: a run's per-rank checkpoint files in one directory, under the engine's rules.

use o41_engine::checkpoint::{
    self, Naming, Position as EnginePosition, RunFiles as EngineRunFiles,
};
use o41_engine::Error;
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyString};

use crate::checkpoint::Checkpoint;
use crate::errors::to_py;
use crate::position::Position;

fn naming_of(name: &str) -> PyResult<Naming> {
    match name {
        "stream" => Ok(Naming::Stream),
        "process" => Ok(Naming::Process),
        other => Err(pyo3::exceptions::PyValueError::new_err(format!(
            "naming: expected 'stream' or 'process', got {other:?}"
        ))),
    }
}

/// The per-rank checkpoint files among a directory's entries: which rank and world each holds,
/// whether they are one whole save, which a new save leaves stale, and the checkpoint a rank of
/// any world resumes from. Pure over names and texts, so any file system drives it.
#[pyclass(module = "o41_training_data", frozen)]
pub struct RunFiles {
    pub inner: EngineRunFiles,
}

#[pymethods]
impl RunFiles {
    #[new]
    fn new(py: Python<'_>, names: Vec<String>, place: &str) -> PyResult<Self> {
        let inner = EngineRunFiles::among(names, place).map_err(|e| to_py(py, &e))?;
        Ok(Self { inner })
    }

    /// `(index, count, name)` of every per-rank file.
    fn files(&self) -> Vec<(usize, usize, String)> {
        self.inner
            .names()
            .map(|(index, count, name)| (index, count, name.to_owned()))
            .collect()
    }

    /// The names a save of `world_size` ranks of stream `fingerprint` leaves stale (None: a
    /// save that wrote no rank file, which leaves every one stale).
    #[pyo3(signature = (world_size, fingerprint))]
    fn stale(&self, world_size: Option<usize>, fingerprint: Option<&str>) -> Vec<String> {
        self.inner.stale(world_size, fingerprint)
    }

    /// The checkpoint rank `rank` of `world_size` resumes from; `read(name)` returns a file's
    /// text (or bytes). `written_by`: the world an index beside the files says wrote them. An
    /// exception `read` raises propagates as it is.
    #[pyo3(signature = (read, rank, world_size, own = None, written_by = None))]
    fn restore(
        &self,
        py: Python<'_>,
        read: &Bound<'_, PyAny>,
        rank: usize,
        world_size: usize,
        own: Option<(usize, usize)>,
        written_by: Option<usize>,
    ) -> PyResult<Py<Checkpoint>> {
        let restored = with_reader(py, read, |reader| {
            self.inner
                .restore(rank, world_size, own, written_by, reader)
        })?;
        Checkpoint::wrap(py, restored)
    }
}

/// Runs `restore` with a reader calling `read(name)` for a file's text (or bytes); an exception
/// `read` raises propagates as it is, whatever the engine made of the failed read.
pub fn with_reader<T>(
    py: Python<'_>,
    read: &Bound<'_, PyAny>,
    restore: impl FnOnce(&mut dyn FnMut(&str) -> o41_engine::Result<String>) -> o41_engine::Result<T>,
) -> PyResult<T> {
    let mut failure: Option<PyErr> = None;
    let mut reader = |name: &str| -> o41_engine::Result<String> {
        let text = read.call1((name,)).and_then(|value| {
            if let Ok(bytes) = value.cast::<PyBytes>() {
                return String::from_utf8(bytes.as_bytes().to_vec())
                    .map_err(|_| to_py(py, &refused(format!("{name} is not UTF-8 text"))));
            }
            Ok(value.cast::<PyString>()?.to_str()?.to_owned())
        });
        text.map_err(|error| {
            failure = Some(error);
            refused(format!("{name} could not be read"))
        })
    };
    let restored = restore(&mut reader);
    if let Some(error) = failure {
        return Err(error);
    }
    restored.map_err(|e| to_py(py, &e))
}

fn refused(message: String) -> Error {
    Error::Checkpoint { message }
}

/// The name of `index` of `count`'s file under `naming` (`"stream"` or `"process"`).
#[pyfunction]
#[pyo3(signature = (index, count, naming = "stream"))]
pub fn rank_file_name(index: usize, count: usize, naming: &str) -> PyResult<String> {
    Ok(naming_of(naming)?.file_name(index, count))
}

/// `(index, count)` of any per-rank file's name, or None.
#[pyfunction]
pub fn parse_rank_file_name(name: &str) -> Option<(usize, usize)> {
    Naming::of(name).map(|(_, index, count)| (index, count))
}

/// Positions named for errors, owned: `None` is a rank that has not started.
type Stops<'py> = Vec<(String, Option<PyRef<'py, Position>>)>;

fn owned(stops: Stops<'_>) -> Vec<(String, Option<EnginePosition>)> {
    stops
        .into_iter()
        .map(|(name, stop)| (name, stop.map(|p| p.inner.clone())))
        .collect()
}

fn named(stops: &[(String, Option<EnginePosition>)]) -> Vec<(&str, Option<&EnginePosition>)> {
    stops
        .iter()
        .map(|(name, stop)| (name.as_str(), stop.as_ref()))
        .collect()
}

/// The engine's rule for moving `stops` (named positions; None: not started) onto
/// `world_size` ranks: one stream, one place.
#[pyfunction]
pub fn check_same_place(py: Python<'_>, stops: Stops<'_>, world_size: usize) -> PyResult<()> {
    let stops = owned(stops);
    checkpoint::check_same_place(&named(&stops), world_size).map_err(|e| to_py(py, &e))
}

/// The engine's rule that `stops` (named positions; None: not started) are of one stream.
#[pyfunction]
pub fn check_same_stream(py: Python<'_>, stops: Stops<'_>) -> PyResult<()> {
    let stops = owned(stops);
    checkpoint::check_same_stream(&named(&stops)).map_err(|e| to_py(py, &e))
}
