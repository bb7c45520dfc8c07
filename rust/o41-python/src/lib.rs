//! The compiled module `o41_training_data._core`: a thin `PyO3` face over `o41-engine`.
//!
//! Everything here converts: JSON config in, Arrow batches out through the C data interface,
//! engine errors to the Python exception hierarchy. Blocking calls release the GIL.

mod checkpoint;
mod errors;
mod objects;
mod storage;
mod stream;

use pyo3::prelude::*;

/// The compiled core of `o41_training_data`.
#[pymodule]
fn _core(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    m.add_class::<stream::Stream>()?;
    m.add_class::<checkpoint::Checkpoint>()?;
    m.add_class::<storage::Storage>()?;
    m.add_class::<objects::StorageObject>()?;
    m.add_class::<objects::MsgpackRecords>()?;
    m.add_function(wrap_pyfunction!(stream::resolve_config, m)?)?;
    m.add_function(wrap_pyfunction!(stream::host_memory_bytes, m)?)?;
    m.add_function(wrap_pyfunction!(stream::load_manifest, m)?)?;
    m.add_function(wrap_pyfunction!(stream::check_manifest, m)?)?;
    m.add_function(wrap_pyfunction!(stream::shard_location, m)?)?;
    Ok(())
}
