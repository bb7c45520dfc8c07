//! Where objects live: local paths and `s3://bucket/key` locations behind one interface that the
//! shard readers, manifests and the dataset saver share.
//!
//! Reads of remote objects are pinned to the `ETag` seen when the object was opened and recover
//! from transient failures by re-requesting from the last received byte (`docs/storage.md`).
//! Writes that publish something are create-only: an equal object already there counts as done,
//! a different one is a [`Error::Conflict`].
//!
//! This module is the facade ([`Storage`]); `path` holds the location algebra, `object` an
//! opened object and its pin, `metered` the counting readers, `hash` the digests, `local` and
//! `s3` the two backends, `retry` and `promise` what reads are held to.

mod hash;
mod local;
mod metered;
mod object;
mod path;
pub mod promise;
mod retry;
mod s3;

use std::fmt;
use std::io::Read;
use std::sync::Arc;

use bytes::Bytes;

use crate::cancel::Cancel;
use crate::error::{Error, Result};
use crate::metrics::Meter;

pub use hash::{hex, sha256_hex};
pub use metered::{carry, from_io, Metered, Tallied};
use object::Source;
pub use object::{Object, PendingPieces, Pin};
pub use path::{is_remote, normalize, sibling, Location};
pub use retry::RetryPolicy;
pub use s3::{Arrived, Credentials, FetchCredentials, Pieces, S3Settings, TemporaryCredentials};

/// User metadata key under which a create-only write stores the SHA-256 of its content, so a
/// retried write that finds its own earlier success can tell it from a conflicting object.
pub const CHECKSUM_METADATA_KEY: &str = "o41-sha256";

/// How a write treats an object already at its location.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WriteMode {
    /// Never replace: an equal object counts as written, a different one is a conflict.
    CreateOnly,
    /// Replace whatever is there.
    Overwrite,
}

/// What a write did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Written {
    /// The object was written.
    Created,
    /// An identical object was already there (a repeated or retried publication).
    AlreadyEqual,
}

/// Storage settings shared by every object a stream, saver or manifest touches. Cheap to clone.
///
/// A storage value carries the [`Cancel`] flag its reads obey; [`Storage::with_cancel`] gives a
/// pipeline or a blocking call its own, so stopping one stops only its reads. It may also carry
/// a [`Meter`] ([`Storage::with_meter`]) that the objects it opens count their reads and retries
/// into: a stream gives each source its own.
#[derive(Clone, Default)]
pub struct Storage {
    s3: Option<Arc<s3::S3>>,
    cancel: Cancel,
    meter: Option<Arc<Meter>>,
}

impl fmt::Debug for Storage {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.s3 {
            Some(s3) => write!(f, "Storage({s3:?})"),
            None => f.write_str("Storage(local)"),
        }
    }
}

impl Storage {
    /// Local paths only: an `s3://` location fails with a config error naming the missing settings.
    pub fn local() -> Self {
        Storage::default()
    }

    /// Local paths and `s3://` locations on the S3-compatible service `settings` describes.
    pub fn with_s3(settings: S3Settings, policy: RetryPolicy) -> Result<Self> {
        Ok(Storage {
            s3: Some(Arc::new(s3::S3::new(settings, policy)?)),
            cancel: Cancel::new(),
            meter: None,
        })
    }

    /// The same settings, with reads and waits that stop once `cancel` is set.
    #[must_use]
    pub fn with_cancel(&self, cancel: Cancel) -> Storage {
        Storage {
            s3: self.s3.clone(),
            cancel,
            meter: self.meter.clone(),
        }
    }

    /// The same settings and flag, with reads and retries counted into `meter`.
    #[must_use]
    pub fn with_meter(&self, meter: Arc<Meter>) -> Storage {
        Storage {
            s3: self.s3.clone(),
            cancel: self.cancel.clone(),
            meter: Some(meter),
        }
    }

    /// The same settings and flag, counting nowhere.
    #[must_use]
    pub fn without_meter(&self) -> Storage {
        Storage {
            s3: self.s3.clone(),
            cancel: self.cancel.clone(),
            meter: None,
        }
    }

    /// The flag this storage's reads obey.
    pub fn cancel(&self) -> &Cancel {
        &self.cancel
    }

    fn s3(&self, uri: &str) -> Result<&s3::S3> {
        self.s3.as_deref().ok_or_else(|| {
            Error::config(
                "storage",
                format!(
                    "{uri} is in object storage, but no storage settings were given; open it \
                     through TrainingData(s3_base_url=..., region=..., access_key_id=..., \
                     secret_access_key=...)"
                ),
            )
        })
    }

    /// Fails at open when `uri` cannot be served by these settings.
    pub fn check(&self, uri: &str) -> Result<()> {
        if let Location::S3 { .. } = Location::parse(uri)? {
            self.s3(uri)?;
        }
        Ok(())
    }

    /// Opens `uri` for reading: its size, and for remote objects the version reads are pinned to.
    pub fn open(&self, uri: &str) -> Result<Object> {
        let mut object = match Location::parse(uri)? {
            Location::Local(path) => local::open(path, &self.cancel)?,
            Location::S3 { bucket, key } => {
                self.s3(uri)?
                    .open(uri, bucket, key, &self.cancel, self.meter.as_ref())?
            }
        };
        object.meter.clone_from(&self.meter);
        Ok(object)
    }

