//! What a stream was told about a shard before reading it, and the check of an object against it.
//!
//! It sits beside storage, below the config (a checkpoint's resolved document makes promises) and
//! the formats (each shard is held to its promise when first inspected).

use std::borrow::Cow;

use super::Pin;
use crate::encoding::Encoding;
use crate::error::{Error, Result};

/// What a local shard's content identity starts with (`formats::identity`): a resolved
/// document's version of a local file, compared by content rather than by time.
pub const CONTENT_PREFIX: &str = "content:";

/// What a stream was told about a shard before reading it: by a manifest (rows, size) or by a
/// checkpoint (rows, and the version or size it pinned). The shard is held to it when it is
/// first inspected, and fails closed there, naming the shard and the promise it broke. Its
/// strings borrow from the document that made it where they can: a resumed million-shard stream
/// does not copy every shard's version.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Promise<'a> {
    /// Who promised: [`PromiseOrigin::Manifest`] or [`PromiseOrigin::Checkpoint`].
    pub origin: PromiseOrigin,
    /// Records in the shard.
    pub rows: u64,
    /// Size of the shard object in bytes, where known.
    pub bytes: Option<u64>,
    /// The object's version (`ETag`, a local file's `mtime:<ns>`), where known.
    pub version: Option<Cow<'a, str>>,
    /// The hex SHA-256 of the shard's bytes, where known (a manifest's `sha256:` checksum).
    /// Held against the checksum the writer stored with an object, where storage keeps one.
    pub sha256: Option<Cow<'a, str>>,
}

/// Where a [`Promise`] comes from, which decides how a broken one is reported.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PromiseOrigin {
    /// A data manifest's entry: a shard that differs is not the shard the manifest lists.
    Manifest,
    /// A dataset directory's own index (an MDS `index.json`), which lists each shard's size and
    /// records as a manifest does: a shard that differs is not the shard the index lists.
    Index,
    /// A checkpoint's resolved document: the file list changed since the checkpoint.
    Checkpoint,
    /// What open saw of a plain file list (size, version, and rows from the inspection cache):
    /// the file changed while the stream ran.
    Listing,
}

impl PromiseOrigin {
    /// Whether the promise counts a shard's records as written (a manifest or a dataset's
    /// index), rather than the rows a stream made of them (windows, records kept).
    pub fn counts_records(self) -> bool {
        matches!(self, PromiseOrigin::Manifest | PromiseOrigin::Index)
    }
}

