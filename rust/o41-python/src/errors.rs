//! The one conversion from engine errors to the Python exception hierarchy, which is defined in
//! `o41_training_data._errors` so that it can subclass built-ins like `FileNotFoundError`.

use o41_engine::Error;
use pyo3::prelude::*;

/// What a Python exception carries besides its message.
#[derive(Default)]
struct Context<'a> {
    option: Option<&'a str>,
    path: Option<&'a str>,
    row: Option<u64>,
    field: Option<&'a str>,
}

/// Converts an engine error into the matching `o41_training_data` exception, with the option,
/// path, row and field at fault as attributes (None where they do not apply).
/// A whole-number argument (`rank`, `world_size`) as `usize`: anything else, a bool, a negative
/// or a too-large int, is the package's `ConfigError` naming `name`, not a `TypeError` or an
/// `OverflowError` from the conversion.
pub fn index_arg(py: Python<'_>, name: &str, value: &Bound<'_, PyAny>) -> PyResult<usize> {
    let refused = |shown: String| {
        to_py(
            py,
            &Error::config(name, format!("expected a whole number >= 0, got {shown}")),
        )
    };
    if value.is_instance_of::<pyo3::types::PyBool>()
        || !value.is_instance_of::<pyo3::types::PyInt>()
    {
        let shown = value
            .repr()
            .map_or_else(|_| "?".to_owned(), |r| r.to_string());
        return Err(refused(shown));
    }
    value
        .extract::<usize>()
        .map_err(|_| refused(value.to_string()))
}

pub fn to_py(py: Python<'_>, err: &Error) -> PyErr {
    build(py, err).unwrap_or_else(|e| e)
}

fn build(py: Python<'_>, err: &Error) -> PyResult<PyErr> {
    let (class, context) = match err {
        Error::Config { option, .. } => (
            "ConfigError",
            Context {
                option: Some(option),
                ..Context::default()
            },
        ),
        Error::NotFound { path } => (
            "ObjectNotFoundError",
            Context {
                path: Some(path),
                ..Context::default()
            },
        ),
        Error::Io { path, .. } | Error::Storage { path, .. } => (
            "StorageError",
            Context {
                path: Some(path),
                ..Context::default()
            },
        ),
        Error::AccessDenied { path, .. } => (
            "AccessDeniedError",
            Context {
                path: Some(path),
                ..Context::default()
            },
        ),
        Error::Conflict { path, .. } => (
            "ObjectConflictError",
            Context {
                path: Some(path),
                ..Context::default()
            },
        ),
        Error::Format { path, row, .. } => (
            "MalformedShardError",
            Context {
                path: Some(path),
                row: *row,
                ..Context::default()
            },
        ),
        Error::Unsupported { path, .. } => (
            "UnsupportedFormatError",
            Context {
                path: Some(path),
                ..Context::default()
            },
        ),
        Error::Data {
            path, row, field, ..
        } => (
            "DataError",
            Context {
                path: Some(path),
                row: *row,
                field: field.as_deref(),
                ..Context::default()
            },
        ),
        Error::Projection {
            path, row, field, ..
        } => (
            "ProjectionError",
            Context {
                path: Some(path),
                row: Some(*row),
                field: Some(field),
                ..Context::default()
            },
        ),
        Error::Closed => ("StreamClosedError", Context::default()),
        Error::Cancelled { what } => (
            "O41Error",
            Context {
                path: Some(what),
                ..Context::default()
            },
        ),
        Error::Checkpoint { .. } => ("CheckpointError", Context::default()),
        _ => ("O41Error", Context::default()),
    };
    let module = py.import("o41_training_data._errors")?;
    let exc = module.getattr(class)?.call1((err.to_string(),))?;
    exc.setattr("option", context.option)?;
    exc.setattr("path", context.path)?;
    exc.setattr("row", context.row)?;
    exc.setattr("field", context.field)?;
    Ok(PyErr::from_value(exc))
}
