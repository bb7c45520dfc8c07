//! Location algebra: a location parsed as local or `s3://`, one spelling of each, and a
//! location relative to another.

use crate::error::{Error, Result};

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
