//! Batch slots in shared memory: how a batch crosses from a loader's worker process to the
//! trainer's process as a handle of a few dozen bytes instead of its bytes (docs/torch.md,
//! "Workers").
//!
//! A worker owns segments: files in `/dev/shm` (the temporary directory when that is missing or
//! full), mapped shared, a header page then equal slots. [`SlotRing::put`] copies a batch's
//! columns into a free slot; [`Slot::handle`] names it; [`receive`] in another process maps the
//! segment once, unlinks its name (the mapping keeps the memory) and views the slot in place.
//!
//! A slot is reused only when nobody can see it change:
//! - the worker's own lease is gone (every [`Slot`] clone and every Arrow view of it dropped:
//!   the worker's code may drop a batch without sending it);
//! - every handle sent for it was received and its view dropped: the header counts, per slot,
//!   the handles sent and not yet released, raised by the sender and lowered by the receiver.
//!
//! When no slot is free the worker adds a segment, with slots sized for the batch at hand: it
//! never waits (whoever holds the busy slots may hold them forever) and never overwrites.
//! Segment files never outlive their use: the receiver unlinks a segment as soon as it maps it,
//! and [`SlotRing::unlink_unreceived`] (run as the worker exits) unlinks the rest. Only a worker
//! killed between creating a segment and its first batch being received can leave an
//! `o41-ring-<pid>-*` file behind.
//!
//! The module maps memory and shares it between processes, which needs `unsafe`; every block
//! says what makes it sound.
#![allow(unsafe_code)]

use std::collections::HashMap;
use std::fs::{File, OpenOptions};
use std::io;
use std::os::unix::fs::OpenOptionsExt;
use std::os::unix::io::AsRawFd;
use std::path::{Path, PathBuf};
use std::ptr::NonNull;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock, Weak};

use arrow_array::{Array, RecordBatch, UInt8Array};
use arrow_buffer::{Buffer, ScalarBuffer};
use arrow_data::ArrayData;
use arrow_schema::DataType;

/// Segment files are named `o41-ring-<worker pid>-<random>`.
pub const SEGMENT_PREFIX: &str = "o41-ring-";
/// Slots of a worker's first segment for a batch size: a loader's default two batches in
/// flight, the one the trainer holds and the one it just let go of.
pub const INITIAL_SLOTS: usize = 4;
/// Growth doubles a worker's slots for a batch size up to this many per segment, so a trainer
/// that keeps many batches costs a handful of segments, not one per batch.
pub const MAX_SLOTS_PER_SEGMENT: usize = 64;
/// Fields start at multiples of this (a cache line) inside a slot.
pub const FIELD_ALIGN: usize = 64;
const PAGE: usize = 4096;
/// The header: one `u32` per slot, the handles sent and not yet released.
const HEADER_BYTES: usize = PAGE;

fn round_up(n: usize, to: usize) -> usize {
    n.div_ceil(to) * to
}

/// Where segments are created, in order of preference: `/dev/shm` (memory-backed) when it is
/// there and writable, then the temporary directory.
pub fn segment_directories() -> Vec<PathBuf> {
    let shm = Path::new("/dev/shm");
    let mut out = Vec::with_capacity(2);
    // SAFETY: `access` reads a NUL-terminated path and touches nothing else.
    let writable = shm.is_dir() && unsafe { libc::access(c"/dev/shm".as_ptr(), libc::W_OK) } == 0;
    if writable {
        out.push(shm.to_path_buf());
    }
    out.push(std::env::temp_dir());
    out
}

/// A shared, writable mapping of a whole file; unmapped on drop.
struct Mapping {
    ptr: NonNull<u8>,
    len: usize,
}

// SAFETY: the mapping is plain memory; concurrent access to it goes through atomics (the
// header) or through slots that the protocol gives to one writer at a time.
unsafe impl Send for Mapping {}
// SAFETY: as for Send.
unsafe impl Sync for Mapping {}

