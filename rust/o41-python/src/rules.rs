//! The stream's rules as the Python face's adapters read them: the engine's limits, and the
//! delivered schema and batch shapes of a config or a checkpoint, computed here from the engine's
//! own types so that no adapter parses the resolved document (or its shard list) in Python.

use o41_engine::config::{FieldSpec, RampSpec};
use o41_engine::fields::Projection;
use o41_engine::limits::ALL as LIMITS;
use pyo3::prelude::*;
use pyo3::types::PyDict;

use crate::checkpoint::{config_of, Checkpoint};
use crate::errors::to_py;

/// The engine's limits by name (`max_world_size`, `max_seq_len`, ...).
#[pyfunction]
pub fn limits(py: Python<'_>) -> PyResult<Bound<'_, PyDict>> {
    let out = PyDict::new(py);
    for (name, value) in LIMITS {
        out.set_item(name, value)?;
    }
    Ok(out)
}

/// Every encoding's name, in the engine's order (`Encoding::ALL`).
#[pyfunction]
pub fn encodings() -> Vec<&'static str> {
    o41_engine::encoding::Encoding::ALL
        .iter()
        .map(|e| e.name())
        .collect()
}

/// The file name suffixes the engine infers encodings from, longest first, each with the
/// encoding's name (`Encoding::SUFFIXES`).
#[pyfunction]
pub fn encoding_suffixes() -> Vec<(&'static str, &'static str)> {
    o41_engine::encoding::Encoding::SUFFIXES
        .iter()
        .map(|(suffix, e)| (*suffix, e.name()))
        .collect()
}

/// One delivered column: name, dtype name and per-row shape.
type FieldTuple = (String, &'static str, Vec<usize>);
/// One stage: its global batch size, its ramp `(start, increment, rows)` if any, and every size
/// its global batches have (the engine's ramp rule, `Batching::sizes`).
type StageTuple = (u64, Option<(u64, u64, u64)>, Vec<u64>);

fn stage_tuple(batch_size: usize, ramp: Option<RampSpec>) -> StageTuple {
    let sizes = o41_engine::order::Batching::new(batch_size as u64, ramp).sizes();
    let ramp = ramp.map(|r| (r.start, r.increment, r.rows));
    (batch_size as u64, ramp, sizes)
}

/// A stage's batch rows on `world_size` ranks, by the engine's ramp rule: every row count a
/// rank's batch can have (smallest first) and the global batches one round covers.
/// A ramp that does not grow to `batch_size` in whole steps is refused, as a config's is.
#[pyfunction]
#[pyo3(signature = (batch_size, ramp, world_size))]
pub fn stage_batch_rows(
    py: Python<'_>,
    batch_size: usize,
    ramp: Option<(u64, u64, u64)>,
    world_size: u64,
) -> PyResult<(Vec<u64>, u64)> {
    let ramp = ramp.map(|(start, increment, rows)| RampSpec {
        start,
        increment,
        rows,
    });
    o41_engine::config::validate_ramp("stage", batch_size, ramp, 1).map_err(|e| to_py(py, &e))?;
    let batching = o41_engine::order::Batching::new(batch_size as u64, ramp);
    Ok((
        batching.local_rows(world_size),
        batching.batches_per_round(world_size),
    ))
}

/// The rows a rank of `config` plans together and the bytes of one row as declared: what a
/// rank holds decoded ahead of its consumer (two such groups at most).
#[pyfunction]
pub fn planned_rows(py: Python<'_>, source: &Bound<'_, PyAny>) -> PyResult<(u64, u64)> {
    let config = config_of(py, source)?;
    let fail = |e: o41_engine::error::Error| to_py(py, &e);
    config.validate().map_err(fail)?;
    let shape = config.pipeline_shape().map_err(fail)?;
    let row_bytes = o41_engine::memory::declared_row_bytes(&config.fields).map_err(fail)?;
    Ok((shape.group_rows, row_bytes))
}

/// What adapters need of a stream: `(fields, stages, rank, world_size)`, from a config (an object
/// with `to_json()`) or a `Checkpoint` (its resolved document, as the engine holds it).
#[pyfunction]
pub fn stream_rules(
    py: Python<'_>,
    source: &Bound<'_, PyAny>,
) -> PyResult<(Vec<FieldTuple>, Vec<StageTuple>, usize, usize)> {
    let (fields, validation_pass, stages, rank, world_size): (Vec<FieldSpec>, bool, Vec<_>, _, _) =
        if let Ok(checkpoint) = source.cast::<Checkpoint>() {
            let resolved = &checkpoint.get().inner.resolved;
            let stages = resolved
                .stages
                .iter()
                .map(|s| stage_tuple(s.batch_size, s.ramp))
                .collect();
            (
                resolved.fields.clone(),
                resolved.validation_pass,
                stages,
                resolved.rank,
                resolved.world_size,
            )
        } else {
            let config = config_of(py, source)?;
            let stages = config
                .stages
                .iter()
                .map(|s| stage_tuple(s.batch_size, s.ramp))
                .collect();
            (
                config.fields,
                config.validation_pass,
                stages,
                config.rank,
                config.world_size,
            )
        };
    let projection = Projection::delivered(&fields, validation_pass).map_err(|e| to_py(py, &e))?;
    let fields = projection
        .columns
        .into_iter()
        .map(|c| (c.name, c.dtype.name(), c.shape))
        .collect();
    Ok((fields, stages, rank, world_size))
}
