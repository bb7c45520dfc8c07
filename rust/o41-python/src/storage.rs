//! `_core.Storage`: storage settings and the object operations the Python saver and manifest
//! code need. It holds credentials, so it has no pickle support and its repr omits them.

use std::time::Duration;

use o41_engine::encoding::Encoding;
use o41_engine::manifest::describe_shard;
use std::sync::Arc;
use std::time::SystemTime;

use o41_engine::storage::{
    sha256_hex, Credentials, FetchCredentials, RetryPolicy, S3Settings, Storage as EngineStorage,
    TemporaryCredentials, WriteMode, Written,
};
use pyo3::prelude::*;
use pyo3::types::PyBytes;

use crate::blocking::blocking;
use crate::errors::to_py;
use crate::objects::StorageObject;

/// Local paths, plus `s3://` locations when an endpoint is given or `aws` is set. Use
/// `o41_training_data.TrainingData`, not this class.
#[pyclass(module = "o41_training_data._core", frozen)]
pub struct Storage {
    pub inner: EngineStorage,
    endpoint: Option<String>,
}

fn seconds(option: &str, value: f64) -> PyResult<Duration> {
    let limit = o41_engine::limits::MAX_RETRY_SECONDS as f64;
    (value <= limit)
        .then(|| Duration::try_from_secs_f64(value).ok())
        .flatten()
        .ok_or_else(|| {
            Python::attach(|py| {
                to_py(
                    py,
                    &o41_engine::Error::config(
                        option,
                        format!("{value} is not a duration from 0 to {limit} seconds"),
                    ),
                )
            })
        })
}