impl Mapping {
    fn of(file: &File, len: usize) -> io::Result<Self> {
        // SAFETY: a fresh shared mapping of `len` bytes of an open file; the pointer is used
        // only within `len` and only while `self` lives (munmap in Drop).
        let ptr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                file.as_raw_fd(),
                0,
            )
        };
        if ptr == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        let ptr = NonNull::new(ptr.cast::<u8>()).ok_or_else(io::Error::last_os_error)?;
        Ok(Self { ptr, len })
    }

    /// The count of handles sent for `slot` and not yet released.
    fn holders(&self, slot: usize) -> &AtomicU32 {
        assert!((slot + 1) * 4 <= HEADER_BYTES && HEADER_BYTES <= self.len);
        // SAFETY: in bounds (checked), 4-aligned (the mapping is page-aligned), and only ever
        // accessed atomically by every process that maps the segment.
        #[allow(clippy::cast_ptr_alignment)]
        unsafe {
            AtomicU32::from_ptr(self.ptr.as_ptr().add(slot * 4).cast::<u32>())
        }
    }

    /// `len` bytes from `start` as an Arrow array that keeps `owner` alive while it is viewed.
    fn view(
        &self,
        start: usize,
        len: usize,
        owner: Arc<dyn arrow_buffer::alloc::Allocation>,
    ) -> UInt8Array {
        assert!(start + len <= self.len);
        // SAFETY: the range is inside the mapping, which `owner` keeps mapped (it holds the
        // mapping's Arc); nobody writes it while viewed (the module's protocol).
        let ptr = unsafe { NonNull::new_unchecked(self.ptr.as_ptr().add(start)) };
        // SAFETY: as above: `ptr..ptr+len` stays valid and unchanged while `owner` lives.
        let buffer = unsafe { Buffer::from_custom_allocation(ptr, len, owner) };
        UInt8Array::new(ScalarBuffer::new(buffer, 0, len), None)
    }
}

impl Drop for Mapping {
    fn drop(&mut self) {
        // SAFETY: the mapping `mmap` returned, unmapped once; no view outlives it (each holds
        // an Arc of what owns this mapping).
        unsafe { libc::munmap(self.ptr.as_ptr().cast(), self.len) };
    }
}

/// A segment a worker created: its slots' leases and generations.
struct Segment {
    path: PathBuf,
    map: Mapping,
    slots: usize,
    slot_bytes: usize,
    leased: Vec<AtomicBool>,
    generations: Vec<AtomicU64>,
}

impl Segment {
    fn create(path: &Path, slots: usize, slot_bytes: usize) -> io::Result<Self> {
        let len = HEADER_BYTES + slots * slot_bytes;
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create_new(true)
            .mode(0o600)
            .custom_flags(libc::O_CLOEXEC)
            .open(path)?;
        let mapped = reserve(&file, len).and_then(|()| Mapping::of(&file, len));
        let map = mapped.inspect_err(|_| {
            let _ = std::fs::remove_file(path);
        })?;
        Ok(Self {
            path: path.to_path_buf(),
            map,
            slots,
            slot_bytes,
            leased: (0..slots).map(|_| AtomicBool::new(false)).collect(),
            generations: (0..slots).map(|_| AtomicU64::new(0)).collect(),
        })
    }

    /// A slot nobody holds, leased to the caller.
    fn claim(&self) -> Option<usize> {
        (0..self.slots).find(|&slot| {
            if self.map.holders(slot).load(Ordering::Acquire) != 0
                || self.leased[slot].swap(true, Ordering::AcqRel)
            {
                return false;
            }
            // A receiver may have been handed it between the two reads: check again.
            if self.map.holders(slot).load(Ordering::Acquire) != 0 {
                self.leased[slot].store(false, Ordering::Release);
                return false;
            }
            true
        })
    }

    fn start(&self, slot: usize) -> usize {
        HEADER_BYTES + slot * self.slot_bytes
    }
}

