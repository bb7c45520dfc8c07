//! What a failed S3 request was: its cause, whether to retry it, and its message with the
//! credentials scrubbed out.

use std::future::Future;
use std::sync::Arc;

use crate::error::{Error, Result};
use crate::metrics::{Meter, RetryCause};
use crate::storage::retry::{Attempts, RetryPolicy};

/// Replaces credentials in text that came from the service or the client library.
#[derive(Clone)]
pub(super) struct Scrubber(pub(super) Arc<Vec<String>>);

impl Scrubber {
    pub(super) fn clean(&self, text: &str) -> String {
        self.0.iter().fold(text.to_owned(), |out, secret| {
            out.replace(secret.as_str(), "<redacted>")
        })
    }
}

/// Whether a failed request without a status timed out (connect or read timeout), from the
/// error chain's text: `object_store` and `reqwest` keep their error kinds private.
pub(super) fn is_timeout(error: &(dyn std::error::Error + 'static)) -> bool {
    let mut next: Option<&(dyn std::error::Error + 'static)> = Some(error);
    while let Some(e) = next {
        let text = e.to_string().to_ascii_lowercase();
        if text.contains("timed out") || text.contains("timeout") {
            return true;
        }
        next = e.source();
    }
    false
}

/// The HTTP status of a failed request, read from `object_store`'s message because its request
/// error type is not public.
pub(super) fn status_code(message: &str) -> Option<u16> {
    let (_, rest) = message.split_once("status code: ")?;
    rest.get(..3)?.parse().ok()
}

/// How one failed request is handled.
pub(super) enum Failure {
    /// Fail closed with this error.
    Fatal(Error),
    /// The object already exists (a create-only write).
    Exists,
    /// Retry, counted under the cause; the text is what to report if retries run out.
    Transient(RetryCause, String),
}

#[derive(Clone)]
pub(super) struct Context {
    pub(super) policy: RetryPolicy,
    pub(super) scrubber: Scrubber,
}

impl Context {
    pub(super) fn classify(&self, uri: &str, error: object_store::Error) -> Failure {
        use object_store::Error as E;
        let path = uri.to_owned();
        match error {
            E::NotFound { .. } => Failure::Fatal(Error::NotFound { path }),
            E::AlreadyExists { .. } => Failure::Exists,
            E::Precondition { .. } => Failure::Fatal(Error::Storage {
                path,
                message: "the object was replaced while it was being read (its ETag changed); \
                          the read stops instead of mixing two versions"
                    .into(),
            }),
            E::PermissionDenied { source, .. } | E::Unauthenticated { source, .. } => {
                Failure::Fatal(Error::AccessDenied {
                    path,
                    message: self.scrubber.clean(&source.to_string()),
                })
            }
            E::Generic { source, .. } => {
                let message = self.scrubber.clean(&source.to_string());
                let status = status_code(&source.to_string());
                let cause = match status {
                    // A request the service rejects as such will be rejected again.
                    Some(code) if (400..500).contains(&code) && code != 408 && code != 429 => {
                        return Failure::Fatal(Error::Storage {
                            path,
                            message: format!("the service refused the request: {message}"),
                        })
                    }
                    // S3 answers 503 SlowDown when it throttles.
                    Some(429 | 503) => RetryCause::Throttled,
                    Some(408) => RetryCause::Timeout,
                    Some(_) => RetryCause::ServerError,
                    None if is_timeout(source.as_ref()) => RetryCause::Timeout,
                    None => RetryCause::Connection,
                };
                Failure::Transient(cause, message)
            }
            other => Failure::Fatal(Error::Storage {
                path,
                message: self.scrubber.clean(&other.to_string()),
            }),
        }
    }

    /// Runs `op` until it succeeds, fails closed, or the retry budget runs out. `Exists` is
    /// handed back to the caller as `Ok(None)`. Retries are counted into `meter`.
    pub(super) async fn retrying<T, F, Fut>(
        &self,
        uri: &str,
        meter: Option<&Arc<Meter>>,
        mut op: F,
    ) -> Result<Option<T>>
    where
        F: FnMut() -> Fut,
        Fut: Future<Output = object_store::Result<T>>,
    {
        let mut attempts = Attempts::new(self.policy);
        loop {
            let cause = match op().await {
                Ok(value) => return Ok(Some(value)),
                Err(e) => match self.classify(uri, e) {
                    Failure::Fatal(e) => return Err(e),
                    Failure::Exists => return Ok(None),
                    Failure::Transient(kind, cause) => {
                        if let Some(meter) = meter {
                            meter.retry(kind);
                        }
                        cause
                    }
                },
            };
            match attempts.failed() {
                Ok(wait) => tokio::time::sleep(wait).await,
                Err(reason) => {
                    return Err(Error::Storage {
                        path: uri.to_owned(),
                        message: format!("{reason}; last error: {cause}"),
                    })
                }
            }
        }
    }
}
