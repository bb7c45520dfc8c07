//! The S3 client: settings, requests (heads, ranged gets, create-only puts), and their retries.

use std::collections::HashMap;
use std::fmt;
use std::sync::{Arc, Mutex, Once};

use bytes::Bytes;
use futures::{FutureExt, StreamExt};
use object_store::aws::{AmazonS3, AmazonS3Builder, S3ConditionalPut};
use object_store::path::Path;
use object_store::{
    Attribute, Attributes, Certificate, ClientOptions, GetOptions, ObjectStore, PutMode,
    PutOptions, PutPayload, RetryConfig,
};

use super::credentials::{Signer, SignerSlot};
use super::errors::Context;
use super::keys::{check_keys, Credentials};
use super::resumable::{Remote, RemoteObject};
use super::runtime::block_on;
use super::scrub::Scrubber;
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
    /// Endpoint URL, such as `https://t3.storage.dev` or `http://127.0.0.1:8333`; `None` for AWS
    /// S3 itself, at its default endpoint for `region`.
    pub endpoint: Option<String>,
    /// Signing region (`auto` for services that ignore it).
    pub region: String,
    /// Where the credentials come from.
    pub credentials: Credentials,
    /// PEM certificates to trust besides the system's (a private CA in front of the service,
    /// its STS or its metadata endpoint).
    pub ca_bundle: Option<Vec<u8>>,
}

impl fmt::Debug for S3Settings {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.endpoint {
            Some(endpoint) => write!(f, "S3Settings({endpoint}, region {})", self.region),
            None => write!(f, "S3Settings(AWS, region {})", self.region),
        }
    }
}

/// A configured service: one client per bucket, built lazily in each process.
pub struct S3 {
    pub(super) settings: S3Settings,
    pub(super) context: Context,
    /// Timeouts, TLS roots and whether plain HTTP is allowed: every client's, and the signer's.
    pub(super) options: ClientOptions,
    pub(super) clients: Mutex<(u32, HashMap<String, Arc<AmazonS3>>)>,
}

impl fmt::Debug for S3 {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.settings.fmt(f)
    }
}

/// Whether AWS can serve `bucket` as a host name (`bucket.s3.region.amazonaws.com`), as its SDKs
/// prefer; a name with dots would not match the service's TLS certificate, so it goes in the path.
pub(super) fn virtual_hosted(bucket: &str) -> bool {
    (3..=63).contains(&bucket.len())
        && bucket
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && !bucket.starts_with('-')
        && !bucket.ends_with('-')
}

fn check_endpoint(endpoint: &str) -> Result<()> {
    let authority = endpoint
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
    if !(endpoint.starts_with("http://") || endpoint.starts_with("https://")) {
        return Err(Error::config(
            "s3_base_url",
            format!("'{endpoint}' is not an http:// or https:// URL"),
        ));
    }
    // object_store unwraps its own parse of the endpoint when it signs a request: a URL it
    // cannot parse (`http://[x]:9`) would panic an engine thread. Not echoed: it may hold a
    // secret.
    match url::Url::parse(endpoint) {
        Ok(parsed) if parsed.host_str().is_some_and(|h| !h.is_empty()) => Ok(()),
        Ok(_) => Err(Error::config("s3_base_url", "the URL names no host")),
        Err(e) => Err(Error::config(
            "s3_base_url",
            format!("not a valid URL ({e})"),
        )),
    }
}

impl S3 {
    pub fn new(settings: S3Settings, policy: RetryPolicy) -> Result<Self> {
        if let Some(endpoint) = &settings.endpoint {
            check_endpoint(endpoint)?;
        }
        if settings.region.is_empty() {
            return Err(Error::config("region", "must not be empty"));
        }
        if let Some(at) = settings.region.bytes().position(|b| !b.is_ascii_graphic()) {
            return Err(Error::config(
                "region",
                format!("byte {at} is not visible ASCII; regions are printable ASCII only"),
            ));
        }
        if let Credentials::Static(keys) = &settings.credentials {
            check_keys(keys)?;
        }
        let mut options = ClientOptions::new()
            .with_timeout_disabled()
            .with_connect_timeout(policy.connect_timeout)
            .with_read_timeout(policy.read_timeout)
            .with_allow_http(
                settings
                    .endpoint
                    .as_deref()
                    .is_some_and(|e| e.starts_with("http://")),
            );
        if let Some(pem) = &settings.ca_bundle {
            for certificate in Certificate::from_pem_bundle(pem)
                .map_err(|e| Error::config("ca_bundle", format!("not PEM certificates ({e})")))?
            {
                options = options.with_root_certificate(certificate);
            }
        }
        let scrubber = Scrubber::default();
        let signer = Signer::new(
            settings.credentials.clone(),
            &settings.region,
            options.clone(),
            scrubber.clone(),
        );
        let s3 = S3 {
            settings,
            context: Context {
                policy,
                scrubber,
                signer: Arc::new(SignerSlot::new(signer)),
            },
            options,
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
        let retry = RetryConfig {
            max_retries: 0,
            ..RetryConfig::default()
        };
        let mut builder = AmazonS3Builder::new()
            .with_region(&self.settings.region)
            .with_bucket_name(bucket)
            .with_credentials(self.context.signer.current())
            .with_conditional_put(S3ConditionalPut::ETagMatch)
            .with_retry(retry)
            .with_client_options(self.options.clone());
        builder = match &self.settings.endpoint {
            Some(endpoint) => builder
                .with_endpoint(endpoint.trim_end_matches('/'))
                .with_virtual_hosted_style_request(false),
            None => builder.with_virtual_hosted_style_request(virtual_hosted(bucket)),
        };
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