/// Reserves the file's pages now, so a full `/dev/shm` fails here with `ENOSPC` instead of
/// killing the worker with `SIGBUS` at its first write into the mapping.
fn reserve(file: &File, len: usize) -> io::Result<()> {
    #[cfg(target_os = "linux")]
    {
        // SAFETY: an open file descriptor and a length; the call touches nothing else.
        let code = unsafe { libc::posix_fallocate(file.as_raw_fd(), 0, len as libc::off_t) };
        match code {
            0 => return Ok(()),
            libc::EOPNOTSUPP | libc::EINVAL => {} // a file system without it
            code => return Err(io::Error::from_raw_os_error(code)),
        }
    }
    file.set_len(len as u64)
}

/// A worker process's segments.
pub struct SlotRing {
    pid: u32,
    segments: Mutex<Vec<Arc<Segment>>>,
    /// Every path created, for [`SlotRing::unlink_unreceived`].
    created: Mutex<Vec<PathBuf>>,
}

impl Default for SlotRing {
    fn default() -> Self {
        Self::new()
    }
}

impl SlotRing {
    /// An empty ring of this process.
    pub fn new() -> Self {
        Self {
            pid: std::process::id(),
            segments: Mutex::new(Vec::new()),
            created: Mutex::new(Vec::new()),
        }
    }

    /// The process that created the ring.
    pub fn pid(&self) -> u32 {
        self.pid
    }

    /// Copies `fields` into a free slot, each at a [`FIELD_ALIGN`] offset, and leases it.
    pub fn put(&self, fields: &[&[u8]]) -> io::Result<Slot> {
        let mut offsets = Vec::with_capacity(fields.len());
        let mut end = 0;
        for field in fields {
            offsets.push(end);
            end = round_up(end + field.len(), FIELD_ALIGN);
        }
        let (segment, slot) = self.free_slot(end.max(1))?;
        let start = segment.start(slot);
        for (field, &offset) in fields.iter().zip(&offsets) {
            // SAFETY: the slot is leased to this call alone (claim) and no receiver holds it,
            // so nobody reads or writes these bytes; the range is inside the slot.
            unsafe {
                let target = segment.map.ptr.as_ptr().add(start + offset);
                std::ptr::copy_nonoverlapping(field.as_ptr(), target, field.len());
            }
        }
        let generation = segment.generations[slot].fetch_add(1, Ordering::AcqRel) + 1;
        Ok(Slot {
            lease: Arc::new(Lease { segment, slot }),
            generation,
            offsets,
        })
    }

    /// Copies the columns of `batch` (fixed-shape: nested fixed-size lists over numbers, as the
    /// engine builds them) into a free slot, as [`SlotRing::put`] does.
    pub fn put_batch(&self, batch: &RecordBatch) -> io::Result<Slot> {
        let data: Vec<ArrayData> = batch.columns().iter().map(Array::to_data).collect();
        let mut fields = Vec::with_capacity(data.len());
        for (column, name) in data.iter().zip(batch.schema().fields()) {
            fields.push(fixed_shape_bytes(column).ok_or_else(|| {
                io::Error::new(
                    io::ErrorKind::InvalidInput,
                    format!(
                        "column {:?} is not a fixed-shape numeric column",
                        name.name()
                    ),
                )
            })?);
        }
        self.put(&fields)
    }

    fn free_slot(&self, bytes: usize) -> io::Result<(Arc<Segment>, usize)> {
        let mut segments = self.segments.lock().expect("ring lock");
        let fitting: Vec<&Arc<Segment>> =
            segments.iter().filter(|s| s.slot_bytes >= bytes).collect();
        for segment in &fitting {
            if let Some(slot) = segment.claim() {
                return Ok((Arc::clone(segment), slot));
            }
        }
        let held: usize = fitting.iter().map(|s| s.slots).sum();
        let slots = held.clamp(INITIAL_SLOTS, MAX_SLOTS_PER_SEGMENT);
        let segment = Arc::new(self.create(slots, round_up(bytes, PAGE))?);
        let slot = segment.claim().expect("a new segment has free slots");
        segments.push(Arc::clone(&segment));
        Ok((segment, slot))
    }

