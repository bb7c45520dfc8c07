//! What a failed S3 request was: its cause, whether to retry it, and its message with the
//! credentials scrubbed out.

use std::future::Future;
use std::sync::Arc;
use std::time::Instant;

use super::credentials::SignerSlot;
use super::scrub::Scrubber;

use crate::error::{Error, Result};
use crate::metrics::{Meter, RetryCause};
use crate::storage::retry::{Attempts, RetryPolicy};

/// Whether the service refused the request's credentials (as opposed to the object or the
/// request): worth one retry with credentials fetched anew. A HEAD answer has no body to name
/// the code, so any 401 or 403 counts; a 400 counts when its code names a token.
fn refused_credentials(error: &object_store::Error) -> bool {
    use object_store::Error as E;
    match error {
        E::PermissionDenied { .. } | E::Unauthenticated { .. } => true,
        E::Generic { source, .. } => {
            let text = source.to_string();
            match status_code(&text) {
                Some(401 | 403) => true,
                Some(400) => [
                    "ExpiredToken",
                    "InvalidToken",
                    "TokenRefreshRequired",
                    "InvalidAccessKeyId",
                    "InvalidClientTokenId",
                ]
                .iter()
                .any(|code| text.contains(code)),
                _ => false,
            }
        }
        _ => false,
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
    pub(super) signer: Arc<SignerSlot>,
}

impl Context {
    /// After a refusal of the credentials of a request sent at `sent`, whether fresh ones were
    /// fetched and the request is worth repeating once (`retried` says it already was).
    pub(super) async fn refreshed(
        &self,
        error: &object_store::Error,
        sent: Instant,
        retried: &mut bool,
    ) -> bool {
        if *retried || !refused_credentials(error) {
            return false;
        }
        *retried = true;
        self.signer.current().refresh(sent).await
    }

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
                // AWS answers a request for a bucket of another region with a 301 that has no
                // Location; object_store reports it without its status.
                if status.is_none() && message.contains("redirect without LOCATION") {
                    return Failure::Fatal(Error::Storage {
                        path,
                        message: format!(
                            "the service redirected the request ({message}); an AWS bucket \
                             answers so when it is in another region than the one configured: \
                             set region to the bucket's"
                        ),
                    });
                }
                let cause = match status {
                    // A request the service rejects as such will be rejected again.
                    Some(code) if (400..500).contains(&code) && code != 408 && code != 429 => {
                        return Failure::Fatal(Error::Storage {
                            path,
                            message: format!("the service refused the request: {message}"),
                        })
                    }
                    // AWS answers 301 to a request sent to another region than the bucket's.
                    Some(code) if (300..400).contains(&code) => {
                        return Failure::Fatal(Error::Storage {
                            path,
                            message: format!(
                                "the service redirected the request ({message}); an AWS bucket \
                                 answers so when it is in another region than the one \
                                 configured: set region to the bucket's"
                            ),
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
        let mut retried = false;
        loop {
            let sent = Instant::now();
            let cause = match op().await {
                Ok(value) => return Ok(Some(value)),
                Err(e) if self.refreshed(&e, sent, &mut retried).await => continue,
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
