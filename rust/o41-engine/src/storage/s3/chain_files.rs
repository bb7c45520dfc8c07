//! The files the credential chain reads (the shared config and credentials files, web identity
//! and container authorization token files), bounded: each must be a regular file no larger
//! than its cap. A FIFO, a device or a directory is refused before it is opened (opening a FIFO
//! for reading waits for a writer; `/dev/zero` never ends), and a file's size is checked before
//! anything is allocated for it; a file is then read to at most its cap plus one byte.

use std::fs::Metadata;
use std::io::Read;
use std::os::unix::fs::{FileTypeExt, OpenOptionsExt};
use std::path::Path;

/// The most of a shared config or credentials file read: a profile is a few lines, and a file
/// of thousands of profiles is well under a megabyte.
pub(super) const MAX_PROFILE_FILE: u64 = 16 << 20;

/// The most of a web identity or container authorization token file read. STS takes a web
/// identity token of at most 20,000 characters, and real ones (EKS, GitHub, GitLab OIDC) are
/// 1-2 KiB; a larger token would also make `AssumeRoleWithWebIdentity`'s URL, which carries it
/// percent-encoded, longer than the HTTP client accepts (it panics past 64 KiB).
pub(super) const MAX_TOKEN_FILE: u64 = 16 << 10;

/// Why a file of the chain was not read.
#[derive(Debug)]
pub(super) enum FileFault {
    /// There is no file at the path.
    Missing,
    /// It is not a regular file, or larger than its cap: the message names the path, what it
    /// is and the bound.
    Refused(String),
    /// Opening or reading it failed.
    Io(std::io::Error),
}

impl From<std::io::Error> for FileFault {
    fn from(e: std::io::Error) -> Self {
        if e.kind() == std::io::ErrorKind::NotFound {
            FileFault::Missing
        } else {
            FileFault::Io(e)
        }
    }
}

/// What a file that is not a regular file is, for messages; `None` for a regular file.
fn special(metadata: &Metadata) -> Option<&'static str> {
    let kind = metadata.file_type();
    if kind.is_file() {
        None
    } else if kind.is_dir() {
        Some("a directory")
    } else if kind.is_fifo() {
        Some("a FIFO")
    } else if kind.is_char_device() {
        Some("a character device")
    } else if kind.is_block_device() {
        Some("a block device")
    } else if kind.is_socket() {
        Some("a socket")
    } else {
        Some("a special file")
    }
}

fn within_bounds(path: &Path, metadata: &Metadata, what: &str, cap: u64) -> Result<(), FileFault> {
    if let Some(kind) = special(metadata) {
        return Err(FileFault::Refused(format!(
            "{} is {kind}, not a regular file (a {what} must be a regular file of at most {cap} \
             bytes)",
            path.display()
        )));
    }
    if metadata.len() > cap {
        return Err(FileFault::Refused(format!(
            "{} is {} bytes, more than the {cap} bytes a {what} may be",
            path.display(),
            metadata.len()
        )));
    }
    Ok(())
}

/// Checks that `path` (symbolic links followed) is a regular file of at most `cap` bytes,
/// without opening it. For a file that another library reads right after: `object_store` reads
/// the token files itself, whole and blocking.
pub(super) fn check(path: &Path, what: &str, cap: u64) -> Result<(), FileFault> {
    within_bounds(path, &std::fs::metadata(path)?, what, cap)
}

/// The bytes of `path`, a regular file of at most `cap` bytes (`what` names it in messages).
pub(super) fn read(path: &Path, what: &str, cap: u64) -> Result<Vec<u8>, FileFault> {
    // Looked at before opening: opening a FIFO blocks and opening a device may act on it.
    check(path, what, cap)?;
    // Non-blocking, so that a path replaced by a FIFO since the check opens at once (reads of
    // a regular file are unaffected); the open handle is checked again, and it is what is read.
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK | libc::O_NOCTTY)
        .open(path)?;
    let metadata = file.metadata()?;
    within_bounds(path, &metadata, what, cap)?;
    // The size was checked above, so this allocation is bounded by the cap.
    let mut bytes = Vec::with_capacity(usize::try_from(metadata.len()).unwrap_or(0) + 1);
    file.take(cap + 1).read_to_end(&mut bytes)?;
    if bytes.len() as u64 > cap {
        return Err(FileFault::Refused(format!(
            "{} grew past the {cap} bytes a {what} may be while it was read",
            path.display()
        )));
    }
    Ok(bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn refusal(fault: Result<impl std::fmt::Debug, FileFault>) -> String {
        match fault {
            Err(FileFault::Refused(message)) => message,
            other => panic!("expected a refusal, got {other:?}"),
        }
    }

    #[test]
    fn only_small_regular_files_are_read_and_nothing_blocks() {
        let dir = std::env::temp_dir().join(format!("o41-chain-files-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let fifo = dir.join("fifo");
        let _ = std::fs::remove_file(&fifo);
        assert!(std::process::Command::new("mkfifo")
            .arg(&fifo)
            .status()
            .unwrap()
            .success());
        // Would block for good on a plain open, with no writer.
        let message = refusal(read(&fifo, "token file", 100));
        assert_eq!(
            message,
            format!(
                "{} is a FIFO, not a regular file (a token file must be a regular file of at \
                 most 100 bytes)",
                fifo.display()
            )
        );
        assert!(refusal(check(&fifo, "token file", 100)).contains("is a FIFO"));
        // Would be read until allocation fails.
        let message = refusal(read(Path::new("/dev/zero"), "token file", 100));
        assert!(message.starts_with("/dev/zero is a character device, not a regular file"));
        assert!(refusal(read(&dir, "token file", 100)).contains("is a directory"));
        // A file over the cap is refused from its size, before it is read.
        let big = dir.join("big");
        std::fs::File::create(&big)
            .unwrap()
            .set_len(MAX_TOKEN_FILE + 1)
            .unwrap();
        assert_eq!(
            refusal(read(&big, "token file", MAX_TOKEN_FILE)),
            format!(
                "{} is 16385 bytes, more than the 16384 bytes a token file may be",
                big.display()
            )
        );
        let small = dir.join("small");
        std::fs::write(&small, b"token").unwrap();
        assert_eq!(read(&small, "token file", 5).unwrap(), b"token");
        assert!(check(&small, "token file", 5).is_ok());
        assert!(matches!(
            read(&dir.join("absent"), "token file", 5),
            Err(FileFault::Missing)
        ));
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
