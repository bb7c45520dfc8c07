//! Where objects live: local paths and `s3://bucket/key` locations behind one interface that the
//! shard readers, manifests and the dataset saver share.
//!
//! Reads of remote objects are pinned to the `ETag` seen when the object was opened and recover
//! from transient failures by re-requesting from the last received byte (`docs/storage.md`).
//! Writes that publish something are create-only: an equal object already there counts as done,
//! a different one is a [`Error::Conflict`].

mod local;
pub mod promise;
mod retry;
mod s3;

use std::fmt;
use std::io::Read;
use std::ops::Range;
use std::sync::Arc;
use std::time::Instant;

use bytes::Bytes;

use crate::cancel::Cancel;
use crate::error::{Error, Result};
use crate::metrics::Meter;

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

/// A parsed location.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Location<'a> {
    /// A path on the local file system.
    Local(&'a str),
    /// An object in an S3-compatible bucket.
    S3 {
        /// Bucket name.
        bucket: &'a str,
        /// Object key within the bucket.
        key: &'a str,
    },
}

impl<'a> Location<'a> {
    /// Parses `uri`: `s3://bucket/key` or a local path.
    pub fn parse(uri: &'a str) -> Result<Self> {
        let Some(rest) = uri.strip_prefix("s3://") else {
            if uri.contains("://") {
                return Err(Error::Storage {
                    path: uri.to_owned(),
                    message: "unsupported scheme; use a local path or s3://bucket/key".into(),
                });
            }
            return Ok(Location::Local(uri));
        };
        match rest.split_once('/') {
            Some((bucket, key)) if !bucket.is_empty() && !key.is_empty() => {
                Ok(Location::S3 { bucket, key })
            }
            _ => Err(Error::Storage {
                path: uri.to_owned(),
                message: "an s3:// location needs a bucket and a key: s3://bucket/key".into(),
            }),
        }
    }
}

/// True when `uri` names an object in S3 rather than a local path.
pub fn is_remote(uri: &str) -> bool {
    uri.starts_with("s3://")
}

/// The one spelling of a location every layer compares and stores: an `s3://` location as it is,
/// a local path made absolute (against the working directory) with `.` and `..` resolved
/// lexically, never above the root. Symbolic links are not followed: the path names the link,
/// so the same file reached through two links is two locations (`docs/storage.md`).
pub fn normalize(location: &str) -> String {
    if is_remote(location) {
        return location.to_owned();
    }
    let absolute = std::path::absolute(std::path::Path::new(location)).map_or_else(
        |_| location.to_owned(),
        |p| p.to_string_lossy().into_owned(),
    );
    if !absolute.starts_with('/') {
        return absolute;
    }
    // Resolved against the root, whose directory part is empty: `/a/./b/../c` gives `/a/c`.
    let resolved = sibling("/", &absolute[1..]);
    if resolved.is_empty() {
        "/".to_owned()
    } else {
        resolved
    }
}

#[cfg(test)]
mod normalize_tests {
    use super::normalize;

    #[test]
    fn local_paths_are_absolute_and_lexically_resolved() {
        assert_eq!(normalize("/data/./a/../b.parquet"), "/data/b.parquet");
        assert_eq!(normalize("/../../x"), "/x");
        assert_eq!(normalize("/"), "/");
        assert_eq!(normalize("s3://bucket/a/../b"), "s3://bucket/a/../b");
        let here = std::env::current_dir().unwrap();
        assert_eq!(
            normalize("sub/../a.msgpack"),
            format!("{}/a.msgpack", here.display())
        );
    }
}

/// Joins a location relative to the directory of `base` (a manifest's location).
pub fn sibling(base: &str, relative: &str) -> String {
    if is_remote(relative) || relative.starts_with('/') {
        return relative.to_owned();
    }
    let dir = base.rsplit_once('/').map_or("", |(dir, _)| dir);
    let mut parts: Vec<&str> = dir.split('/').collect();
    // Never climb above `s3://bucket` (three parts) or the root directory (one empty part).
    let floor = if is_remote(base) { 3 } else { 1 };
    for part in relative.split('/') {
        match part {
            "" | "." => {}
            ".." => {
                if parts.len() > floor {
                    parts.pop();
                }
            }
            other => parts.push(other),
        }
    }
    parts.join("/")
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

/// What identifies an object's content, as first seen: its size and version, and for a local
/// file its inode.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Pin {
    /// Size in bytes.
    pub size: u64,
    /// `ETag`, or a local file's `mtime:<ns>`.
    pub version: Option<String>,
    /// A local file's inode.
    pub inode: Option<u64>,
}