    fn create(&self, slots: usize, slot_bytes: usize) -> io::Result<Segment> {
        let mut failure = None;
        for directory in segment_directories() {
            let name = format!("{SEGMENT_PREFIX}{}-{:016x}", self.pid, random_u64()?);
            let path = directory.join(name);
            // Recorded first: an exit midway still unlinks it.
            self.created.lock().expect("ring lock").push(path.clone());
            match Segment::create(&path, slots, slot_bytes) {
                Ok(segment) => return Ok(segment),
                Err(error) => {
                    let full = matches!(
                        error.raw_os_error(),
                        Some(libc::ENOSPC | libc::EACCES | libc::EPERM | libc::EROFS)
                    );
                    if !full {
                        return Err(error);
                    }
                    failure = Some(error);
                }
            }
        }
        Err(failure.expect("at least one directory is tried"))
    }

    /// Unlinks every segment this process created that no receiver mapped (a receiver unlinks
    /// those it maps). A forked child that inherited the ring unlinks nothing.
    pub fn unlink_unreceived(&self) {
        if std::process::id() != self.pid {
            return;
        }
        for path in self.created.lock().expect("ring lock").iter() {
            let _ = std::fs::remove_file(path);
        }
    }
}

/// The bytes of a fixed-shape column as stored (row-major), or `None` for another layout.
fn fixed_shape_bytes(column: &ArrayData) -> Option<&[u8]> {
    if column.null_count() != 0 {
        return None;
    }
    let (mut data, mut start, mut len) = (column, column.offset(), column.len());
    loop {
        match data.data_type() {
            DataType::FixedSizeList(_, size) => {
                let size = usize::try_from(*size).ok()?;
                let child = data.child_data().first()?;
                start = child.offset() + start * size;
                len *= size;
                data = child;
            }
            kind => {
                let width = kind.primitive_width()?;
                let values = data.buffers().first()?.as_slice();
                return values.get(start * width..(start + len) * width);
            }
        }
    }
}

/// A name no other segment has: the system's randomness, as the inspection cache's key uses.
fn random_u64() -> io::Result<u64> {
    let mut bytes = [0u8; 8];
    ring::rand::SecureRandom::fill(&ring::rand::SystemRandom::new(), &mut bytes)
        .map_err(|_| io::Error::other("the system has no randomness for a segment name"))?;
    Ok(u64::from_le_bytes(bytes))
}

/// A worker's lease of a slot: free again once the last [`Slot`] and view of it are gone.
struct Lease {
    segment: Arc<Segment>,
    slot: usize,
}

impl Drop for Lease {
    fn drop(&mut self) {
        self.segment.leased[self.slot].store(false, Ordering::Release);
    }
}

/// A filled slot, leased to the worker while this (or a view of it) lives.
#[derive(Clone)]
pub struct Slot {
    lease: Arc<Lease>,
    generation: u64,
    offsets: Vec<usize>,
}

/// What names a slot to another process.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Handle {
    /// The segment file.
    pub path: String,
    /// The slot's number.
    pub slot: usize,
    /// How many times the worker filled the slot, this time included.
    pub generation: u64,
    /// Where the slot starts in the segment.
    pub start: usize,
    /// The slot's length.
    pub len: usize,
}

impl Slot {
    /// The slot's number in its segment.
    pub fn index(&self) -> usize {
        self.lease.slot
    }

    /// Each field's offset in the slot, in the order `put` was given them.
    pub fn offsets(&self) -> &[usize] {
        &self.offsets
    }

    /// The segment file holding the slot.
    pub fn path(&self) -> &Path {
        &self.lease.segment.path
    }

    /// The slot as an Arrow array; the lease lives while it is viewed.
    pub fn view(&self) -> UInt8Array {
        let segment = &self.lease.segment;
        let owner: Arc<dyn arrow_buffer::alloc::Allocation> = self.lease.clone();
        segment
            .map
            .view(segment.start(self.lease.slot), segment.slot_bytes, owner)
    }

