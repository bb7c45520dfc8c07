//! The inspection cache: what counting a plain file list's shards learnt, kept on the host so a
//! second open or resume reads no shard bytes to count rows.
//!
//! An entry is keyed by everything that identifies the object's content as storage reports it
//! (location, encoding, size, version: an `ETag` or a local file's modification time, and a
//! local file's inode), so a changed file misses the cache instead of hitting a stale entry. A
//! file rewritten behind the cache's back with its size, time and inode kept is still caught:
//! the rows an entry gives are a promise the shard is held to when it is first read.
//!
//! One small JSON file per entry, written atomically (temporary file, then rename, not flushed:
//! a torn entry is a miss); a corrupt or unreadable entry is ignored and rewritten. A format
//! keeps companion files of its own kinds beside the entries ([`CompanionKind`], defined in the
//! format's module): a token shard's list lengths (`formats::tokens::lengths`), a gzip stream's
//! access index (`formats::jsonl::gz_access`). The cache stores, seals and finds their bytes; it
//! knows no format's layout. The directory is `$O41_INSPECT_CACHE`, or
//! `o41/inspect` under `$XDG_CACHE_HOME` or `~/.cache`; `O41_INSPECT_CACHE=off` turns it off.
//! Failing to write an entry never fails a stream: the cache only saves work.
//!
//! Every file ends with a 128-bit keyed `HighwayHash` of its contents under this host's key
//! (`<cache dir>.key`, 32 random bytes made on first use, mode 0600): an entry is what this
//! host's streams learnt, so one forged with its counts, points or checksums recomputed, copied
//! from another host or written by another tool is a miss, never a changed row. Without the
//! key (it cannot be made or read), the cache is off.

use std::io::Write;
use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use crate::encoding::Encoding;
use crate::storage::Pin;

/// The value of an entry's `format` field.
const CACHE_FORMAT: &str = "o41-inspect-cache";
/// The entry layout this release reads and writes; other versions are misses (2: sealed).
const CACHE_VERSION: u32 = 2;
/// Bytes of the seal that ends every cache file.
const SEAL_BYTES: usize = 16;
/// Entries larger than this are not ours (an entry is a few hundred bytes).
const MAX_ENTRY_BYTES: u64 = 64 << 10;
/// A companion file's header (the key and column, as JSON) is at most this long.
const MAX_COMPANION_HEADER: usize = 64 << 10;

/// What identifies one object's content.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
struct Key {
    location: String,
    encoding: Encoding,
    size: u64,
    version: String,
    inode: Option<u64>,
}

/// What an inspection learnt that a later open needs before reading the shard.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Cached {
    /// Records in the shard.
    pub rows: u64,
    /// Decode scratch for one job, when it was measured for the same projected columns.
    pub scratch_bytes: Option<u64>,
}

#[derive(Debug, Serialize, Deserialize)]
struct Entry {
    format: String,
    version: u32,
    key: Key,
    rows: u64,
    /// The projection the scratch was measured for ([`projection_key`]) and the bytes.
    scratch: Option<(String, u64)>,
}

/// The cache key of an object as `pin` describes it; None for objects without a version,
/// whose content nothing identifies.
fn key(location: &str, encoding: Encoding, pin: &Pin) -> Option<Key> {
    Some(Key {
        location: location.to_owned(),
        encoding,
        size: pin.size,
        version: pin.version.clone()?,
        inode: pin.inode,
    })
}

fn entry_path(dir: &std::path::Path, key: &Key) -> PathBuf {
    let json = serde_json::to_vec(key).expect("a key always serialises");
    let digest = ring::digest::digest(&ring::digest::SHA256, &json);
    spread(dir, &crate::storage::hex(&digest.as_ref()[..16]), "json")
}

/// `dir/<first two hex digits>/<digest>.<suffix>`: entries spread over 256 directories, so
/// that threads storing thousands of entries at once do not queue on one directory's lock,
/// nor a filesystem search one huge directory for each new name.
fn spread(dir: &std::path::Path, digest: &str, suffix: &str) -> PathBuf {
    dir.join(&digest[..2]).join(format!("{digest}.{suffix}"))
}

