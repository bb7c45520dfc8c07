//! Data manifests: read, check and locate (the format lives in the engine's `manifest` module).

use o41_engine::manifest::{shard_path, Manifest};
use pyo3::prelude::*;

use crate::blocking::blocking;
use crate::errors::to_py;
use crate::storage::{engine, Storage};

/// Reads and checks a data manifest; returns it as JSON.
#[pyfunction]
#[pyo3(signature = (uri, storage=None))]
pub fn load_manifest(py: Python<'_>, uri: &str, storage: Option<&Storage>) -> PyResult<String> {
    let storage = engine(storage);
    blocking(py, |cancel| {
        let text = Manifest::read(uri, &storage.with_cancel(cancel.clone()))?;
        Manifest::from_json(&text, uri).map(|m| m.to_json())
    })
}

/// The one spelling of a location (`docs/storage.md`): `s3://` as it is, a local path made
/// absolute with `.` and `..` resolved lexically, symbolic links not followed.
#[pyfunction]
pub fn normalize_location(location: &str) -> String {
    o41_engine::storage::normalize(location)
}

/// Where the shard `location` of the manifest at `manifest_uri` is (`docs/manifest.md`).
#[pyfunction]
pub fn shard_location(manifest_uri: &str, location: &str) -> String {
    shard_path(manifest_uri, location)
}

/// Checks a data manifest document (JSON) against the format's rules; `uri` names it in errors.
#[pyfunction]
pub fn check_manifest(py: Python<'_>, text: &str, uri: &str) -> PyResult<String> {
    Manifest::from_json(text, uri)
        .map(|m| m.to_json())
        .map_err(|e| to_py(py, &e))
}
