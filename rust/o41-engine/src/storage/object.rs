//! An object opened for reading: its pin (what identifies its content as first seen), its
//! reads, local or remote, and the pieces fetched ahead of their reader.

use std::fmt;
use std::io::Read;
use std::ops::Range;
use std::sync::Arc;
use std::time::Instant;

use bytes::Bytes;

use super::{local, s3, Arrived, Metered, Pieces};
use crate::cancel::Cancel;
use crate::error::{Error, Result};
use crate::metrics::Meter;

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
    pub(super) uri: String,
    pub(super) size: u64,
    pub(super) source: Source,
    /// Reads of this object stop once it is set.
    pub(super) cancel: Cancel,
    /// Where its reads are counted, if anywhere.
    pub(super) meter: Option<Arc<Meter>>,
}

/// Where an object's bytes come from.
pub(super) enum Source {
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
            Some(meter) => Box::new(Metered::new(inner, meter.clone())),
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