/// The header of a companion file (a lengths file, a gzip access index): whose object, and
/// for lengths, whose column.
#[derive(Debug, PartialEq, Eq, Serialize, Deserialize)]
struct CompanionHeader {
    key: Key,
    column: String,
}

/// A kind of companion file: its name's suffix and its first bytes (which carry the layout's
/// version). A format that keeps something of its own beside an entry (a Parquet token
/// column's list lengths, a gzip stream's access index) defines its kind in its own module;
/// the cache only stores, seals and finds the bytes.
#[derive(Debug, Clone, Copy)]
pub struct CompanionKind {
    /// The file name's suffix.
    pub suffix: &'static str,
    /// The file's first bytes, the payload layout's version included.
    pub magic: &'static [u8; 8],
}

/// Whose companion file: the object's location, encoding and pin, and a column (or another
/// qualifier; empty for none).
pub type Subject<'a> = (&'a str, Encoding, &'a Pin, &'a str);

/// A local file's content identity (`formats::identity`). Its header's column is the file's
/// status-change time, which no copy or `touch` keeps: a file rewritten with its size,
/// modification time and inode kept misses this entry and is hashed again.
const CONTENT: CompanionKind = CompanionKind {
    suffix: "content",
    magic: b"o41cid01",
};

/// The longest content identity an entry may hold.
const MAX_CONTENT_ID: u64 = 256;

fn companion_path(dir: &std::path::Path, header: &[u8], kind: CompanionKind) -> PathBuf {
    let digest = ring::digest::digest(&ring::digest::SHA256, header);
    spread(
        dir,
        &crate::storage::hex(&digest.as_ref()[..16]),
        kind.suffix,
    )
}

/// Where a companion file's payload starts, if `bytes` is one of `kind` and is `header`'s.
fn payload_at(bytes: &[u8], header: &[u8], kind: CompanionKind) -> Option<usize> {
    let rest = bytes.strip_prefix(kind.magic)?;
    let (len, rest) = rest.split_first_chunk::<4>()?;
    let len = u32::from_le_bytes(*len) as usize;
    if len > MAX_COMPANION_HEADER || rest.get(..len)? != header {
        return None;
    }
    Some(kind.magic.len() + 4 + len)
}

/// A companion file found in the cache: where it is, its payload, and the payload's offset.
#[derive(Debug)]
pub struct Companion {
    /// The file.
    pub path: PathBuf,
    /// What follows its header.
    pub payload: Vec<u8>,
    /// The offset in the file where the payload starts.
    pub at: u64,
}

/// A cache directory.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InspectCache {
    dir: PathBuf,
    /// This host's key, which seals every file; None when it cannot be had (nothing is
    /// stored, nothing found).
    key: Option<[u64; 4]>,
}

/// The host key beside the cache directory `dir`: read, or made (random, 0600) where there is
/// none. Made by linking a finished file into place, so two processes agree on one key.
fn host_key(dir: &std::path::Path) -> Option<[u64; 4]> {
    use std::io::Read;
    use std::os::unix::fs::OpenOptionsExt;

    let mut name = dir.as_os_str().to_owned();
    name.push(".key");
    let path = PathBuf::from(name);
    let read = |path: &std::path::Path| -> Option<[u64; 4]> {
        let mut bytes = Vec::with_capacity(33);
        open_entry(path)?.take(33).read_to_end(&mut bytes).ok()?;
        (bytes.len() == 32).then(|| {
            std::array::from_fn(|k| {
                u64::from_le_bytes(bytes[8 * k..8 * k + 8].try_into().expect("eight bytes"))
            })
        })
    };
    if let Some(key) = read(&path) {
        return Some(key);
    }
    let mut fresh = [0u8; 32];
    ring::rand::SecureRandom::fill(&ring::rand::SystemRandom::new(), &mut fresh).ok()?;
    std::fs::create_dir_all(path.parent()?).ok()?;
    let tmp = path.with_extension(format!("key.{}.tmp", std::process::id()));
    let made = (|| {
        let mut file = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&tmp)?;
        file.write_all(&fresh)?;
        file.sync_all()?;
        // Fails where another process made the key first: its key is then the one read.
        std::fs::hard_link(&tmp, &path)
    })();
    let _ = std::fs::remove_file(&tmp);
    drop(made);
    read(&path)
}

