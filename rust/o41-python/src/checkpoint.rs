//! `Checkpoint`: a rank's stream position, as the engine's checkpoint document.

use std::sync::Arc;

use o41_engine::checkpoint::check_config;
use o41_engine::checkpoint::Checkpoint as EngineCheckpoint;
use o41_engine::config::ResolvedConfig;
use o41_engine::{Error, StreamConfig};
use pyo3::prelude::*;
use pyo3::types::{PyString, PyTuple};

use crate::errors::{index_arg, to_py};
use crate::position::Position;

/// A rank's position in a batch stream together with the resolved config (no credentials) it
/// is a position in. It is a `Position`: the cursor and the counters `stage`,
/// `batches_yielded`, `rows_yielded` and per-source `epochs` are read as on one.
///
/// Write `to_json()` next to the model checkpoint; `Checkpoint.from_json` reads it back and
/// `resume_batch_stream` continues exactly after the last consumed batch.
#[pyclass(module = "o41_training_data", frozen, eq, extends = Position)]
#[derive(PartialEq)]
pub struct Checkpoint {
    pub inner: EngineCheckpoint,
}

impl Checkpoint {
    /// The Python object of `inner`: its `Position` base holds the checkpoint's position.
    pub fn wrap(py: Python<'_>, inner: EngineCheckpoint) -> PyResult<Py<Checkpoint>> {
        let base = Position {
            inner: inner.position.clone(),
        };
        Py::new(
            py,
            PyClassInitializer::from(base).add_subclass(Checkpoint { inner }),
        )
    }
}

/// The resolved document `resolved` names: a checkpoint's, or a resolved config as a dict or
/// its JSON text.
pub fn resolved_of(py: Python<'_>, resolved: &Bound<'_, PyAny>) -> PyResult<Arc<ResolvedConfig>> {
    if let Ok(checkpoint) = resolved.cast::<Checkpoint>() {
        return Ok(checkpoint.get().inner.resolved.clone());
    }
    let text: String = if resolved.is_instance_of::<PyString>() {
        resolved.extract()?
    } else {
        py.import("json")?
            .call_method1("dumps", (resolved,))?
            .extract()?
    };
    let config = serde_json::from_str(&text).map_err(|e| {
        to_py(
            py,
            &Error::Checkpoint {
                message: format!("malformed resolved config: {e}"),
            },
        )
    })?;
    Ok(Arc::new(config))
}

/// A config object's JSON document (`BatchStreamConfig.to_json()`), parsed by the engine.
pub fn config_of(py: Python<'_>, config: &Bound<'_, PyAny>) -> PyResult<StreamConfig> {
    let Ok(to_json) = config.getattr("to_json") else {
        let kind = config.get_type().name()?;
        let message = format!("expected a BatchStreamConfig, got {kind}");
        return Err(to_py(py, &Error::config("config", message)));
    };
    let text: String = to_json.call0()?.extract()?;
    StreamConfig::from_json(&text).map_err(|e| to_py(py, &e))
}

#[pymethods]
impl Checkpoint {
    /// Parses a checkpoint document; raises `CheckpointError` when it is corrupt, of another
    /// version, or altered.
    #[staticmethod]
    fn from_json(py: Python<'_>, text: &str) -> PyResult<Py<Self>> {
        // A million-shard document takes most of a second: other Python threads run meanwhile.
        let inner = py
            .detach(|| Error::catch(|| EngineCheckpoint::from_json(text)))
            .map_err(|e| to_py(py, &e))?;
        Self::wrap(py, inner)
    }

    /// The checkpoint a rank file of the split form (version 2) and the resolved document it
    /// names describe (see `to_split`); raises `CheckpointError` when either is corrupt or the
    /// document is not the rank file's stream.
    #[staticmethod]
    fn from_split(py: Python<'_>, rank_text: &str, shared_text: &str) -> PyResult<Py<Self>> {
        let inner = py
            .detach(|| Error::catch(|| EngineCheckpoint::from_split(rank_text, shared_text)))
            .map_err(|e| to_py(py, &e))?;
        Self::wrap(py, inner)
    }

    /// The split form's rank file and the name of the shared document it names:
    /// `(rank_json, shared_name)`. The rank file holds the position; the shared document
    /// (`resolved-<fingerprint>.json`, `shared_json()`) holds the resolved document once for
    /// every rank and checkpoint of the run.
    fn to_split(&self) -> (String, String) {
        let fingerprint = &self.inner.position.fingerprint;
        (
            self.inner.to_split_json(),
            o41_engine::checkpoint::shared_name(fingerprint),
        )
    }

    /// The split form's shared document: the resolved document, the same bytes from every rank.
    fn shared_json(&self, py: Python<'_>) -> String {
        py.detach(|| self.inner.shared_json())
    }

    /// The checkpoint at `position` of the stream that `resolved` describes: a checkpoint of that
    /// stream (at any position) or its resolved config document (a dict or its JSON text, from
    /// `resolve_batch_stream_config` or `BatchStream.resolved_config()`). Raises
    /// `CheckpointError` when the position belongs to another stream.
    #[staticmethod]
    fn from_position(
        py: Python<'_>,
        position: &Bound<'_, PyAny>,
        resolved: &Bound<'_, PyAny>,
    ) -> PyResult<Py<Self>> {
        let Ok(position) = position.cast::<Position>() else {
            let kind = position.get_type().name()?;
            let message = format!("expected a Position, got {kind}");
            return Err(to_py(py, &Error::config("position", message)));
        };
        let position = position.get();
        let config = resolved_of(py, resolved)?;
        let inner = EngineCheckpoint::from_position(config, position.inner.clone())
            .map_err(|e| to_py(py, &e))?;
        Self::wrap(py, inner)
    }