    /// A handle for another process. Call it only when the handle is sent: the slot is then
    /// held until the receiver's view of it is dropped.
    pub fn handle(&self) -> Handle {
        let segment = &self.lease.segment;
        let slot = self.lease.slot;
        segment.map.holders(slot).fetch_add(1, Ordering::AcqRel);
        Handle {
            path: segment.path.to_string_lossy().into_owned(),
            slot,
            generation: self.generation,
            start: segment.start(slot),
            len: segment.slot_bytes,
        }
    }
}

/// A segment a receiving process mapped.
struct Mapped {
    path: String,
    owner: u32,
    map: Mapping,
}

impl Mapped {
    fn owner_alive(&self) -> bool {
        let Ok(pid) = libc::pid_t::try_from(self.owner) else {
            return false;
        };
        // SAFETY: signal 0 only checks that the process exists.
        let code = unsafe { libc::kill(pid, 0) };
        code == 0 || io::Error::last_os_error().raw_os_error() == Some(libc::EPERM)
    }
}

/// A received slot: its holder count is released when the last view of it is dropped.
struct Received {
    mapped: Arc<Mapped>,
    slot: usize,
    pid: u32,
}

impl Drop for Received {
    fn drop(&mut self) {
        // A process forked from the receiver inherits its views; its collector must not
        // release a slot the receiver still uses.
        if std::process::id() == self.pid {
            self.mapped
                .map
                .holders(self.slot)
                .fetch_sub(1, Ordering::AcqRel);
        }
    }
}

/// The segments this process received from live workers (a segment is mapped once, then its
/// name is gone), and every mapping some view still holds, for [`segment_of`].
#[derive(Default)]
struct Registry {
    live: HashMap<String, Arc<Mapped>>,
    all: Vec<Weak<Mapped>>,
}

fn registry() -> &'static Mutex<Registry> {
    static REGISTRY: OnceLock<Mutex<Registry>> = OnceLock::new();
    REGISTRY.get_or_init(Mutex::default)
}

/// The slot `handle` names, viewed in this process without a copy: an error when the segment
/// is gone (its worker exited before this process received the batch) or `handle` does not
/// fit it.
pub fn receive(handle: &Handle) -> io::Result<UInt8Array> {
    let mapped = {
        let mut registry = registry().lock().expect("registry lock");
        if let Some(mapped) = registry.live.get(&handle.path) {
            Arc::clone(mapped)
        } else {
            // A dead worker sends nothing more: forget its segments (views keep theirs).
            registry.live.retain(|_, m| m.owner_alive());
            registry.all.retain(|m| m.strong_count() > 0);
            let mapped = Arc::new(map_received(&handle.path)?);
            registry
                .live
                .insert(handle.path.clone(), Arc::clone(&mapped));
            registry.all.push(Arc::downgrade(&mapped));
            mapped
        }
    };
    let fits = handle.start >= HEADER_BYTES
        && handle
            .start
            .checked_add(handle.len)
            .is_some_and(|end| end <= mapped.map.len)
        && (handle.slot + 1) * 4 <= HEADER_BYTES;
    if !fits {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!("{}: the handle's slot is outside the segment", handle.path),
        ));
    }
    let received = Arc::new(Received {
        mapped: Arc::clone(&mapped),
        slot: handle.slot,
        pid: std::process::id(),
    });
    Ok(mapped.map.view(handle.start, handle.len, received))
}

fn map_received(path: &str) -> io::Result<Mapped> {
    // Only a segment file where workers create them is mapped (and unlinked): a handle is
    // a name, and the receiver removes what it names.
    let inside = Path::new(path)
        .parent()
        .is_some_and(|parent| segment_directories().iter().any(|d| d == parent));
    let owner = inside
        .then(|| Path::new(path).file_name())
        .flatten()
        .and_then(|name| name.to_str())
        .and_then(|name| name.strip_prefix(SEGMENT_PREFIX))
        .and_then(|rest| rest.split('-').next())
        .and_then(|pid| pid.parse().ok())
        .ok_or_else(|| {
            io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("{path} is not a ring segment in a segment directory"),
            )
        })?;
    let file = OpenOptions::new()
        .read(true)
        .write(true)
        .custom_flags(libc::O_CLOEXEC)
        .open(path)
        .map_err(|error| {
            if error.kind() == io::ErrorKind::NotFound {
                io::Error::new(
                    io::ErrorKind::NotFound,
                    format!(
                        "o41 ring segment {path} is gone: its worker exited before this \
                         process received the batch"
                    ),
                )
            } else {
                error
            }
        })?;
    let len = usize::try_from(file.metadata()?.len()).unwrap_or(0);
    if len < HEADER_BYTES {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!("{path} is shorter than a ring segment's header"),
        ));
    }
    let map = Mapping::of(&file, len)?;
    // The mapping keeps the memory; nobody needs the name any more.
    let _ = std::fs::remove_file(path);
    Ok(Mapped {
        path: path.to_owned(),
        owner,
        map,
    })
}