impl InspectCache {
    /// The cache in `dir`, sealed with the host key beside it.
    pub fn new(dir: impl Into<PathBuf>) -> Self {
        let dir = dir.into();
        let key = host_key(&dir);
        InspectCache { dir, key }
    }

    /// The seal of `bytes` under this host's key.
    fn seal(&self, bytes: &[u8]) -> Option<[u8; SEAL_BYTES]> {
        use highway::{HighwayHash, HighwayHasher, Key};
        let mut hasher = HighwayHasher::new(Key(self.key?));
        hasher.append(bytes);
        let [a, b] = hasher.finalize128();
        let mut seal = [0u8; SEAL_BYTES];
        seal[..8].copy_from_slice(&a.to_le_bytes());
        seal[8..].copy_from_slice(&b.to_le_bytes());
        Some(seal)
    }

    /// `bytes` without their seal, if it is this host's.
    fn unsealed<'b>(&self, bytes: &'b [u8]) -> Option<&'b [u8]> {
        let (body, seal) = bytes.split_at_checked(bytes.len().checked_sub(SEAL_BYTES)?)?;
        (self.seal(body)? == *seal).then_some(body)
    }

    /// Writes `bytes`, sealed, to `path`.
    fn write_sealed(&self, path: &std::path::Path, bytes: &[u8]) -> std::io::Result<()> {
        let seal = self
            .seal(bytes)
            .ok_or_else(|| std::io::Error::other("no host key"))?;
        let mut sealed = Vec::with_capacity(bytes.len() + SEAL_BYTES);
        sealed.extend_from_slice(bytes);
        sealed.extend_from_slice(&seal);
        write_atomically(&self.dir, path, &sealed)
    }

    /// The cache the environment names, or None when it is off or no home directory is known.
    pub fn from_env() -> Option<Self> {
        let dir = match std::env::var_os("O41_INSPECT_CACHE") {
            Some(value) if value == "off" || value.is_empty() => None,
            Some(value) => Some(PathBuf::from(value)),
            None => std::env::var_os("XDG_CACHE_HOME")
                .filter(|v| !v.is_empty())
                .map(PathBuf::from)
                .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache")))
                .map(|base| base.join("o41").join("inspect")),
        };
        dir.map(Self::new)
    }

    /// The cached inspection of the object `pin` describes, if any; `projection` names the
    /// projected columns the scratch must have been measured for.
    pub fn lookup(
        &self,
        location: &str,
        encoding: Encoding,
        pin: &Pin,
        projection: &str,
    ) -> Option<Cached> {
        let key = key(location, encoding, pin)?;
        let path = entry_path(&self.dir, &key);
        let file = open_entry(&path)?;
        if file.metadata().ok()?.len() > MAX_ENTRY_BYTES {
            return None;
        }
        let mut bytes = Vec::new();
        std::io::Read::read_to_end(&mut std::io::Read::take(file, MAX_ENTRY_BYTES), &mut bytes)
            .ok()?;
        let entry: Entry = serde_json::from_slice(self.unsealed(&bytes)?).ok()?;
        if entry.format != CACHE_FORMAT || entry.version != CACHE_VERSION || entry.key != key {
            return None;
        }
        Some(Cached {
            rows: entry.rows,
            scratch_bytes: entry
                .scratch
                .filter(|(measured_for, _)| measured_for == projection)
                .map(|(_, bytes)| bytes),
        })
    }

    /// Records an inspection of the object `pin` describes. Best effort: a read-only or full disk
    /// leaves the cache as it was.
    pub fn store(
        &self,
        location: &str,
        encoding: Encoding,
        pin: &Pin,
        projection: &str,
        cached: Cached,
    ) {
        let Some(key) = key(location, encoding, pin) else {
            return;
        };
        let entry = Entry {
            format: CACHE_FORMAT.to_owned(),
            version: CACHE_VERSION,
            rows: cached.rows,
            scratch: cached.scratch_bytes.map(|b| (projection.to_owned(), b)),
            key,
        };
        let path = entry_path(&self.dir, &entry.key);
        if let Ok(json) = serde_json::to_vec(&entry) {
            let _ = self.write_sealed(&path, &json);
        }
    }

    fn companion_header(
        location: &str,
        encoding: Encoding,
        pin: &Pin,
        column: &str,
    ) -> Option<Vec<u8>> {
        let header = CompanionHeader {
            key: key(location, encoding, pin)?,
            column: column.to_owned(),
        };
        serde_json::to_vec(&header)
            .ok()
            .filter(|h| h.len() <= MAX_COMPANION_HEADER)
    }

    /// The content identity stored for the local file `pin` describes, whose status changed
    /// last at `ctime_ns`.
    pub fn lookup_content(
        &self,
        location: &str,
        encoding: Encoding,
        pin: &Pin,
        ctime_ns: i128,
    ) -> Option<String> {
        let column = format!("ctime:{ctime_ns}");
        let found =
            self.lookup_companion(CONTENT, (location, encoding, pin, &column), MAX_ENTRY_BYTES)?;
        String::from_utf8(found.payload)
            .ok()
            .filter(|id| id.len() as u64 <= MAX_CONTENT_ID)
    }

    /// Records the content identity of the local file `pin` and `ctime_ns` describe. Best
    /// effort, like [`InspectCache::store`].
    pub fn store_content(
        &self,
        location: &str,
        encoding: Encoding,
        pin: &Pin,
        ctime_ns: i128,
        identity: &str,
    ) {
        let column = format!("ctime:{ctime_ns}");
        let _ = self.store_companion(
            CONTENT,
            (location, encoding, pin, &column),
            identity.as_bytes(),
        );
    }

    /// The companion file of `kind` stored for `subject`, if any, its seal and header intact,
    /// and at most `max_bytes` long.
    pub fn lookup_companion(
        &self,
        kind: CompanionKind,
        (location, encoding, pin, column): Subject<'_>,
        max_bytes: u64,
    ) -> Option<Companion> {
        let header = Self::companion_header(location, encoding, pin, column)?;
        let path = companion_path(&self.dir, &header, kind);
        let file = open_entry(&path)?;
        if file.metadata().ok()?.len() > max_bytes {
            return None;
        }
        let mut bytes = Vec::new();
        std::io::Read::read_to_end(&mut std::io::BufReader::new(file), &mut bytes).ok()?;
        let body = self.unsealed(&bytes)?.len();
        bytes.truncate(body);
        let at = payload_at(&bytes, &header, kind)?;
        bytes.drain(..at);
        Some(Companion {
            path,
            payload: bytes,
            at: at as u64,
        })
    }

    /// Writes a companion file atomically: its path and where its payload starts, or None
    /// where it could not be written (best effort, like [`InspectCache::store`]).
    pub fn store_companion(
        &self,
        kind: CompanionKind,
        (location, encoding, pin, column): Subject<'_>,
        payload: &[u8],
    ) -> Option<(PathBuf, u64)> {
        let header = Self::companion_header(location, encoding, pin, column)?;
        let mut bytes = Vec::with_capacity(kind.magic.len() + 4 + header.len() + payload.len());
        bytes.extend_from_slice(kind.magic);
        bytes.extend_from_slice(&(header.len() as u32).to_le_bytes());
        bytes.extend_from_slice(&header);
        let at = bytes.len() as u64;
        bytes.extend_from_slice(payload);
        let path = companion_path(&self.dir, &header, kind);
        self.write_sealed(&path, &bytes).ok()?;
        Some((path, at))
    }
}