/// Fails closed when `now` is not the object `then` described.
fn compare_pins(uri: &str, then: &Pin, now: &Pin) -> Result<()> {
    let changed = |what: String| {
        Err(Error::Storage {
            path: uri.to_owned(),
            message: format!(
                "the object changed since the stream opened it ({what}); the stream stops instead \
                 of mixing two versions"
            ),
        })
    };
    if then.size != now.size {
        return changed(format!("{} bytes, now {}", then.size, now.size));
    }
    if let (Some(a), Some(b)) = (&then.version, &now.version) {
        if a != b {
            return changed(format!("version {a}, now {b}"));
        }
    }
    if let (Some(a), Some(b)) = (then.inode, now.inode) {
        if a != b {
            return changed(format!("inode {a}, now {b}: another file"));
        }
    }
    Ok(())
}

/// An object opened for reading.
pub struct Object {
    uri: String,
    size: u64,
    source: Source,
    /// Reads of this object stop once it is set.
    cancel: Cancel,
    /// Where its reads are counted, if anywhere.
    meter: Option<Arc<Meter>>,
}

enum Source {
    Local(local::LocalFile),
    Remote(s3::Remote),
}

impl fmt::Debug for Object {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Object({}, {} bytes)", self.uri, self.size)
    }
}

impl Object {
    /// Location the object was opened from.
    pub fn uri(&self) -> &str {
        &self.uri
    }

    /// Size in bytes.
    pub fn size(&self) -> u64 {
        self.size
    }

    /// The flag this object's reads obey.
    pub fn cancel(&self) -> &Cancel {
        &self.cancel
    }

    /// The version reads are pinned to: a remote object's `ETag`, a local file's modification
    /// time (`mtime:<ns>`). A checkpoint stores it, so a resumed stream reads the same bytes.
    pub fn version(&self) -> Option<&str> {
        match &self.source {
            Source::Local(file) => Some(&file.version),
            Source::Remote(remote) => remote.version(),
        }
    }

    /// A local file's inode: checked while a stream runs (a file replaced under the same name,
    /// even with its size and modification time kept, is another file), but not stored in
    /// checkpoints, so that shards copied to another machine with their times resume.
    pub fn inode(&self) -> Option<u64> {
        match &self.source {
            Source::Local(file) => Some(file.inode),
            Source::Remote(_) => None,
        }
    }

    /// When a local file's status last changed (`ctime`, in nanoseconds): a write, a rename or
    /// a `touch` moves it, and no copy keeps it. None for remote objects.
    pub fn local_ctime_ns(&self) -> Result<Option<i128>> {
        match &self.source {
            Source::Local(file) => local::ctime_ns(&self.uri, &file.file).map(Some),
            Source::Remote(_) => Ok(None),
        }
    }

    /// Fails closed when the object is no longer the one `pin` describes.
    pub fn expect(&self, pin: &Pin) -> Result<()> {
        compare_pins(&self.uri, pin, &self.pin())
    }

    /// Fails closed when a local file changed since it was opened (written in place, or
    /// replaced under its name): one `fstat` of the open handle, cheap enough for every read.
    /// Remote reads need no such check: each request is pinned to the `ETag`.
    pub fn verify_unchanged(&self) -> Result<()> {
        let Source::Local(file) = &self.source else {
            return Ok(());
        };
        compare_pins(
            &self.uri,
            &self.pin(),
            &local::current_pin(&self.uri, &file.file)?,
        )
    }

    /// What identifies this object: reads through [`Storage::open_pinned`] fail closed on any
    /// other.
    pub fn pin(&self) -> Pin {
        Pin {
            size: self.size,
            version: self.version().map(str::to_owned),
            inode: self.inode(),
        }
    }

    /// The hex SHA-256 its writer stored with a remote object (`x-amz-meta-o41-sha256`, as the
    /// dataset saver writes), read with the object's size and version; None for local files.
    pub fn stored_sha256(&self) -> Option<&str> {
        match &self.source {
            Source::Remote(remote) => remote.stored_sha256(),
            Source::Local(_) => None,
        }
    }