/// The segment whose memory `address` is in, among those this process received and still
/// views.
pub fn segment_of(address: usize) -> Option<String> {
    let registry = registry().lock().expect("registry lock");
    registry.all.iter().filter_map(Weak::upgrade).find_map(|m| {
        let start = m.map.ptr.as_ptr() as usize;
        (start..start + m.map.len)
            .contains(&address)
            .then(|| m.path.clone())
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_slot_is_reused_only_once_every_holder_let_go() {
        let ring = SlotRing::new();
        let first = ring.put(&[&[1, 2, 3, 4], &[9]]).unwrap();
        assert_eq!((first.index(), first.offsets()), (0, &[0, FIELD_ALIGN][..]));
        let handle = first.handle();
        drop(first);
        // Sent and not received: slot 0 is held.
        let second = ring.put(&[&[5]]).unwrap();
        assert_eq!(second.index(), 1);
        drop(second);
        let received = receive(&handle).unwrap();
        assert_eq!(&received.values()[..5], &[1, 2, 3, 4, 0]);
        assert_eq!(received.values()[FIELD_ALIGN], 9);
        assert!(segment_of(received.values().as_ptr() as usize).is_some());
        assert!(
            !Path::new(&handle.path).exists(),
            "the receiver unlinked it"
        );
        assert_eq!(ring.put(&[&[6]]).unwrap().index(), 1);
        drop(received);
        assert_eq!(ring.put(&[&[7]]).unwrap().index(), 0);
        ring.unlink_unreceived();
    }

    #[test]
    fn a_full_ring_grows_and_a_view_keeps_the_lease() {
        let ring = SlotRing::new();
        let slots: Vec<Slot> = (0..=INITIAL_SLOTS)
            .map(|_| ring.put(&[&[1; 10]]).unwrap())
            .collect();
        assert_eq!(ring.segments.lock().unwrap().len(), 2);
        let view = slots[0].view();
        drop(slots);
        assert_ne!(ring.put(&[&[2]]).unwrap().index(), 0, "viewed");
        drop(view);
        assert_eq!(ring.put(&[&[2]]).unwrap().index(), 0);
        let paths: Vec<PathBuf> = ring.created.lock().unwrap().clone();
        ring.unlink_unreceived();
        assert!(paths.iter().all(|p| !p.exists()));
    }

    #[test]
    fn a_handle_outside_its_segment_or_of_a_gone_segment_is_refused() {
        let ring = SlotRing::new();
        let slot = ring.put(&[&[1]]).unwrap();
        let mut handle = slot.handle();
        handle.len = 1 << 40;
        assert!(receive(&handle).is_err());
        let directory = segment_directories()[0].clone();
        let gone = Handle {
            path: directory
                .join(format!("{SEGMENT_PREFIX}1-0"))
                .to_string_lossy()
                .into_owned(),
            ..handle.clone()
        };
        let error = receive(&gone).unwrap_err().to_string();
        assert!(error.contains("is gone"), "{error}");
        let elsewhere = Handle {
            path: format!("/nonexistent/{SEGMENT_PREFIX}1-0"),
            ..handle
        };
        let error = receive(&elsewhere).unwrap_err().to_string();
        assert!(error.contains("not a ring segment"), "{error}");
        ring.unlink_unreceived();
    }
}