fn write_atomically(
    dir: &std::path::Path,
    path: &std::path::Path,
    bytes: &[u8],
) -> std::io::Result<()> {
    let dir = path.parent().unwrap_or(dir);
    if !dir.is_dir() {
        std::fs::create_dir_all(dir)?;
    }
    // A new entry is written in place: a reader that meets it half written finds no seal (a
    // miss), and one directory operation is half the cost of a temporary file and a rename.
    match std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(path)
    {
        Ok(mut file) => return file.write_all(bytes),
        Err(e) if e.kind() != std::io::ErrorKind::AlreadyExists => return Err(e),
        Err(_) => {} // replaced whole below: a reader sees the old entry or the new one
    }
    // A name no other process or thread uses, so concurrent writers never share a file.
    let unique = format!(
        ".{}.{}.{:?}.tmp",
        path.file_name()
            .map(|n| n.to_string_lossy())
            .unwrap_or_default(),
        std::process::id(),
        std::thread::current().id()
    )
    .replace(['(', ')'], "");
    let tmp = dir.join(unique);
    // Not flushed to disk: an entry only saves work, and one a crash leaves torn is a miss
    // (every entry is checked as it is read: its JSON, magic, header, counts and checksums). A
    // flush per entry made a first open of 4,000 shards spend seconds waiting on the disk.
    let result = (|| {
        let mut file = std::fs::File::create(&tmp)?;
        file.write_all(bytes)?;
        std::fs::rename(&tmp, path)
    })();
    if result.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    result
}

