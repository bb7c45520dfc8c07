//! Who S3 requests are signed as, kept current over a run of weeks.
//!
//! Three kinds of source: fixed keys; the standard AWS chain (environment, web identity token
//! file, shared config and credentials files, container and instance metadata), resolved at the
//! first request so that a process serving local paths only never looks; and a caller's function
//! returning temporary credentials with their expiry. Credentials with an expiry are fetched again
//! before it. After the service refuses a request's credentials, the request is retried once with
//! credentials fetched anew (`Signer::refresh`). Every secret fetched is taught to the scrubber
//! before it is used, so no message can carry it.

use std::fmt;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use object_store::aws::{AmazonS3Builder, AmazonS3ConfigKey, AwsCredential, AwsCredentialProvider};
use object_store::{ClientOptions, CredentialProvider, RetryConfig};

use super::chain_files::{self, FileFault, MAX_TOKEN_FILE};
use super::keys::{check_keys, Credentials, FetchCredentials, TemporaryCredentials};
use super::process::CredentialProcess;
use super::profiles::{chain_source, ChainSource};
use super::scrub::Scrubber;

/// How long before expiry credentials are fetched again: five minutes, or half their lifetime
/// when that is shorter (a provider handing out two-minute credentials is refreshed after one).
const REFRESH_MARGIN: Duration = Duration::from_secs(300);

/// The source once the chain has been looked at.
enum Resolved {
    Fixed(Arc<AwsCredential>),
    Fetch(Arc<dyn FetchCredentials>),
    /// A profile's `credential_process`, run again before expiry like a caller's function.
    Process(Arc<CredentialProcess>),
    /// One of `object_store`'s own providers (web identity, container, instance metadata); it
    /// caches and refreshes by itself, and is built anew to force a fetch.
    Delegated {
        what: String,
        keys: Vec<(AmazonS3ConfigKey, String)>,
        /// The token files it reads, with the settings that name them.
        files: Vec<(String, String)>,
        provider: AwsCredentialProvider,
    },
}

struct Cached {
    credential: Arc<AwsCredential>,
    refresh_at: Option<SystemTime>,
}

#[derive(Default)]
struct State {
    source: Option<Resolved>,
    cached: Option<Cached>,
    // Until one fetch has worked, a failure is a setup fault and fails the request at once; after,
    // it is a passing fault of the service and the request's retries take it.
    fetched_once: bool,
    /// When a refusal last dropped what was fetched.
    refreshed: Option<Instant>,
}

/// The credential provider every bucket's client of one storage object signs with.
pub(super) struct Signer {
    credentials: Credentials,
    region: String,
    options: ClientOptions,
    scrubber: Scrubber,
    state: tokio::sync::Mutex<State>,
}

impl fmt::Debug for Signer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Signer({:?})", self.credentials)
    }
}

fn credential(c: &TemporaryCredentials) -> Arc<AwsCredential> {
    Arc::new(AwsCredential {
        key_id: c.access_key_id.clone(),
        secret_key: c.secret_access_key.clone(),
        token: c.session_token.clone(),
    })
}

fn refresh_at(expiry: Option<SystemTime>) -> Option<SystemTime> {
    let expiry = expiry?;
    let left = expiry.duration_since(SystemTime::now()).unwrap_or_default();
    Some(expiry - REFRESH_MARGIN.min(left / 2))
}

fn refused(what: &str, message: &str) -> object_store::Error {
    object_store::Error::Unauthenticated {
        path: what.to_owned(),
        source: message.to_owned().into(),
    }
}

fn passing(message: &str) -> object_store::Error {
    object_store::Error::Generic {
        store: "S3",
        source: message.to_owned().into(),
    }
}

/// A failed fetch from `what`: until one fetch has worked (`first`), a setup fault that fails
/// the request at once; after, a passing fault of the service that its retries take.
fn failure(first: bool, what: &str, message: &str) -> object_store::Error {
    if first {
        refused(what, message)
    } else {
        passing(message)
    }
}

