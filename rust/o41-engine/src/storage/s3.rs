//! S3-compatible object storage over the `object_store` crate.
//!
//! `object_store`'s own retries are turned off and its whole-request timeout disabled: a large
//! GET would otherwise be cut off by a timeout meant for small requests, and its retry budget
//! counts attempts and total time rather than failures in a row. The loops here resume a broken
//! body from the last received byte with `If-Match` on the `ETag` seen at open, so a replaced
//! object fails closed instead of splicing two versions.

use std::collections::HashMap;
use std::fmt;
use std::future::Future;
use std::ops::Range;
use std::sync::{Arc, Mutex, Once};

use bytes::{Bytes, BytesMut};
use futures::{FutureExt, StreamExt};
use object_store::aws::{AmazonS3, AmazonS3Builder, S3ConditionalPut};
use object_store::path::Path;
use object_store::{
    Attribute, Attributes, ClientOptions, GetOptions, GetRange, ObjectStore, PutMode, PutOptions,
    PutPayload, RetryConfig,
};
use tokio::runtime::Runtime;
use tokio::sync::mpsc;

use super::retry::{Attempts, RetryPolicy};
use super::{carry, sha256_hex, Object, Source, WriteMode, Written, CHECKSUM_METADATA_KEY};
use crate::cancel::Cancel;
use crate::error::{Error, Result};
use crate::metrics::{Meter, RetryCause};

/// Objects of this size or more cannot be written with one atomic request.
pub const MAX_PUT_BYTES: u64 = 5 << 30;

/// Byte pieces of an object with the offset of each, in order.
pub type Pieces = Vec<(u64, Bytes)>;

/// What a background fetch calls with its pieces once they are all in.
pub type Arrived = Option<Box<dyn FnOnce(&Pieces) + Send>>;

/// Chunks a remote reader may fetch ahead of its consumer.
const READ_AHEAD_CHUNKS: usize = 64;

/// Where and as whom to reach an S3-compatible service. `Debug` never shows the secrets.
#[derive(Clone)]
pub struct S3Settings {
    /// Endpoint URL, such as `https://t3.storage.dev` or `http://127.0.0.1:8333`.
    pub endpoint: String,
    /// Signing region (`auto` for services that ignore it).
    pub region: String,
    /// Access key id.
    pub access_key_id: String,
    /// Secret access key.
    pub secret_access_key: String,
    /// Session token of temporary credentials.
    pub session_token: Option<String>,
}

impl fmt::Debug for S3Settings {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "S3Settings({}, region {})", self.endpoint, self.region)
    }
}

/// The tokio runtime that drives requests, one per process: after a fork the child cannot use
/// the parent's runtime threads or pooled connections, so it builds its own.
fn runtime() -> &'static Runtime {
    static RUNTIME: Mutex<Option<(u32, &'static Runtime)>> = Mutex::new(None);
    let pid = std::process::id();
    let mut slot = RUNTIME
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    match *slot {
        Some((owner, runtime)) if owner == pid => runtime,
        _ => {
            let runtime: &'static Runtime = Box::leak(Box::new(
                tokio::runtime::Builder::new_multi_thread()
                    .worker_threads(2)
                    .thread_name("o41-io")
                    .enable_all()
                    .build()
                    .expect("the I/O runtime starts"),
            ));
            *slot = Some((pid, runtime));
            runtime
        }
    }
}

/// How often a wait on the network looks at its cancellation flag.
const CANCEL_POLL: std::time::Duration = std::time::Duration::from_millis(20);

/// Runs `work` to completion on the I/O runtime, or stops it (dropping the request and any
/// retry it is sleeping before) once `cancel` is set.
fn block_on<T>(cancel: &Cancel, what: &str, work: impl Future<Output = Result<T>>) -> Result<T> {
    runtime().block_on(async {
        tokio::select! {
            out = work => out,
            () = cancelled(cancel) => Err(Error::Cancelled { what: what.to_owned() }),
        }
    })
}