/// Opens a cache entry without blocking, and only if it is a regular file: an entry replaced by
/// a FIFO would block a plain open until a writer came, a device would never end. Anything but a
/// regular file is a cache miss.
fn open_entry(path: &std::path::Path) -> Option<std::fs::File> {
    use std::os::unix::fs::OpenOptionsExt;

    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK)
        .open(path)
        .ok()?;
    file.metadata().ok()?.is_file().then_some(file)
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// The files of a cache directory (entries sit one directory down).
    fn entry_files(dir: &std::path::Path) -> Vec<std::path::PathBuf> {
        let mut files = Vec::new();
        for sub in std::fs::read_dir(dir).unwrap() {
            for file in std::fs::read_dir(sub.unwrap().path()).unwrap() {
                files.push(file.unwrap().path());
            }
        }
        files
    }

    /// A pin of a local file of `size` bytes at `version`, for tests of cache entries.
    pub(crate) fn pin(size: u64, version: &str) -> Pin {
        Pin {
            size,
            version: Some(version.to_owned()),
            inode: Some(7),
        }
    }

    #[test]
    fn an_entry_is_found_only_for_the_same_object_and_projection() {
        let dir = std::env::temp_dir().join(format!("o41-cache-test-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let cache = InspectCache::new(&dir);
        let cached = Cached {
            rows: 42,
            scratch_bytes: Some(1000),
        };
        cache.store(
            "/d/a.parquet",
            Encoding::Parquet,
            &pin(10, "mtime:1"),
            "p1",
            cached,
        );
        assert_eq!(
            cache.lookup("/d/a.parquet", Encoding::Parquet, &pin(10, "mtime:1"), "p1"),
            Some(cached)
        );
        // Another projection: rows still hold, scratch does not.
        assert_eq!(
            cache.lookup("/d/a.parquet", Encoding::Parquet, &pin(10, "mtime:1"), "p2"),
            Some(Cached {
                rows: 42,
                scratch_bytes: None
            })
        );
        // Any change of size, version, inode, location or encoding misses.
        assert_eq!(
            cache.lookup("/d/a.parquet", Encoding::Parquet, &pin(11, "mtime:1"), "p1"),
            None
        );
        assert_eq!(
            cache.lookup("/d/a.parquet", Encoding::Parquet, &pin(10, "mtime:2"), "p1"),
            None
        );
        let moved = Pin {
            inode: Some(8),
            ..pin(10, "mtime:1")
        };
        assert_eq!(
            cache.lookup("/d/a.parquet", Encoding::Parquet, &moved, "p1"),
            None
        );
        assert_eq!(
            cache.lookup("/d/b.parquet", Encoding::Parquet, &pin(10, "mtime:1"), "p1"),
            None
        );
        assert_eq!(
            cache.lookup("/d/a.parquet", Encoding::Jsonl, &pin(10, "mtime:1"), "p1"),
            None
        );
        // A corrupt entry is a miss, and is replaced by the next store.
        for file in entry_files(&dir) {
            std::fs::write(&file, b"{not json").unwrap();
        }
        assert_eq!(
            cache.lookup("/d/a.parquet", Encoding::Parquet, &pin(10, "mtime:1"), "p1"),
            None
        );
        cache.store(
            "/d/a.parquet",
            Encoding::Parquet,
            &pin(10, "mtime:1"),
            "p1",
            cached,
        );
        assert_eq!(
            cache.lookup("/d/a.parquet", Encoding::Parquet, &pin(10, "mtime:1"), "p1"),
            Some(cached)
        );
        // Objects without a version are never cached.
        let unversioned = Pin {
            size: 10,
            version: None,
            inode: None,
        };
        cache.store(
            "/d/c.parquet",
            Encoding::Parquet,
            &unversioned,
            "p1",
            cached,
        );
        assert_eq!(
            cache.lookup("/d/c.parquet", Encoding::Parquet, &unversioned, "p1"),
            None
        );
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn an_entry_replaced_by_a_fifo_is_a_miss_without_blocking() {
        let dir = std::env::temp_dir().join(format!("o41-cache-fifo-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let cache = InspectCache::new(&dir);
        let cached = Cached {
            rows: 42,
            scratch_bytes: None,
        };
        let (at, parquet) = ("/d/a.parquet", Encoding::Parquet);
        cache.store(at, parquet, &pin(10, "mtime:1"), "p1", cached);
        let kind = CompanionKind {
            suffix: "test",
            magic: b"o41tst01",
        };
        cache.store_companion(kind, (at, parquet, &pin(10, "mtime:1"), "t"), &[3, 4]);
        for file in entry_files(&dir) {
            let path = file;
            std::fs::remove_file(&path).unwrap();
            let made = std::process::Command::new("mkfifo")
                .arg(&path)
                .status()
                .unwrap();
            assert!(made.success());
        }
        // A plain open of a FIFO with no writer blocks forever; the lookups return at once.
        let (done, wait) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let found = cache.lookup(at, parquet, &pin(10, "mtime:1"), "p1");
            let companion =
                cache.lookup_companion(kind, (at, parquet, &pin(10, "mtime:1"), "t"), 1 << 20);
            done.send((found, companion.map(|c| c.payload))).unwrap();
        });
        let (found, companion) = wait
            .recv_timeout(std::time::Duration::from_secs(10))
            .expect("a lookup blocked on a FIFO");
        assert_eq!((found, companion), (None, None));
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn an_entry_is_this_hosts_only_a_forged_or_copied_one_is_a_miss() {
        let dir = std::env::temp_dir().join(format!("o41-cache-seal-{}", std::process::id()));
        let cache = InspectCache::new(&dir);
        let cached = Cached {
            rows: 1000,
            scratch_bytes: None,
        };
        let (at, parquet, p) = ("/d/a.parquet", Encoding::Parquet, pin(10, "mtime:1"));
        cache.store(at, parquet, &p, "p1", cached);
        assert_eq!(cache.lookup(at, parquet, &p, "p1"), Some(cached));
        let files = entry_files(&dir);
        assert_eq!(files.len(), 1, "one entry");
        let entry = files[0].clone();
        // Its count edited in place, the seal kept: not what this host wrote.
        let bytes = std::fs::read(&entry).unwrap();
        let text = String::from_utf8_lossy(&bytes).replace("\"rows\":1000", "\"rows\":500");
        std::fs::write(&entry, text.as_bytes()).unwrap();
        assert_eq!(cache.lookup(at, parquet, &p, "p1"), None);
        // A genuine entry copied to another host's cache (another key) is a miss there.
        cache.store(at, parquet, &p, "p1", cached);
        let other_dir = dir.with_extension("other");
        let other = InspectCache::new(&other_dir);
        let copied = other_dir.join(entry.strip_prefix(&dir).unwrap());
        std::fs::create_dir_all(copied.parent().unwrap()).unwrap();
        std::fs::copy(&entry, &copied).unwrap();
        assert_eq!(other.lookup(at, parquet, &p, "p1"), None);
        for path in [&dir, &other_dir] {
            let _ = std::fs::remove_dir_all(path);
            let _ = std::fs::remove_file(path.with_extension("key"));
        }
    }
}