/// The engine's default retry policy, as `RetryPolicy`'s fields name it: the one place its
/// values are written down.
#[pyfunction]
pub fn retry_defaults(py: Python<'_>) -> PyResult<Bound<'_, pyo3::types::PyDict>> {
    let policy = RetryPolicy::default();
    let out = pyo3::types::PyDict::new(py);
    out.set_item("max_consecutive_failures", policy.max_consecutive_failures)?;
    for (name, value) in [
        ("no_progress_timeout_s", policy.no_progress_timeout),
        ("read_timeout_s", policy.read_timeout),
        ("connect_timeout_s", policy.connect_timeout),
        ("initial_backoff_s", policy.initial_backoff),
        ("max_backoff_s", policy.max_backoff),
    ] {
        out.set_item(name, value.as_secs_f64())?;
    }
    Ok(out)
}

/// A Python function returning `(access_key_id, secret_access_key, session_token or None,
/// expiry as seconds since the epoch or None)`; `_storage.py` wraps the user's callable so that
/// its answer is checked and put in this shape there.
struct PyCredentials(Py<PyAny>);

impl FetchCredentials for PyCredentials {
    fn fetch(&self) -> o41_engine::Result<TemporaryCredentials> {
        Python::attach(|py| {
            let answer = self
                .0
                .call0(py)
                .and_then(|a| a.extract::<(String, String, Option<String>, Option<f64>)>(py));
            let (access_key_id, secret_access_key, session_token, expiry) = answer
                .map_err(|e| o41_engine::Error::config("credential_provider", e.to_string()))?;
            let expiry = expiry
                .map(|seconds| {
                    Duration::try_from_secs_f64(seconds)
                        .map(|d| SystemTime::UNIX_EPOCH + d)
                        .map_err(|_| {
                            o41_engine::Error::config(
                                "credential_provider",
                                format!("expiry {seconds} is not a time after 1970"),
                            )
                        })
                })
                .transpose()?;
            Ok(TemporaryCredentials {
                access_key_id,
                secret_access_key,
                session_token,
                expiry,
            })
        })
    }
}

#[pymethods]
impl Storage {
    #[new]
    #[pyo3(signature = (
        endpoint=None, region=None, access_key_id=None, secret_access_key=None, session_token=None,
        *, aws=false, profile=None, credential_provider=None, ca_bundle=None,
        max_consecutive_failures=64, no_progress_timeout_s=900.0, read_timeout_s=60.0,
        connect_timeout_s=10.0, initial_backoff_s=0.1, max_backoff_s=15.0
    ))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        py: Python<'_>,
        endpoint: Option<String>,
        region: Option<String>,
        access_key_id: Option<String>,
        secret_access_key: Option<String>,
        session_token: Option<String>,
        aws: bool,
        profile: Option<String>,
        credential_provider: Option<Py<PyAny>>,
        ca_bundle: Option<Vec<u8>>,
        max_consecutive_failures: u32,
        no_progress_timeout_s: f64,
        read_timeout_s: f64,
        connect_timeout_s: f64,
        initial_backoff_s: f64,
        max_backoff_s: f64,
    ) -> PyResult<Self> {
        if endpoint.is_none() && !aws {
            return Ok(Storage {
                inner: EngineStorage::local(),
                endpoint: None,
            });
        }
        let policy = RetryPolicy {
            max_consecutive_failures: max_consecutive_failures.max(1),
            no_progress_timeout: seconds("no_progress_timeout_s", no_progress_timeout_s)?,
            read_timeout: seconds("read_timeout_s", read_timeout_s)?,
            connect_timeout: seconds("connect_timeout_s", connect_timeout_s)?,
            initial_backoff: seconds("initial_backoff_s", initial_backoff_s)?,
            max_backoff: seconds("max_backoff_s", max_backoff_s)?,
        };
        let credentials = match (credential_provider, access_key_id) {
            (Some(provider), _) => Credentials::Provider(Arc::new(PyCredentials(provider))),
            (None, Some(access_key_id)) => Credentials::Static(TemporaryCredentials {
                access_key_id,
                secret_access_key: secret_access_key.unwrap_or_default(),
                session_token,
                expiry: None,
            }),
            (None, None) => Credentials::Chain { profile },
        };
        let settings = S3Settings {
            endpoint: endpoint.clone(),
            region: region.unwrap_or_else(|| "us-east-1".to_owned()),
            credentials,
            ca_bundle,
        };
        let inner = EngineStorage::with_s3(settings, policy).map_err(|e| to_py(py, &e))?;
        Ok(Storage {
            inner,
            endpoint: Some(endpoint.unwrap_or_else(|| "AWS".to_owned())),
        })
    }

    /// The whole content of `uri`.
    fn read<'py>(&self, py: Python<'py>, uri: &str) -> PyResult<Bound<'py, PyBytes>> {
        let data = blocking(py, |cancel| {
            self.inner.with_cancel(cancel.clone()).read(uri)
        })?;
        Ok(PyBytes::new(py, &data))
    }

    /// Opens `uri` for ranged reads pinned to its current version.
    fn open(&self, py: Python<'_>, uri: &str) -> PyResult<StorageObject> {
        blocking(py, |cancel| {
            self.inner.with_cancel(cancel.clone()).open(uri)
        })
        .map(|inner| StorageObject { inner })
    }

    /// Writes `data` to `uri`; True when written, False when an equal object was already there.
    /// Create-only by default: a different object there raises `ObjectConflictError`.
    #[pyo3(signature = (uri, data, *, create_only=true))]
    fn write(&self, py: Python<'_>, uri: &str, data: Vec<u8>, create_only: bool) -> PyResult<bool> {
        blocking(py, |cancel| {
            let sha = sha256_hex(&data);
            self.inner
                .with_cancel(cancel.clone())
                .write(uri, data.into(), &sha, mode(create_only))
        })
        .map(|w| w == Written::Created)
    }

    /// Writes the local file `source` (whose hex SHA-256 is `sha256`) to `uri`, as `write`.
    #[pyo3(signature = (uri, source, sha256, *, create_only=true))]
    fn write_file(
        &self,
        py: Python<'_>,
        uri: &str,
        source: &str,
        sha256: &str,
        create_only: bool,
    ) -> PyResult<bool> {
        blocking(py, |cancel| {
            self.inner.with_cancel(cancel.clone()).write_file(
                uri,
                source,
                sha256,
                mode(create_only),
            )
        })
        .map(|w| w == Written::Created)
    }

    /// Hex SHA-256 of `uri`: stored with remote objects this library wrote, else computed.
    fn checksum(&self, py: Python<'_>, uri: &str) -> PyResult<String> {
        blocking(py, |cancel| {
            self.inner.with_cancel(cancel.clone()).checksum(uri)
        })
    }

    /// Hex SHA-256 computed from the content of `uri` (never from stored metadata).
    fn content_sha256(&self, py: Python<'_>, uri: &str) -> PyResult<String> {
        blocking(py, |cancel| {
            self.inner.with_cancel(cancel.clone()).content_sha256(uri)
        })
    }

    /// The location, record count, size and content SHA-256 of the shard at `uri`, read as
    /// `encoding`: what a data manifest lists for it.
    fn describe_shard(
        &self,
        py: Python<'_>,
        uri: &str,
        encoding: &str,
    ) -> PyResult<(String, u64, u64, String)> {
        blocking(py, |cancel| {
            let encoding = Encoding::parse(encoding, "data_format")?;
            describe_shard(&self.inner.with_cancel(cancel.clone()), uri, encoding)
        })
    }

    /// Every object under the directory `prefix`, as full locations, sorted.
    fn list(&self, py: Python<'_>, prefix: &str) -> PyResult<Vec<String>> {
        blocking(py, |cancel| {
            self.inner.with_cancel(cancel.clone()).list(prefix)
        })
    }

    fn __repr__(&self) -> String {
        match &self.endpoint {
            Some(endpoint) => format!("Storage({endpoint})"),
            None => "Storage(local)".to_owned(),
        }
    }
}

fn mode(create_only: bool) -> WriteMode {
    if create_only {
        WriteMode::CreateOnly
    } else {
        WriteMode::Overwrite
    }
}

/// The engine storage for an optional Python `Storage` (local only when absent).
pub fn engine(storage: Option<&Storage>) -> EngineStorage {
    storage.map_or_else(EngineStorage::local, |s| s.inner.clone())
}
