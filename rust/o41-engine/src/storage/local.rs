//! Local files. Create-only writes go through a temporary file in the target's directory and a
//! hard link, which fails instead of replacing an existing file, so a crash never leaves a
//! half-written object at the target.

use std::fs::File;
use std::io::{Read, Seek, SeekFrom, Write};
use std::ops::Range;
use std::os::unix::fs::{FileExt, MetadataExt};
use std::path::Path;
use std::sync::Arc;

use bytes::Bytes;

use super::{sha256_hex, Object, Pin, Source, WriteMode, Written};
use crate::cancel::Cancel;
use crate::error::{Error, Result};

pub fn open(path: &str, cancel: &Cancel) -> Result<Object> {
    // Before opening: opening a FIFO for reading blocks until a writer comes, and a device
    // such as /dev/zero is endless.
    let kind = std::fs::metadata(path).map_err(|e| Error::io(path, e))?;
    if !kind.is_file() {
        return Err(Error::Storage {
            path: path.to_owned(),
            message: "not a regular file (a directory, device or pipe); shards and manifests \
                      must be files"
                .to_owned(),
        });
    }
    let file = File::open(path).map_err(|e| Error::io(path, e))?;
    // Identity from the open handle, so it describes the bytes this object reads.
    let pin = current_pin(path, &file)?;
    Ok(Object {
        uri: path.to_owned(),
        size: pin.size,
        source: Source::Local(LocalFile {
            file: Arc::new(file),
            version: pin.version.unwrap_or_default(),
            inode: pin.inode.unwrap_or_default(),
        }),
        cancel: cancel.clone(),
        meter: None,
    })
}

/// What identifies the open file now: size, modification time and inode.
pub fn current_pin(path: &str, file: &File) -> Result<Pin> {
    let metadata = file.metadata().map_err(|e| Error::io(path, e))?;
    Ok(Pin {
        size: metadata.len(),
        version: Some(format!("mtime:{}", mtime_ns(&metadata))),
        inode: Some(metadata.ino()),
    })
}

/// An open local file and what identifies it.
pub struct LocalFile {
    /// The open handle.
    pub file: Arc<File>,
    /// `mtime:<ns>`: changes when the file is written or replaced (unless a copy keeps it).
    pub version: String,
    /// The inode: another file under the same name has another.
    pub inode: u64,
}

/// The open file's status-change time in nanoseconds since the epoch.
pub fn ctime_ns(path: &str, file: &File) -> Result<i128> {
    let metadata = file.metadata().map_err(|e| Error::io(path, e))?;
    Ok(i128::from(metadata.ctime()) * 1_000_000_000 + i128::from(metadata.ctime_nsec()))
}

/// Modification time in nanoseconds since the epoch (negative before it).
fn mtime_ns(metadata: &std::fs::Metadata) -> i128 {
    i128::from(metadata.mtime()) * 1_000_000_000 + i128::from(metadata.mtime_nsec())
}

pub fn read_range(path: &str, file: &File, range: Range<u64>) -> Result<Bytes> {
    let mut buf = vec![0u8; (range.end - range.start) as usize];
    file.read_exact_at(&mut buf, range.start)
        .map_err(|e| Error::io(path, e))?;
    Ok(Bytes::from(buf))
}

pub fn reader(path: &str, offset: u64) -> Result<Box<dyn Read + Send>> {
    // A handle of its own (not a clone, which would share the offset), so readers of one
    // object do not move each other's position.
    let mut handle = File::open(path).map_err(|e| Error::io(path, e))?;
    handle
        .seek(SeekFrom::Start(offset))
        .map_err(|e| Error::io(path, e))?;
    Ok(Box::new(handle))
}