impl Promise<'_> {
    /// Refuses an object whose size or version is not the promised one, before reading it. A
    /// promised content identity ([`CONTENT_PREFIX`]) is held against `content`, the local
    /// file's identity now (called only then; None for a remote object), so that a copy with
    /// the same bytes and other times is the same shard.
    pub fn check_pin(
        &self,
        path: &str,
        encoding: Encoding,
        pin: &Pin,
        content: impl FnOnce() -> Result<Option<String>>,
    ) -> Result<()> {
        if let Some(bytes) = self.bytes.filter(|&b| b != pin.size) {
            let now = pin.size;
            let message = match self.origin {
                PromiseOrigin::Manifest => {
                    format!("the manifest lists {bytes} bytes, the shard is {now} bytes")
                }
                PromiseOrigin::Index => {
                    format!("its dataset's index lists {bytes} bytes, the shard is {now} bytes")
                }
                PromiseOrigin::Checkpoint => format!(
                    "{path} is {now} bytes, but the checkpoint's stream read it at {bytes}; the \
                     file list changed"
                ),
                PromiseOrigin::Listing => format!(
                    "the object changed since the stream opened it ({bytes} bytes, now {now}); \
                     the stream stops instead of mixing two versions"
                ),
            };
            return Err(self.broken(path, encoding, message));
        }
        let Some(then) = self.version.as_deref() else {
            return Ok(());
        };
        let identity = if then.starts_with(CONTENT_PREFIX) {
            content()?
        } else {
            None
        };
        if let Some(now) = identity.as_deref().or(pin.version.as_deref()) {
            if then != now {
                let message = match self.origin {
                    PromiseOrigin::Checkpoint if identity.is_some() => format!(
                        "{path} changed since the checkpoint was taken (its content was {then}, \
                         now {now}); a resumed stream must read the bytes the original read"
                    ),
                    PromiseOrigin::Checkpoint => format!(
                        "{path} changed since the checkpoint was taken (version {then}, now \
                         {now}); a resumed stream must read the bytes the original read{}",
                        if then.starts_with("mtime:") {
                            " (this checkpoint was taken by a release that knew local files by \
                             their modification time only)"
                        } else {
                            ""
                        }
                    ),
                    PromiseOrigin::Manifest | PromiseOrigin::Index => format!(
                        "{path} changed since the manifest was read (version {then}, now {now})"
                    ),
                    PromiseOrigin::Listing => format!(
                        "the object changed since the stream opened it (version {then}, now \
                         {now}); the stream stops instead of mixing two versions"
                    ),
                };
                return Err(self.broken(path, encoding, message));
            }
        }
        Ok(())
    }

    /// Refuses an object whose writer stored another checksum than the promised one: the same
    /// size and row count, other bytes. Objects without a stored checksum are not refused.
    pub fn check_stored_sha256(
        &self,
        path: &str,
        encoding: Encoding,
        stored: Option<&str>,
    ) -> Result<()> {
        match (self.sha256.as_deref(), stored) {
            (Some(promised), Some(stored)) if !promised.eq_ignore_ascii_case(stored) => {
                let message = match self.origin {
                    PromiseOrigin::Manifest | PromiseOrigin::Index => format!(
                        "the manifest lists checksum sha256:{promised}, the object was stored with \
                         sha256:{stored}; it is not the shard the manifest lists"
                    ),
                    PromiseOrigin::Checkpoint => format!(
                        "{path} was stored with checksum sha256:{stored}, but the checkpoint's \
                         stream read sha256:{promised}; the file list changed"
                    ),
                    PromiseOrigin::Listing => format!(
                        "the object changed since the stream opened it (checksum \
                         sha256:{promised}, now sha256:{stored}); the stream stops instead of \
                         mixing two versions"
                    ),
                };
                Err(self.broken(path, encoding, message))
            }
            _ => Ok(()),
        }
    }

    /// Refuses a shard that does not hold the promised number of records.
    pub fn check_rows(&self, path: &str, encoding: Encoding, rows: u64) -> Result<()> {
        if rows == self.rows {
            return Ok(());
        }
        let message = match self.origin {
            PromiseOrigin::Checkpoint => format!(
                "{path} now holds {rows} rows, but the checkpoint's stream read it with {}; the \
                 file list changed",
                self.rows
            ),
            PromiseOrigin::Manifest => format!(
                "the manifest lists {} rows, the shard holds {rows}",
                self.rows
            ),
            PromiseOrigin::Index => format!(
                "its dataset's index lists {} records, the shard holds {rows}",
                self.rows
            ),
            PromiseOrigin::Listing => format!(
                "the object changed since the stream opened it: it holds {rows} rows, {} when \
                 it was counted (the inspection cache knows a file by its size, modification \
                 time and inode, and all three were kept); the stream stops instead of mixing \
                 two versions",
                self.rows
            ),
        };
        Err(self.broken(path, encoding, message))
    }

    /// A manifest's broken promise is a shard that is not what the dataset says (malformed);
    /// a checkpoint's is a resume that cannot be exact; open's, a file changed under the stream.
    fn broken(&self, path: &str, encoding: Encoding, message: String) -> Error {
        match self.origin {
            PromiseOrigin::Checkpoint => Error::Checkpoint { message },
            PromiseOrigin::Listing => Error::Storage {
                path: path.to_owned(),
                message,
            },
            PromiseOrigin::Manifest | PromiseOrigin::Index => Error::Format {
                path: path.to_owned(),
                encoding: encoding.name(),
                row: None,
                message,
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn promise(version: &str) -> Promise<'_> {
        Promise {
            origin: PromiseOrigin::Checkpoint,
            rows: 1,
            bytes: Some(10),
            version: Some(Cow::Borrowed(version)),
            sha256: None,
        }
    }

    fn local(mtime: &str) -> Pin {
        Pin {
            size: 10,
            version: Some(mtime.to_owned()),
            inode: Some(3),
        }
    }

    #[test]
    fn a_content_promise_is_held_to_the_content_not_the_times() {
        let pinned = promise("content:highway128:00ff");
        let now = local("mtime:2");
        let same = || Ok(Some("content:highway128:00ff".to_owned()));
        assert!(pinned
            .check_pin("/d/a", Encoding::Jsonl, &now, same)
            .is_ok());
        let other = || Ok(Some("content:highway128:0100".to_owned()));
        let refused = pinned.check_pin("/d/a", Encoding::Jsonl, &now, other);
        let message = refused.unwrap_err().to_string();
        assert!(
            message.contains("/d/a changed since the checkpoint was taken"),
            "{message}"
        );
        assert!(!message.contains("cp -p"), "{message}");
    }

    #[test]
    fn an_older_time_promise_is_held_to_the_time_without_hashing() {
        let pinned = promise("mtime:1");
        let hashed = || -> Result<Option<String>> { panic!("a time promise needs no hash") };
        assert!(pinned
            .check_pin("/d/a", Encoding::Jsonl, &local("mtime:1"), hashed)
            .is_ok());
        let refused = pinned.check_pin("/d/a", Encoding::Jsonl, &local("mtime:2"), hashed);
        let message = refused.unwrap_err().to_string();
        assert!(message.contains("modification time only"), "{message}");
    }
}