impl Signer {
    pub(super) fn new(
        credentials: Credentials,
        region: &str,
        options: ClientOptions,
        scrubber: Scrubber,
    ) -> Self {
        if let Credentials::Static(keys) = &credentials {
            scrubber.learn(&credential(keys));
        }
        Signer {
            credentials,
            region: region.to_owned(),
            options,
            scrubber,
            state: tokio::sync::Mutex::new(State::default()),
        }
    }

    /// A signer with the same settings and nothing fetched: after a fork the child must not
    /// share a lock or a cache with a thread of the parent that does not exist in it.
    pub(super) fn fresh(&self) -> Self {
        Signer::new(
            self.credentials.clone(),
            &self.region,
            self.options.clone(),
            self.scrubber.clone(),
        )
    }

    fn resolve(&self) -> std::result::Result<Resolved, object_store::Error> {
        let profile = match &self.credentials {
            Credentials::Static(keys) => return Ok(Resolved::Fixed(credential(keys))),
            Credentials::Provider(source) => return Ok(Resolved::Fetch(source.clone())),
            Credentials::Chain { profile } => profile.as_deref(),
        };
        let found = chain_source(profile).map_err(|e| {
            refused(
                "the AWS credential chain",
                &self.scrubber.clean(&e.to_string()),
            )
        })?;
        Ok(match found {
            ChainSource::Keys(keys) => {
                check_keys(&keys)
                    .map_err(|e| refused("the AWS credential chain", &e.to_string()))?;
                let keys = credential(&keys);
                self.scrubber.learn(&keys);
                Resolved::Fixed(keys)
            }
            ChainSource::Process(process) => Resolved::Process(Arc::new(process)),
            ChainSource::Delegated { what, keys, files } => Resolved::Delegated {
                provider: self.delegated(&what, &keys)?,
                what,
                keys,
                files,
            },
        })
    }

    fn delegated(
        &self,
        what: &str,
        keys: &[(AmazonS3ConfigKey, String)],
    ) -> std::result::Result<AwsCredentialProvider, object_store::Error> {
        // The engine's loops retry a failed fetch (after the first has worked), as they retry
        // every request; object_store's own retries would only stretch the wait.
        let retry = RetryConfig {
            max_retries: 0,
            ..RetryConfig::default()
        };
        let mut builder = AmazonS3Builder::new()
            .with_bucket_name("o41-credentials")
            .with_region(&self.region)
            .with_retry(retry)
            .with_client_options(self.options.clone());
        for (key, value) in keys {
            builder = builder.with_config(*key, value);
        }
        let store = builder
            .build()
            .map_err(|e| refused(what, &self.scrubber.clean(&e.to_string())))?;
        Ok(store.credentials().clone())
    }