    /// Opens `uri`, already seen as `pin`. A remote object is not asked for again: its reads
    /// are pinned to the `ETag`, so a replaced object fails closed at its first read. A local
    /// file is opened and compared (size, modification time, inode) before any byte is read.
    pub fn open_pinned(&self, uri: &str, pin: &Pin) -> Result<Object> {
        if let (Location::S3 { bucket, key }, Some(version)) =
            (Location::parse(uri)?, pin.version.as_deref())
        {
            let mut object = self.s3(uri)?.known(
                uri,
                bucket,
                key,
                pin.size,
                version,
                &self.cancel,
                self.meter.as_ref(),
            )?;
            object.meter.clone_from(&self.meter);
            return Ok(object);
        }
        let object = self.open(uri)?;
        object.expect(pin)?;
        Ok(object)
    }

    /// The whole content of `uri`.
    pub fn read(&self, uri: &str) -> Result<Bytes> {
        let object = self.open(uri)?;
        object.read_range(0..object.size())
    }

    /// Writes `data` to `uri`. `sha256` is the hex digest of `data`; create-only writes store it
    /// with the object and compare it when the location is taken.
    pub fn write(&self, uri: &str, data: Bytes, sha256: &str, mode: WriteMode) -> Result<Written> {
        match Location::parse(uri)? {
            Location::Local(path) => local::write(path, &data, mode, sha256),
            Location::S3 { bucket, key } => {
                self.s3(uri)?
                    .write(uri, bucket, key, data, sha256, mode, &self.cancel)
            }
        }
    }

    /// Writes the local file `source` to `uri` (see [`Storage::write`]). Local targets are linked,
    /// not copied, when `source` is on the same file system.
    pub fn write_file(
        &self,
        uri: &str,
        source: &str,
        sha256: &str,
        mode: WriteMode,
    ) -> Result<Written> {
        match Location::parse(uri)? {
            Location::Local(path) => local::write_file(path, source, mode, sha256),
            Location::S3 { bucket, key } => {
                let data = std::fs::read(source).map_err(|e| Error::io(source, e))?;
                self.s3(uri)?.write(
                    uri,
                    bucket,
                    key,
                    Bytes::from(data),
                    sha256,
                    mode,
                    &self.cancel,
                )
            }
        }
    }

    /// Hex SHA-256 of the object at `uri`. Remote objects written by [`Storage::write`] carry it
    /// as metadata, so it is not recomputed from their bytes.
    pub fn checksum(&self, uri: &str) -> Result<String> {
        match Location::parse(uri)? {
            Location::Local(path) => local::checksum(path, &self.cancel),
            Location::S3 { bucket, key } => self.s3(uri)?.checksum(uri, bucket, key, &self.cancel),
        }
    }

    /// Hex SHA-256 of the bytes of `uri` as they are now, always computed from its content (a
    /// verification, unlike [`Storage::checksum`], never trusts stored metadata). Reads are pinned
    /// to the version seen at open.
    pub fn content_sha256(&self, uri: &str) -> Result<String> {
        let object = self.open(uri)?;
        let mut reader = object.reader(0)?;
        let mut context = ring::digest::Context::new(&ring::digest::SHA256);
        let mut buf = vec![0u8; 1 << 20];
        loop {
            self.cancel.check(uri)?;
            let n = reader
                .read(&mut buf)
                .map_err(|e| from_io(e, |e| Error::io(uri, e)))?;
            if n == 0 {
                break;
            }
            context.update(&buf[..n]);
        }
        Ok(hex(context.finish().as_ref()))
    }

    /// Every object under the directory `prefix` (a local directory or an `s3://` prefix), as
    /// full locations in lexicographic order; empty when there is none.
    pub fn list(&self, prefix: &str) -> Result<Vec<String>> {
        let mut found = match Location::parse(prefix)? {
            Location::Local(path) => local::list(path)?,
            Location::S3 { bucket, key } => {
                self.s3(prefix)?.list(prefix, bucket, key, &self.cancel)?
            }
        };
        found.sort();
        Ok(found)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_locations() {
        assert_eq!(
            Location::parse("s3://b/k/x.parquet").unwrap(),
            Location::S3 {
                bucket: "b",
                key: "k/x.parquet"
            }
        );
        assert_eq!(Location::parse("/a/b").unwrap(), Location::Local("/a/b"));
        assert!(Location::parse("s3://bucket").is_err());
        assert!(Location::parse("s3:///key").is_err());
        assert!(Location::parse("gs://b/k").is_err());
    }

    #[test]
    fn joins_relative_locations() {
        assert_eq!(
            sibling("s3://b/run/m.json", "train/x"),
            "s3://b/run/train/x"
        );
        assert_eq!(sibling("s3://b/run/m.json", "../y"), "s3://b/y");
        assert_eq!(sibling("s3://b/m.json", "../../y"), "s3://b/y");
        assert_eq!(sibling("s3://b/m.json", "s3://c/z"), "s3://c/z");
        assert_eq!(sibling("/d/run/m.json", "./a/b"), "/d/run/a/b");
        assert_eq!(sibling("/d/run/m.json", "/abs"), "/abs");
    }

    #[test]
    fn hashes() {
        assert_eq!(
            sha256_hex(b"abc"),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
    }

    #[test]
    fn carried_errors_come_back() {
        let e = carry(Error::NotFound { path: "x".into() });
        assert!(matches!(
            from_io(e, |_| unreachable!()),
            Error::NotFound { .. }
        ));
        let plain = std::io::Error::other("boom");
        assert!(matches!(
            from_io(plain, |e| Error::io("p", e)),
            Error::Io { .. }
        ));
    }
}