async fn cancelled(cancel: &Cancel) {
    while !cancel.is_cancelled() {
        tokio::time::sleep(CANCEL_POLL).await;
    }
}

/// Replaces credentials in text that came from the service or the client library.
#[derive(Clone)]
struct Scrubber(Arc<Vec<String>>);

impl Scrubber {
    fn clean(&self, text: &str) -> String {
        self.0.iter().fold(text.to_owned(), |out, secret| {
            out.replace(secret.as_str(), "<redacted>")
        })
    }
}

/// Whether a failed request without a status timed out (connect or read timeout), from the
/// error chain's text: `object_store` and `reqwest` keep their error kinds private.
fn is_timeout(error: &(dyn std::error::Error + 'static)) -> bool {
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
fn status_code(message: &str) -> Option<u16> {
    let (_, rest) = message.split_once("status code: ")?;
    rest.get(..3)?.parse().ok()
}

/// How one failed request is handled.
enum Failure {
    /// Fail closed with this error.
    Fatal(Error),
    /// The object already exists (a create-only write).
    Exists,
    /// Retry, counted under the cause; the text is what to report if retries run out.
    Transient(RetryCause, String),
}

#[derive(Clone)]
struct Context {
    policy: RetryPolicy,
    scrubber: Scrubber,
}

impl Context {
    fn classify(&self, uri: &str, error: object_store::Error) -> Failure {
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
    async fn retrying<T, F, Fut>(
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

/// A configured service: one client per bucket, built lazily in each process.
pub struct S3 {
    settings: S3Settings,
    context: Context,
    clients: Mutex<(u32, HashMap<String, Arc<AmazonS3>>)>,
}

impl fmt::Debug for S3 {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.settings.fmt(f)
    }
}

impl S3 {
    pub fn new(settings: S3Settings, policy: RetryPolicy) -> Result<Self> {
        let authority = settings
            .endpoint
            .split_once("://")
            .map_or("", |(_, rest)| rest.split('/').next().unwrap_or(""));
        if authority.contains('@') {
            // Not repeated in the message: the URL holds a secret.
            return Err(Error::config(
                "s3_base_url",
                "it carries credentials (user:password@host); pass them as access_key_id and \
                 secret_access_key",
            ));
        }
        if !(settings.endpoint.starts_with("http://") || settings.endpoint.starts_with("https://"))
        {
            return Err(Error::config(
                "s3_base_url",
                format!("'{}' is not an http:// or https:// URL", settings.endpoint),
            ));
        }
        for (option, value) in [
            ("region", &settings.region),
            ("access_key_id", &settings.access_key_id),
            ("secret_access_key", &settings.secret_access_key),
        ] {
            if value.is_empty() {
                return Err(Error::config(option, "must not be empty"));
            }
        }
        let secrets: Vec<String> = [
            Some(&settings.access_key_id),
            Some(&settings.secret_access_key),
            settings.session_token.as_ref(),
        ]
        .into_iter()
        .flatten()
        .filter(|s| !s.is_empty())
        .cloned()
        .collect();
        let s3 = S3 {
            settings,
            context: Context {
                policy,
                scrubber: Scrubber(Arc::new(secrets)),
            },
            clients: Mutex::new((0, HashMap::new())),
        };
        // Build one client now so a malformed setting fails here, not at the first read.
        s3.client("o41-settings-check")?;
        Ok(s3)
    }

    fn client(&self, bucket: &str) -> Result<Arc<AmazonS3>> {
        static CRYPTO: Once = Once::new();
        CRYPTO.call_once(|| {
            // Another library may have installed one already; either serves.
            let _ = rustls::crypto::ring::default_provider().install_default();
        });
        let pid = std::process::id();
        let mut clients = self
            .clients
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if clients.0 != pid {
            // Pooled connections belong to the process that opened them.
            *clients = (pid, HashMap::new());
        }
        if let Some(client) = clients.1.get(bucket) {
            return Ok(client.clone());
        }
        let policy = self.context.policy;
        let options = ClientOptions::new()
            .with_timeout_disabled()
            .with_connect_timeout(policy.connect_timeout)
            .with_read_timeout(policy.read_timeout)
            .with_allow_http(self.settings.endpoint.starts_with("http://"));
        let retry = RetryConfig {
            max_retries: 0,
            ..RetryConfig::default()
        };
        let mut builder = AmazonS3Builder::new()
            .with_endpoint(self.settings.endpoint.trim_end_matches('/'))
            .with_region(&self.settings.region)
            .with_bucket_name(bucket)
            .with_access_key_id(&self.settings.access_key_id)
            .with_secret_access_key(&self.settings.secret_access_key)
            .with_virtual_hosted_style_request(false)
            .with_conditional_put(S3ConditionalPut::ETagMatch)
            .with_retry(retry)
            .with_client_options(options);
        if let Some(token) = &self.settings.session_token {
            builder = builder.with_token(token);
        }
        let client = Arc::new(builder.build().map_err(|e| {
            Error::config("s3_base_url", self.context.scrubber.clean(&e.to_string()))
        })?);
        clients.1.insert(bucket.to_owned(), client.clone());
        Ok(client)
    }

    pub fn open(
        &self,
        uri: &str,
        bucket: &str,
        key: &str,
        cancel: &Cancel,
        meter: Option<&Arc<Meter>>,
    ) -> Result<Object> {
        let store = self.client(bucket)?;
        let path = Path::from(key);
        // A HEAD that also returns the object's metadata: the checksum the saver stored lets a
        // reader hold the object to the checksum its manifest lists.
        let head = block_on(
            cancel,
            uri,
            self.context.retrying(uri, meter, || {
                store.get_opts(
                    &path,
                    GetOptions {
                        head: true,
                        ..GetOptions::default()
                    },
                )
            }),
        )?
        .expect("reads never report an existing object");
        let sha256 = head
            .attributes
            .get(&Attribute::Metadata(CHECKSUM_METADATA_KEY.into()))
            .map(|stored| stored.as_ref().to_owned());
        let meta = head.meta;
        let mut object = self.object(uri, store, path, meta.size, meta.e_tag, cancel, meter);
        if let Source::Remote(remote) = &mut object.source {
            if let Some(inner) = Arc::get_mut(&mut remote.0) {
                inner.sha256 = sha256;
            }
        }
        Ok(object)
    }

    // The location in three parts, what is known of it, and the object's flag and meter.
    #[allow(clippy::too_many_arguments)]
    pub fn known(
        &self,
        uri: &str,
        bucket: &str,
        key: &str,
        size: u64,
        etag: &str,
        cancel: &Cancel,
        meter: Option<&Arc<Meter>>,
    ) -> Result<Object> {
        let store = self.client(bucket)?;
        Ok(self.object(
            uri,
            store,
            Path::from(key),
            size,
            Some(etag.to_owned()),
            cancel,
            meter,
        ))
    }

    // As `known`.
    #[allow(clippy::too_many_arguments)]
    fn object(
        &self,
        uri: &str,
        store: Arc<AmazonS3>,
        path: Path,
        size: u64,
        etag: Option<String>,
        cancel: &Cancel,
        meter: Option<&Arc<Meter>>,
    ) -> Object {
        Object {
            uri: uri.to_owned(),
            size,
            cancel: cancel.clone(),
            meter: meter.cloned(),
            source: Source::Remote(Remote(Arc::new(RemoteObject {
                uri: uri.to_owned(),
                store,
                path,
                etag,
                sha256: None,
                context: self.context.clone(),
                meter: meter.cloned(),
            }))),
        }
    }

    // The location comes in three parts like every other method here, plus what to write.
    #[allow(clippy::too_many_arguments)]
    pub fn write(
        &self,
        uri: &str,
        bucket: &str,
        key: &str,
        data: Bytes,
        sha256: &str,
        mode: WriteMode,
        cancel: &Cancel,
    ) -> Result<Written> {
        if data.len() as u64 >= MAX_PUT_BYTES {
            return Err(Error::Storage {
                path: uri.to_owned(),
                message: format!(
                    "{} bytes is at or over the 5 GiB limit of one atomic upload; split the data \
                     over more shards",
                    data.len()
                ),
            });
        }
        let store = self.client(bucket)?;
        let path = Path::from(key);
        let mut attributes = Attributes::new();
        attributes.insert(
            Attribute::Metadata(CHECKSUM_METADATA_KEY.into()),
            sha256.to_owned().into(),
        );
        let options = PutOptions {
            mode: match mode {
                WriteMode::CreateOnly => PutMode::Create,
                WriteMode::Overwrite => PutMode::Overwrite,
            },
            attributes,
            ..PutOptions::default()
        };
        let payload = PutPayload::from(data);
        let put = block_on(
            cancel,
            uri,
            self.context.retrying(uri, None, || {
                store.put_opts(&path, payload.clone(), options.clone())
            }),
        )?;
        if put.is_some() {
            return Ok(Written::Created);
        }
        // The location is taken, possibly by this very write whose answer was lost.
        let equal = self.checksum(uri, bucket, key, cancel)? == sha256;
        if equal {
            Ok(Written::AlreadyEqual)
        } else {
            Err(Error::Conflict {
                path: uri.to_owned(),
                message: "a different object already exists here; it is never replaced".into(),
            })
        }
    }

    pub fn checksum(&self, uri: &str, bucket: &str, key: &str, cancel: &Cancel) -> Result<String> {
        let object = self.open(uri, bucket, key, cancel, None)?;
        if let Some(stored) = object.stored_sha256() {
            return Ok(stored.to_owned());
        }
        Ok(sha256_hex(&object.read_range(0..object.size())?))
    }

    pub fn list(&self, uri: &str, bucket: &str, key: &str, cancel: &Cancel) -> Result<Vec<String>> {
        let store = self.client(bucket)?;
        let prefix = Path::from(key);
        let metas = block_on(
            cancel,
            uri,
            self.context.retrying(uri, None, || {
                store
                    .list(Some(&prefix))
                    .collect::<Vec<_>>()
                    .map(|all| all.into_iter().collect::<object_store::Result<Vec<_>>>())
            }),
        )?
        .expect("reads never report an existing object");
        Ok(metas
            .into_iter()
            .map(|m| format!("s3://{bucket}/{}", m.location))
            .collect())
    }
}

struct RemoteObject {
    uri: String,
    store: Arc<AmazonS3>,
    path: Path,
    /// The version every read of this object is pinned to.
    etag: Option<String>,
    /// The hex SHA-256 its writer stored in its metadata, as the HEAD that opened it reported.
    sha256: Option<String>,
    context: Context,
    /// Where retries of its reads are counted (its bytes are counted by the `Object`).
    meter: Option<Arc<Meter>>,
}

impl RemoteObject {
    /// Sends the bytes of `range` to `tx`, resuming from the last received byte after transient
    /// failures. Stops early, without error, when the receiver is gone.
    async fn stream_range(&self, range: Range<u64>, tx: mpsc::Sender<Bytes>) -> Result<()> {
        let mut pos = range.start;
        let mut attempts = Attempts::new(self.context.policy);
        while pos < range.end {
            let options = GetOptions {
                if_match: self.etag.clone(),
                range: Some(GetRange::Bounded(pos..range.end)),
                ..GetOptions::default()
            };
            let (kind, cause) = match self.store.get_opts(&self.path, options).await {
                Err(e) => match self.context.classify(&self.uri, e) {
                    Failure::Fatal(e) => return Err(e),
                    Failure::Exists => unreachable!("reads do not create"),
                    Failure::Transient(kind, cause) => (kind, cause),
                },
                Ok(result) => {
                    let mut body = result.into_stream();
                    loop {
                        match body.next().await {
                            Some(Ok(chunk)) => {
                                let take = (chunk.len() as u64).min(range.end - pos);
                                if take == 0 {
                                    continue;
                                }
                                pos += take;
                                attempts.progress();
                                if tx.send(chunk.slice(..take as usize)).await.is_err() {
                                    return Ok(());
                                }
                            }
                            Some(Err(e)) => match self.context.classify(&self.uri, e) {
                                Failure::Fatal(e) => return Err(e),
                                Failure::Exists => unreachable!("reads do not create"),
                                // A body that went silent timed out; any other break in it
                                // is an interrupted response, resumed from its last byte.
                                Failure::Transient(RetryCause::Timeout, cause) => {
                                    break (RetryCause::Timeout, cause)
                                }
                                Failure::Transient(_, cause) => {
                                    break (RetryCause::Interrupted, cause)
                                }
                            },
                            None if pos < range.end => {
                                break (
                                    RetryCause::Interrupted,
                                    format!(
                                        "the response ended at byte {pos}, before byte {}",
                                        range.end
                                    ),
                                )
                            }
                            None => return Ok(()),
                        }
                    }
                }
            };
            if let Some(meter) = &self.meter {
                meter.retry(kind);
            }
            match attempts.failed() {
                Ok(wait) => tokio::time::sleep(wait).await,
                Err(reason) => {
                    return Err(Error::Storage {
                        path: self.uri.clone(),
                        message: format!(
                            "{reason} while reading bytes {pos}..{}; last error: {cause}",
                            range.end
                        ),
                    })
                }
            }
        }
        Ok(())
    }

    /// The bytes of `range` as the pieces they arrived in, each with its offset.
    async fn pieces(&self, range: Range<u64>) -> Result<Pieces> {
        let (tx, mut rx) = mpsc::channel::<Bytes>(READ_AHEAD_CHUNKS);
        let gather = async {
            let mut pieces = Vec::new();
            let mut at = range.start;
            while let Some(chunk) = rx.recv().await {
                let len = chunk.len() as u64;
                pieces.push((at, chunk));
                at += len;
            }
            pieces
        };
        let (done, pieces) = tokio::join!(self.stream_range(range.clone(), tx), gather);
        done?;
        Ok(pieces)
    }

    async fn collect(&self, range: Range<u64>) -> Result<Bytes> {
        let mut pieces = self.pieces(range.clone()).await?;
        // One response chunk is the common case for small ranges: hand it over without a copy.
        if pieces.len() == 1 {
            return Ok(pieces.pop().expect("one piece").1);
        }
        let mut out = BytesMut::with_capacity((range.end - range.start) as usize);
        for (_, piece) in pieces {
            out.extend_from_slice(&piece);
        }
        Ok(out.freeze())
    }
}

/// The pieces of every range, fetched concurrently, in range order.
async fn all_pieces(object: Arc<RemoteObject>, ranges: Vec<Range<u64>>) -> Result<Pieces> {
    let all = futures::future::join_all(ranges.iter().map(|r| object.pieces(r.clone()))).await;
    let mut out = Vec::new();
    for pieces in all {
        out.extend(pieces?);
    }
    Ok(out)
}

/// A background fetch; dropping it cancels the fetch.
pub struct PendingPieces(Option<tokio::task::JoinHandle<Result<Pieces>>>);

impl PendingPieces {
    /// Waits for the fetch to finish; dropping the wait (cancellation) aborts the fetch.
    pub fn wait(mut self, uri: &str, cancel: &Cancel) -> Result<Pieces> {
        let handle = self.0.take().expect("waited once");
        let abort = handle.abort_handle();
        let result = block_on(cancel, uri, async {
            handle.await.map_err(|e| Error::Storage {
                path: uri.to_owned(),
                message: format!("the background read stopped: {e}"),
            })?
        });
        abort.abort();
        result
    }
}

impl Drop for PendingPieces {
    fn drop(&mut self) {
        if let Some(handle) = self.0.take() {
            handle.abort();
        }
    }
}

/// The remote half of an [`Object`].
pub struct Remote(Arc<RemoteObject>);

impl Remote {
    pub fn version(&self) -> Option<&str> {
        self.0.etag.as_deref()
    }

    /// The hex SHA-256 stored in the object's metadata when it was written, if any.
    pub fn stored_sha256(&self) -> Option<&str> {
        self.0.sha256.as_deref()
    }

    pub fn read_range(&self, range: Range<u64>, cancel: &Cancel) -> Result<Bytes> {
        if range.is_empty() {
            return Ok(Bytes::new());
        }
        block_on(cancel, &self.0.uri, self.0.collect(range))
    }

    pub fn read_pieces(&self, ranges: &[Range<u64>], cancel: &Cancel) -> Result<Pieces> {
        block_on(
            cancel,
            &self.0.uri,
            all_pieces(self.0.clone(), ranges.to_vec()),
        )
    }

    /// Starts fetching `ranges` in the background; `arrived` sees the pieces as soon as they
    /// are all in, before anyone waits for them.
    pub fn spawn_pieces(&self, ranges: Vec<Range<u64>>, arrived: Arrived) -> PendingPieces {
        let object = self.0.clone();
        PendingPieces(Some(runtime().spawn(async move {
            let pieces = all_pieces(object, ranges).await;
            if let (Ok(pieces), Some(arrived)) = (&pieces, arrived) {
                arrived(pieces);
            }
            pieces
        })))
    }

    /// A blocking reader of `range` whose bytes are fetched ahead by a background task; its
    /// waits stop once `cancel` is set.
    pub fn reader(&self, range: Range<u64>, cancel: Cancel) -> RemoteReader {
        let (tx, rx) = mpsc::channel(READ_AHEAD_CHUNKS);
        let (err_tx, err_rx) = std::sync::mpsc::sync_channel(1);
        let object = self.0.clone();
        let task = runtime().spawn(async move {
            if let Err(e) = object.stream_range(range, tx).await {
                let _ = err_tx.send(e);
            }
        });
        RemoteReader {
            uri: self.0.uri.clone(),
            rx,
            errors: err_rx,
            current: Bytes::new(),
            task,
            cancel,
        }
    }
}

/// Blocking `Read` over a background fetch; dropping it stops the fetch.
pub struct RemoteReader {
    uri: String,
    rx: mpsc::Receiver<Bytes>,
    errors: std::sync::mpsc::Receiver<Error>,
    current: Bytes,
    task: tokio::task::JoinHandle<()>,
    cancel: Cancel,
}

impl std::io::Read for RemoteReader {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        while self.current.is_empty() {
            let rx = &mut self.rx;
            let next =
                block_on(&self.cancel, &self.uri, async { Ok(rx.recv().await) }).map_err(carry)?;
            match next {
                Some(chunk) => self.current = chunk,
                // The fetch has ended; its error, if any, is sent before the task finishes.
                None => {
                    return match self.errors.recv() {
                        Ok(e) => Err(carry(e)),
                        Err(_) => Ok(0),
                    }
                }
            }
        }
        let n = buf.len().min(self.current.len());
        buf[..n].copy_from_slice(&self.current[..n]);
        let _ = self.current.split_to(n);
        Ok(n)
    }
}

impl Drop for RemoteReader {
    fn drop(&mut self) {
        self.task.abort();
    }
}

#[cfg(test)]
mod tests {
    use super::status_code;

    #[test]
    fn reads_status_codes_from_messages() {
        let message = "Error performing GET http://h/b/k in 1ms - Server returned non-2xx status \
                       code: 400 Bad Request: <Error/>";
        assert_eq!(status_code(message), Some(400));
        assert_eq!(status_code("connection reset"), None);
    }
}