    async fn fetch(
        &self,
        state: &mut State,
    ) -> std::result::Result<Arc<AwsCredential>, object_store::Error> {
        if state.source.is_none() {
            state.source = Some(self.resolve()?);
        }
        let first = !state.fetched_once;
        let got = match state.source.as_ref().expect("resolved above") {
            Resolved::Fixed(credential) => return Ok(credential.clone()),
            source @ (Resolved::Fetch(_) | Resolved::Process(_)) => {
                if let Some(cached) = &state.cached {
                    if cached.refresh_at.is_none_or(|at| SystemTime::now() < at) {
                        return Ok(cached.credential.clone());
                    }
                }
                let (fetched, who) = match source {
                    Resolved::Fetch(source) => {
                        let source = source.clone();
                        let fetched = tokio::task::spawn_blocking(move || source.fetch())
                            .await
                            .map_err(|e| {
                                passing(&format!("the credential provider did not return: {e}"))
                            })?;
                        (fetched, "credential provider")
                    }
                    // Dropping this future (the request was cancelled) kills the helper.
                    Resolved::Process(process) => {
                        (process.clone().fetch().await, "AWS credential chain")
                    }
                    _ => unreachable!("matched above"),
                };
                let fetched = fetched
                    .and_then(|keys| check_keys(&keys).map(|()| keys))
                    .map_err(|e| {
                        failure(
                            first,
                            "credential_provider",
                            // A helper's stderr is in there: no secret learnt may show.
                            &self.scrubber.clean(&format!("the {who} failed: {e}")),
                        )
                    })?;
                let credential = credential(&fetched);
                self.scrubber.learn(&credential);
                state.cached = Some(Cached {
                    credential: credential.clone(),
                    refresh_at: refresh_at(fetched.expiry),
                });
                Ok(credential)
            }
            Resolved::Delegated {
                what,
                provider,
                files,
                ..
            } => {
                let fail = |message: String| {
                    failure(
                        first,
                        what,
                        &format!("{what}: {}", self.scrubber.clean(&message)),
                    )
                };
                // `object_store` reads these whole, blocking, at its next exchange: only a
                // small regular file may reach it.
                for (setting, path) in files {
                    match chain_files::check(
                        std::path::Path::new(path),
                        "token file",
                        MAX_TOKEN_FILE,
                    ) {
                        Ok(()) => {}
                        Err(FileFault::Refused(message)) => {
                            return Err(fail(format!("{setting} {message}")))
                        }
                        Err(FileFault::Missing) => {
                            return Err(fail(format!("{setting} {path} does not exist")))
                        }
                        Err(FileFault::Io(e)) => {
                            return Err(fail(format!("{setting} {path}: {e}")))
                        }
                    }
                }
                let got = provider
                    .get_credential()
                    .await
                    .map_err(|e| fail(e.to_string()))?;
                self.scrubber.learn(&got);
                let keys = TemporaryCredentials {
                    access_key_id: got.key_id.clone(),
                    secret_access_key: got.secret_key.clone(),
                    // An empty token is none: sent as an empty header, some services refuse it.
                    session_token: got.token.clone().filter(|t| !t.is_empty()),
                    expiry: None,
                };
                // The signer puts these in headers and panics on what a header cannot hold.
                check_keys(&keys).map_err(|e| fail(e.to_string()))?;
                Ok(if keys.session_token == got.token {
                    got
                } else {
                    credential(&keys)
                })
            }
        };
        if got.is_ok() {
            state.fetched_once = true;
        }
        got
    }

    /// Drops what was fetched so that the next request fetches anew, unless a refusal of a
    /// request sent no earlier than this one's (`sent`) did so already: the many requests in
    /// flight when keys are revoked cost one fetch. False when nothing can be fetched anew, so a
    /// refused request is not worth repeating.
    pub(super) async fn refresh(&self, sent: Instant) -> bool {
        let mut state = self.state.lock().await;
        let state = &mut *state;
        // Times of sending and of refreshing, not of fetching: the credentials a request is
        // refused with may have been fetched for that very request, after it was "sent".
        if state.refreshed.is_some_and(|at| at >= sent) {
            return true;
        }
        match &mut state.source {
            None | Some(Resolved::Fixed(_)) => return false,
            Some(Resolved::Fetch(_) | Resolved::Process(_)) => state.cached = None,
            Some(Resolved::Delegated {
                what,
                keys,
                provider,
                ..
            }) => {
                let (what, keys) = (what.clone(), keys.clone());
                match self.delegated(&what, &keys) {
                    Ok(fresh) => *provider = fresh,
                    Err(_) => return false,
                }
            }
        }
        state.refreshed = Some(Instant::now());
        true
    }
}

#[async_trait::async_trait]
impl CredentialProvider for Signer {
    type Credential = AwsCredential;

    async fn get_credential(&self) -> object_store::Result<Arc<AwsCredential>> {
        let mut state = self.state.lock().await;
        self.fetch(&mut state).await
    }
}

/// The signer of the current process, made anew in a forked child.
pub(super) struct SignerSlot(Mutex<(u32, Arc<Signer>)>);

impl SignerSlot {
    pub(super) fn new(signer: Signer) -> Self {
        SignerSlot(Mutex::new((std::process::id(), Arc::new(signer))))
    }

    pub(super) fn current(&self) -> Arc<Signer> {
        let pid = std::process::id();
        let mut slot = self
            .0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if slot.0 != pid {
            *slot = (pid, Arc::new(slot.1.fresh()));
        }
        slot.1.clone()
    }
}
