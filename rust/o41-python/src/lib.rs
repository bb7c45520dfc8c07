//! The compiled module `o41_training_data._core`: a thin `PyO3` face over `o41-engine`.
//!
//! Everything here converts: JSON config in, Arrow batches out through the C data interface,
//! engine errors to the Python exception hierarchy. Every call that can block goes through
//! `blocking`, which releases the GIL and keeps Ctrl-C working.

mod blocking;
mod checkpoint;
mod errors;
mod manifest;
mod objects;
mod position;
mod records;
mod rules;
mod run_files;
mod run_state;
mod shared_slots;
mod storage;
mod stream;
mod trace;

use pyo3::prelude::*;

/// Physical memory of the host in bytes, or None where it cannot be read.
#[pyfunction]
fn host_memory_bytes() -> Option<u64> {
    o41_engine::memory::host_memory_bytes()
}

/// The compiled core of `o41_training_data`.
#[pymodule]
fn _core(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    m.add_class::<stream::Stream>()?;
    m.add_class::<checkpoint::Checkpoint>()?;
    m.add_class::<run_files::RunFiles>()?;
    m.add_class::<run_state::RunState>()?;
    m.add_class::<run_state::RunIndex>()?;
    m.add_function(wrap_pyfunction!(run_state::switch_at, m)?)?;
    m.add_function(wrap_pyfunction!(rules::stage_batch_rows, m)?)?;
    m.add_class::<shared_slots::SlotRing>()?;
    m.add_class::<shared_slots::BatchSlot>()?;
    m.add_function(wrap_pyfunction!(shared_slots::receive_slot, m)?)?;
    m.add_function(wrap_pyfunction!(shared_slots::shared_segment_of, m)?)?;
    m.add_function(wrap_pyfunction!(
        shared_slots::shared_segment_directories,
        m
    )?)?;
    m.add(
        "SHARED_SEGMENT_PREFIX",
        o41_engine::shared_slots::SEGMENT_PREFIX,
    )?;
    m.add("RUN_STATE_FORMAT", o41_engine::checkpoint::RUN_STATE_FORMAT)?;
    m.add(
        "RUN_STATE_VERSION",
        o41_engine::checkpoint::RUN_STATE_VERSION,
    )?;
    m.add_class::<position::Position>()?;
    m.add_class::<position::Segment>()?;
    m.add_class::<position::Drain>()?;
    m.add_class::<storage::Storage>()?;
    m.add_class::<objects::StorageObject>()?;
    m.add_class::<records::ShardRecords>()?;
    m.add_function(wrap_pyfunction!(stream::resolve_config, m)?)?;
    m.add_function(wrap_pyfunction!(trace::trace_config, m)?)?;
    m.add_function(wrap_pyfunction!(checkpoint::split_reference, m)?)?;
    m.add_function(wrap_pyfunction!(run_files::rank_file_name, m)?)?;
    m.add_function(wrap_pyfunction!(run_files::parse_rank_file_name, m)?)?;
    m.add_function(wrap_pyfunction!(run_files::check_same_place, m)?)?;
    m.add_function(wrap_pyfunction!(run_files::check_same_stream, m)?)?;
    m.add_function(wrap_pyfunction!(trace::trace_checkpoint, m)?)?;
    m.add_function(wrap_pyfunction!(rules::limits, m)?)?;
    m.add_function(wrap_pyfunction!(rules::encodings, m)?)?;
    m.add_function(wrap_pyfunction!(rules::encoding_suffixes, m)?)?;
    m.add_function(wrap_pyfunction!(storage::retry_defaults, m)?)?;
    m.add_function(wrap_pyfunction!(rules::stream_rules, m)?)?;
    m.add_function(wrap_pyfunction!(rules::planned_rows, m)?)?;
    m.add_function(wrap_pyfunction!(records::write_shard, m)?)?;
    m.add_function(wrap_pyfunction!(host_memory_bytes, m)?)?;
    m.add_function(wrap_pyfunction!(manifest::load_manifest, m)?)?;
    m.add_function(wrap_pyfunction!(manifest::check_manifest, m)?)?;
    m.add_function(wrap_pyfunction!(manifest::shard_location, m)?)?;
    m.add_function(wrap_pyfunction!(manifest::normalize_location, m)?)?;
    Ok(())
}
