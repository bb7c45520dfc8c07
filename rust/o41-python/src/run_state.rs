//! `RunState` and `RunIndex`: a run's positions in one document, and the index beside a
//! directory of per-rank files, under the engine's rules.

use o41_engine::checkpoint::{
    self, RunFiles as EngineRunFiles, RunIndex as EngineRunIndex, RunState as EngineRunState,
};
use o41_engine::Error;
use pyo3::prelude::*;

use crate::checkpoint::{resolved_of, Checkpoint};
use crate::errors::to_py;
use crate::position::Position;
use crate::run_files::with_reader;

fn wrap_optional(
    py: Python<'_>,
    checkpoint: Option<checkpoint::Checkpoint>,
) -> PyResult<Option<Py<Checkpoint>>> {
    checkpoint.map(|c| Checkpoint::wrap(py, c)).transpose()
}

/// A JSON document of `value` (a dict a framework's checkpoint held), or a refusal naming
/// `source` when it holds something JSON cannot.
fn json_text(py: Python<'_>, value: &Bound<'_, PyAny>, source: &str) -> PyResult<String> {
    let dumped = py.import("json")?.call_method1("dumps", (value,));
    match dumped {
        Ok(text) => text.extract(),
        Err(error) => {
            let message = format!("{source} is not JSON data: {error}");
            Err(to_py(py, &Error::Checkpoint { message }))
        }
    }
}

/// Every rank's position, the world that took them and the stream's resolved document: a
/// run's place in one document, for a framework that saves one checkpoint for every rank.
#[pyclass(module = "o41_training_data", frozen)]
pub struct RunState {
    inner: EngineRunState,
}

#[pymethods]
impl RunState {
    #[new]
    #[pyo3(signature = (world_size, resolved, positions, source = "the run state"))]
    fn new(
        py: Python<'_>,
        world_size: usize,
        resolved: Option<&Bound<'_, PyAny>>,
        positions: Vec<Option<PyRef<'_, Position>>>,
        source: &str,
    ) -> PyResult<Self> {
        let resolved = resolved.map(|r| resolved_of(py, r)).transpose()?;
        let positions = positions
            .into_iter()
            .map(|p| p.map(|p| p.inner.clone()))
            .collect();
        let inner = EngineRunState::new(world_size, resolved, positions, source)
            .map_err(|e| to_py(py, &e))?;
        Ok(Self { inner })
    }

    /// Reads a state (a dict, as `to_dict` gives it, or an earlier release's); `source` names
    /// it in errors.
    #[staticmethod]
    fn from_dict(py: Python<'_>, state: &Bound<'_, PyAny>, source: &str) -> PyResult<Self> {
        let text = json_text(py, state, source)?;
        let inner = py
            .detach(|| Error::catch(|| EngineRunState::parse(&text, source)))
            .map_err(|e| to_py(py, &e))?;
        Ok(Self { inner })
    }

    /// The state as plain JSON data (strings, ints, lists).
    fn to_dict<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        let text = py.detach(|| self.inner.to_json());
        py.import("json")?.call_method1("loads", (text,))
    }

    /// The number of ranks that took the positions.
    #[getter]
    fn world_size(&self) -> usize {
        self.inner.world_size()
    }

    /// Each rank's position; None: the rank is at the beginning of the config.
    #[getter]
    fn positions(&self) -> Vec<Option<Position>> {
        self.inner
            .positions()
            .iter()
            .map(|p| p.clone().map(|inner| Position { inner }))
            .collect()
    }

    /// The stream's resolved document (JSON), when the state has one.
    #[getter]
    fn resolved_json(&self) -> Option<String> {
        self.inner.resolved().map(|r| r.to_json())
    }

    /// Rank `rank`'s checkpoint in the world that took the state; None at the beginning.
    fn checkpoint(&self, py: Python<'_>, rank: usize) -> PyResult<Option<Py<Checkpoint>>> {
        wrap_optional(py, self.inner.checkpoint(rank).map_err(|e| to_py(py, &e))?)
    }

    /// Where rank `rank` of `world_size` resumes (None: the config's beginning): its own
    /// entry on the world that took the state, else the positions moved, which is exact only
    /// when every old rank stopped at the same place. `source` names the state in the refusal.
    fn checkpoint_for(
        &self,
        py: Python<'_>,
        rank: usize,
        world_size: usize,
        source: &str,
    ) -> PyResult<Option<Py<Checkpoint>>> {
        let moved = py
            .detach(|| self.inner.checkpoint_for(rank, world_size, source))
            .map_err(|e| to_py(py, &e))?;
        wrap_optional(py, moved)
    }
}

/// The index beside a directory of per-rank files: the world that wrote them, each rank's
/// file and the step the save was taken at.
#[pyclass(module = "o41_training_data", frozen)]
pub struct RunIndex {
    inner: EngineRunIndex,
}

#[pymethods]
impl RunIndex {
    #[new]
    #[pyo3(signature = (files, global_step = None))]
    fn new(files: Vec<Option<String>>, global_step: Option<i64>) -> Self {
        Self {
            inner: EngineRunIndex::new(files, global_step),
        }
    }

    /// Parses an index document (`source` names it in errors); version 1's pending switches
    /// are kept for `restore`.
    #[staticmethod]
    fn from_json(py: Python<'_>, text: &str, source: &str) -> PyResult<Self> {
        let inner = EngineRunIndex::parse(text, source).map_err(|e| to_py(py, &e))?;
        Ok(Self { inner })
    }

    /// The index as a document of the current version.
    fn to_json(&self) -> String {
        self.inner.to_json()
    }

    /// The number of ranks that wrote the files.
    #[getter]
    fn world_size(&self) -> usize {
        self.inner.world_size()
    }

    /// The step the save was taken at, when its writer said.
    #[getter]
    fn global_step(&self) -> Option<i64> {
        self.inner.global_step()
    }

    /// Where rank `rank` of `world_size` resumes from the per-rank files among `names` (the
    /// entries of the directory `place`), as this index lists them (None: no rank had
    /// started); `read(name)` returns a file's text or bytes, and an exception it raises
    /// propagates as it is. `source` names the index in errors.
    #[pyo3(signature = (names, place, read, rank, world_size, source))]
    #[allow(clippy::too_many_arguments)] // the binding of one engine call, argument for argument
    fn restore(
        &self,
        py: Python<'_>,
        names: Vec<String>,
        place: &str,
        read: &Bound<'_, PyAny>,
        rank: usize,
        world_size: usize,
        source: &str,
    ) -> PyResult<Option<Py<Checkpoint>>> {
        let files = EngineRunFiles::among(names, place).map_err(|e| to_py(py, &e))?;
        let restored = with_reader(py, read, |reader| {
            self.inner.restore(&files, rank, world_size, reader, source)
        })?;
        wrap_optional(py, restored)
    }
}

/// The global batch a switch to `stage` requested `batches_ahead` local batches after
/// `position` takes effect at; `ramped[s]` says whether stage `s` has a ramp.
#[pyfunction]
pub fn switch_at(
    py: Python<'_>,
    ramped: &Bound<'_, PyAny>,
    position: &Bound<'_, Position>,
    stage: usize,
    batches_ahead: u64,
) -> PyResult<u64> {
    let ramped: Vec<bool> = ramped.extract()?;
    checkpoint::switch_at(&ramped, &position.get().inner, stage, batches_ahead)
        .map_err(|e| to_py(py, &e))
}
