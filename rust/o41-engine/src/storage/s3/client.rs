//! The S3 client: settings, requests (heads, ranged gets, create-only puts), and their retries.

use std::collections::HashMap;
use std::fmt;
use std::sync::{Arc, Mutex, Once};

use bytes::Bytes;
use futures::{FutureExt, StreamExt};
use object_store::aws::{AmazonS3, AmazonS3Builder, S3ConditionalPut};
use object_store::path::Path;
use object_store::{
    Attribute, Attributes, ClientOptions, GetOptions, ObjectStore, PutMode, PutOptions, PutPayload,
    RetryConfig,
};

use super::errors::{Context, Scrubber};
use super::resumable::{Remote, RemoteObject};
use super::runtime::block_on;
use crate::cancel::Cancel;
use crate::error::{Error, Result};
use crate::metrics::Meter;
use crate::storage::retry::RetryPolicy;
use crate::storage::{sha256_hex, Object, Source, WriteMode, Written, CHECKSUM_METADATA_KEY};

/// Objects of this size or more cannot be written with one atomic request.
pub const MAX_PUT_BYTES: u64 = 5 << 30;

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

/// A configured service: one client per bucket, built lazily in each process.
pub struct S3 {
    pub(super) settings: S3Settings,
    pub(super) context: Context,
    pub(super) clients: Mutex<(u32, HashMap<String, Arc<AmazonS3>>)>,
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
        // object_store unwraps its own parse of the endpoint when it signs a request: a URL it
        // cannot parse (`http://[x]:9`) would panic an engine thread. Not echoed: it may hold a
        // secret.
        match url::Url::parse(&settings.endpoint) {
            Ok(parsed) if parsed.host_str().is_some_and(|h| !h.is_empty()) => {}
            Ok(_) => return Err(Error::config("s3_base_url", "the URL names no host")),
            Err(e) => {
                return Err(Error::config(
                    "s3_base_url",
                    format!("not a valid URL ({e})"),
                ))
            }
        }
        for (option, value) in [
            ("region", Some(&settings.region)),
            ("access_key_id", Some(&settings.access_key_id)),
            ("secret_access_key", Some(&settings.secret_access_key)),
            ("session_token", settings.session_token.as_ref()),
        ] {
            let Some(value) = value else { continue };
            if value.is_empty() && option != "session_token" {
                return Err(Error::config(option, "must not be empty"));
            }
            // They travel in HTTP headers, which hold visible ASCII only; object_store panics
            // on anything else (a CR/LF pasted with a key). Not echoed: most are secrets.
            if let Some(at) = value.bytes().position(|b| !b.is_ascii_graphic()) {
                return Err(Error::config(
                    option,
                    format!(
                        "byte {at} is not visible ASCII (a space, newline or control \
                         character, or non-ASCII text); credentials and regions are printable \
                         ASCII only"
                    ),
                ));
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

    pub(super) fn client(&self, bucket: &str) -> Result<Arc<AmazonS3>> {
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
    pub(super) fn object(
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