    /// The checkpoint at the beginning of the stream that `resolved` describes (as for
    /// `from_position`): where a stream opened from its config starts. Raises
    /// `CheckpointError` when the document is malformed.
    #[staticmethod]
    fn at_start(py: Python<'_>, resolved: &Bound<'_, PyAny>) -> PyResult<Py<Self>> {
        let config = resolved_of(py, resolved)?;
        let inner = EngineCheckpoint::at_start(config).map_err(|e| to_py(py, &e))?;
        Self::wrap(py, inner)
    }

    /// Refuses the checkpoint for this process, raising `CheckpointError` that names what
    /// differs: another `rank` or `world_size`, or a `config` (a `BatchStreamConfig`) whose
    /// fields, seed, stages, weights, file lists or manifest selections differ from the ones
    /// the checkpoint was taken with. Nothing is read from storage. `resume_batch_stream` runs
    /// the same check.
    #[pyo3(signature = (*, rank=None, world_size=None, config=None))]
    fn check(
        &self,
        py: Python<'_>,
        rank: Option<&Bound<'_, PyAny>>,
        world_size: Option<&Bound<'_, PyAny>>,
        config: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<()> {
        let rank = rank.map(|r| index_arg(py, "rank", r)).transpose()?;
        let world_size = world_size
            .map(|w| index_arg(py, "world_size", w))
            .transpose()?;
        self.inner
            .check_process(rank, world_size)
            .map_err(|e| to_py(py, &e))?;
        if let Some(config) = config {
            let config = config_of(py, config)?;
            let skipping = self
                .inner
                .with_skips(&config.skip_batches)
                .map_err(|e| to_py(py, &e))?;
            check_config(&skipping.resolved, &config).map_err(|e| to_py(py, &e))?;
        }
        Ok(())
    }

    /// This checkpoint with `ranges` (pairs `(start, end)` or `range` objects) as the global
    /// batches its stream skips: every range it already skips kept, new ones at or after its
    /// next global batch. The skips join the fingerprint, so the result belongs to the stream
    /// with them; `resume_batch_stream(..., skip_batches=...)` calls it.
    fn with_skipped_batches(
        &self,
        py: Python<'_>,
        ranges: &Bound<'_, PyAny>,
    ) -> PyResult<Py<Self>> {
        let mut skips = Vec::new();
        for (i, item) in ranges.try_iter()?.enumerate() {
            let item = item?;
            let pair = if let Ok(range) = item.cast::<pyo3::types::PyRange>() {
                (range.getattr("step")?.extract::<i64>()? == 1)
                    .then(|| -> PyResult<[u64; 2]> {
                        Ok([
                            range.getattr("start")?.extract()?,
                            range.getattr("stop")?.extract()?,
                        ])
                    })
                    .transpose()?
            } else {
                item.extract::<(u64, u64)>().ok().map(|(a, b)| [a, b])
            };
            let Some(pair) = pair else {
                let message = format!("expected a (start, end) pair or a range, got {item}");
                let error = Error::config(format!("skip_batches[{i}]"), message);
                return Err(to_py(py, &error));
            };
            skips.push(pair);
        }
        let inner = self.inner.with_skips(&skips).map_err(|e| to_py(py, &e))?;
        Self::wrap(py, inner)
    }

    /// The checkpoint as a JSON document.
    fn to_json(&self, py: Python<'_>) -> String {
        py.detach(|| self.inner.to_json())
    }

    /// The same position for another rank and world size (elastic resume).
    fn for_world(
        &self,
        py: Python<'_>,
        rank: &Bound<'_, PyAny>,
        world_size: &Bound<'_, PyAny>,
    ) -> PyResult<Py<Self>> {
        let (rank, world_size) = (
            index_arg(py, "rank", rank)?,
            index_arg(py, "world_size", world_size)?,
        );
        let inner = self
            .inner
            .for_world(rank, world_size)
            .map_err(|e| to_py(py, &e))?;
        Self::wrap(py, inner)
    }

    /// The position part as a plain `Position`: everything but the resolved config.
    #[getter]
    fn position(&self) -> Position {
        Position {
            inner: self.inner.position(),
        }
    }

    /// The version the document is written in: 3 when it holds pending switches, else 1.
    #[getter]
    fn version(&self) -> u32 {
        self.inner.version()
    }

    /// The resolved config document (JSON) the checkpoint pins.
    fn resolved_json(&self) -> String {
        self.inner.resolved.to_json()
    }

    /// The resolved config document the checkpoint pins, as a dict.
    fn resolved_config<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        py.import("json")?
            .call_method1("loads", (self.inner.resolved.to_json(),))
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
            self.inner.rank(),
            self.inner.world_size(),
            self.inner.position.stage,
            self.inner.position.batches_yielded,
            self.inner.position.rows_yielded,
            self.inner.position.epochs
        )
    }
}

/// The resolved document a checkpoint file's text names, if it is a rank file of the split form
/// (version 2); None for a self-contained checkpoint (or anything else, which `from_json`
/// reports).
#[pyfunction]
pub fn split_reference(py: Python<'_>, text: &str) -> PyResult<Option<String>> {
    o41_engine::checkpoint::shared_reference(text).map_err(|e| to_py(py, &e))
}