    /// The open local file, when the object is local (the Parquet reader's fast path, which
    /// counts its reads into [`Object::meter`]).
    pub fn local_file(&self) -> Option<&Arc<std::fs::File>> {
        match &self.source {
            Source::Local(file) => Some(&file.file),
            Source::Remote(_) => None,
        }
    }

    /// Where this object's reads are counted, if anywhere.
    pub fn meter(&self) -> Option<&Arc<Meter>> {
        self.meter.as_ref()
    }

    /// Counts `bytes` received by a read that started at `since`.
    fn count(&self, bytes: u64, since: Instant) {
        if let Some(meter) = &self.meter {
            meter.read(bytes, since);
        }
    }

    /// The bytes of `range`.
    pub fn read_range(&self, range: Range<u64>) -> Result<Bytes> {
        self.check_range(&range)?;
        let since = Instant::now();
        let bytes = match &self.source {
            Source::Local(file) => local::read_range(&self.uri, &file.file, range),
            Source::Remote(remote) => remote.read_range(range, &self.cancel),
        }?;
        self.count(bytes.len() as u64, since);
        Ok(bytes)
    }

    /// The bytes of `range`, into `buf`: a reader that reads job after job reuses one buffer
    /// instead of asking the allocator (and the kernel, for fresh pages) each time.
    pub fn read_range_into(&self, range: Range<u64>, buf: &mut Vec<u8>) -> Result<()> {
        self.check_range(&range)?;
        let since = Instant::now();
        let len = (range.end - range.start) as usize;
        match &self.source {
            Source::Local(file) => {
                buf.resize(len, 0);
                std::os::unix::fs::FileExt::read_exact_at(&*file.file, buf, range.start)
                    .map_err(|e| Error::io(&self.uri, e))?;
            }
            Source::Remote(remote) => {
                let bytes = remote.read_range(range, &self.cancel)?;
                buf.clear();
                buf.extend_from_slice(&bytes);
            }
        }
        self.count(len as u64, since);
        Ok(())
    }

    /// The bytes of `ranges` as pieces `(offset, bytes)` that together cover each range
    /// exactly, in order. Remote ranges are fetched concurrently and kept in the pieces they
    /// arrived in, so no range is copied into one buffer.
    pub fn read_pieces(&self, ranges: &[Range<u64>]) -> Result<Pieces> {
        for range in ranges {
            self.check_range(range)?;
        }
        let since = Instant::now();
        let pieces: Pieces = match &self.source {
            Source::Local(file) => ranges
                .iter()
                .map(|r| {
                    Ok((
                        r.start,
                        local::read_range(&self.uri, &file.file, r.clone())?,
                    ))
                })
                .collect::<Result<_>>(),
            Source::Remote(remote) => remote.read_pieces(ranges, &self.cancel),
        }?;
        self.count(pieces_len(&pieces), since);
        Ok(pieces)
    }

    /// Starts fetching `ranges` of a remote object in the background (see
    /// [`Object::read_pieces`]), calling `arrived` with the pieces once they are in; None for
    /// local files, which are read when needed.
    pub fn spawn_pieces(&self, ranges: Vec<Range<u64>>, arrived: Arrived) -> Option<PendingPieces> {
        match &self.source {
            Source::Local(_) => None,
            Source::Remote(remote) => Some(PendingPieces {
                uri: self.uri.clone(),
                inner: remote.spawn_pieces(ranges, arrived),
                cancel: self.cancel.clone(),
                meter: self.meter.clone(),
            }),
        }
    }

    /// A reader of the bytes from `offset` to the end. Remote readers fetch ahead of the caller
    /// and recover from transient failures; their errors carry the engine error, which
    /// [`from_io`] recovers.
    pub fn reader(&self, offset: u64) -> Result<Box<dyn Read + Send>> {
        let inner: Box<dyn Read + Send> = match &self.source {
            Source::Local(_) => local::reader(&self.uri, offset)?,
            Source::Remote(remote) => {
                Box::new(remote.reader(offset..self.size, self.cancel.clone()))
            }
        };
        Ok(match &self.meter {
            Some(meter) => Box::new(Metered {
                inner,
                meter: meter.clone(),
            }),
            None => inner,
        })
    }