fn temp_beside(target: &Path) -> Result<(std::path::PathBuf, File)> {
    let dir = target.parent().unwrap_or_else(|| Path::new("."));
    std::fs::create_dir_all(dir).map_err(|e| Error::io(&dir.to_string_lossy(), e))?;
    let name = target
        .file_name()
        .map_or_else(String::new, |n| n.to_string_lossy().into_owned());
    for attempt in 0u32.. {
        let tmp = dir.join(format!(".tmp-{}-{attempt}-{name}", std::process::id()));
        match File::options().write(true).create_new(true).open(&tmp) {
            Ok(file) => return Ok((tmp, file)),
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
            Err(e) => return Err(Error::io(&tmp.to_string_lossy(), e)),
        }
    }
    unreachable!("the attempt counter does not run out")
}

/// Publishes `tmp` at `path`, then removes `tmp` whatever happened.
fn publish(tmp: &Path, path: &str, mode: WriteMode, sha256: &str) -> Result<Written> {
    let result = match mode {
        WriteMode::Overwrite => std::fs::rename(tmp, path)
            .map(|()| Written::Created)
            .map_err(|e| Error::io(path, e)),
        WriteMode::CreateOnly => match std::fs::hard_link(tmp, path) {
            Ok(()) => Ok(Written::Created),
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => compare(path, sha256),
            Err(e) => Err(Error::io(path, e)),
        },
    };
    let _ = std::fs::remove_file(tmp);
    result
}

fn compare(path: &str, sha256: &str) -> Result<Written> {
    let existing = std::fs::read(path).map_err(|e| Error::io(path, e))?;
    if sha256_hex(&existing) == sha256 {
        Ok(Written::AlreadyEqual)
    } else {
        Err(Error::Conflict {
            path: path.to_owned(),
            message: "a different object already exists here; it is never replaced".into(),
        })
    }
}

pub fn write(path: &str, data: &[u8], mode: WriteMode, sha256: &str) -> Result<Written> {
    let (tmp, mut file) = temp_beside(Path::new(path))?;
    let written = file
        .write_all(data)
        .and_then(|()| file.sync_all())
        .map_err(|e| Error::io(path, e));
    drop(file);
    if let Err(e) = written {
        let _ = std::fs::remove_file(&tmp);
        return Err(e);
    }
    publish(&tmp, path, mode, sha256)
}

pub fn write_file(path: &str, source: &str, mode: WriteMode, sha256: &str) -> Result<Written> {
    let (tmp, file) = temp_beside(Path::new(path))?;
    drop(file);
    // A link shares the bytes when both are on one file system; otherwise copy them.
    let _ = std::fs::remove_file(&tmp);
    if std::fs::hard_link(source, &tmp).is_err() {
        if let Err(e) = std::fs::copy(source, &tmp) {
            let _ = std::fs::remove_file(&tmp);
            return Err(Error::io(source, e));
        }
    }
    publish(&tmp, path, mode, sha256)
}

pub fn checksum(path: &str, cancel: &Cancel) -> Result<String> {
    let mut file = File::open(path).map_err(|e| Error::io(path, e))?;
    let mut context = ring::digest::Context::new(&ring::digest::SHA256);
    let mut buf = vec![0u8; 1 << 20];
    loop {
        cancel.check(path)?;
        let n = file.read(&mut buf).map_err(|e| Error::io(path, e))?;
        if n == 0 {
            break;
        }
        context.update(&buf[..n]);
    }
    Ok(super::hex(context.finish().as_ref()))
}

pub fn list(dir: &str) -> Result<Vec<String>> {
    let mut found = Vec::new();
    let mut pending = vec![std::path::PathBuf::from(dir)];
    while let Some(dir) = pending.pop() {
        let entries = match std::fs::read_dir(&dir) {
            Ok(entries) => entries,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
            Err(e) => return Err(Error::io(&dir.to_string_lossy(), e)),
        };
        for entry in entries {
            let entry = entry.map_err(|e| Error::io(&dir.to_string_lossy(), e))?;
            let kind = entry
                .file_type()
                .map_err(|e| Error::io(&entry.path().to_string_lossy(), e))?;
            if kind.is_dir() {
                pending.push(entry.path());
            } else {
                found.push(entry.path().to_string_lossy().into_owned());
            }
        }
    }
    Ok(found)
}