    fn check_range(&self, range: &Range<u64>) -> Result<()> {
        if range.start > range.end || range.end > self.size {
            return Err(Error::Storage {
                path: self.uri.clone(),
                message: format!(
                    "byte range {}..{} is outside the object's {} bytes",
                    range.start, range.end, self.size
                ),
            });
        }
        Ok(())
    }
}

/// Pieces of a remote object being fetched ahead of their reader; dropping it cancels the fetch.
pub struct PendingPieces {
    uri: String,
    inner: s3::PendingPieces,
    cancel: Cancel,
    meter: Option<Arc<Meter>>,
}

impl PendingPieces {
    /// Waits for the fetch; the pieces are as [`Object::read_pieces`] returns them. Only the
    /// wait counts as waiting: the fetch ran while the caller did other work.
    pub fn wait(self) -> Result<Pieces> {
        let since = Instant::now();
        let pieces = self.inner.wait(&self.uri, &self.cancel)?;
        if let Some(meter) = &self.meter {
            meter.read(pieces_len(&pieces), since);
        }
        Ok(pieces)
    }
}

fn pieces_len(pieces: &Pieces) -> u64 {
    pieces.iter().map(|(_, b)| b.len() as u64).sum()
}

/// A reader that counts what it returns, and the time it waited for it, into a [`Meter`].
pub struct Metered<R> {
    inner: R,
    meter: Arc<Meter>,
}

impl<R> Metered<R> {
    /// Counts the reads of `inner` into `meter`.
    pub fn new(inner: R, meter: Arc<Meter>) -> Self {
        Metered { inner, meter }
    }
}

impl<R: Read> Read for Metered<R> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let since = Instant::now();
        let n = self.inner.read(buf)?;
        self.meter.read(n as u64, since);
        Ok(n)
    }
}

/// A reader that tallies the bytes it returns and adds them to a [`Meter`] when dropped,
/// without timing: for readers called many times for a few bytes each (a Parquet decoder
/// parsing page headers from a local file), where a clock reading and a shared atomic per call
/// would cost more than the read. Such readers live for one column chunk of one read job.
pub struct Tallied<R> {
    inner: R,
    meter: Arc<Meter>,
    bytes: u64,
}

impl<R> Tallied<R> {
    /// Tallies the reads of `inner` for `meter`.
    pub fn new(inner: R, meter: Arc<Meter>) -> Self {
        Tallied {
            inner,
            meter,
            bytes: 0,
        }
    }
}

impl<R: Read> Read for Tallied<R> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let n = self.inner.read(buf)?;
        self.bytes += n as u64;
        Ok(n)
    }
}

impl<R> Drop for Tallied<R> {
    fn drop(&mut self) {
        self.meter.bytes(self.bytes);
    }
}

/// An engine error carried through `std::io::Read`, which only speaks `io::Error`.
#[derive(Debug)]
struct Carried(Error);

impl fmt::Display for Carried {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

impl std::error::Error for Carried {}

/// Wraps an engine error for a `std::io::Read` implementation; [`from_io`] unwraps it.
pub fn carry(error: Error) -> std::io::Error {
    std::io::Error::other(Carried(error))
}

/// Turns an `io::Error` from an [`Object::reader`] back into the engine error it carries, or
/// into `otherwise(e)` when it is a plain I/O or decoding failure.
pub fn from_io(e: std::io::Error, otherwise: impl FnOnce(std::io::Error) -> Error) -> Error {
    if e.get_ref()
        .is_some_and(<dyn std::error::Error + Send + Sync>::is::<Carried>)
    {
        let inner = e.into_inner().expect("checked above");
        return inner.downcast::<Carried>().expect("checked above").0;
    }
    otherwise(e)
}

/// Hex SHA-256 of `data`.
pub fn sha256_hex(data: &[u8]) -> String {
    hex(ring::digest::digest(&ring::digest::SHA256, data).as_ref())
}

/// Lower-case hex of `bytes`.
pub fn hex(bytes: &[u8]) -> String {
    use std::fmt::Write;
    bytes
        .iter()
        .fold(String::with_capacity(2 * bytes.len()), |mut out, b| {
            let _ = write!(out, "{b:02x}");
            out
        })
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
