"""A shared-memory batch ring between ``DataLoader`` workers and the main process.

Torch sends a worker's tensors to the main process by moving each one into a fresh shared-memory
block and passing its file descriptor; for whole batches of tokens that costs more than decoding
them. Here each worker owns a few segments (plain files in ``/dev/shm``, mapped shared) cut into
slots. The worker copies a batch into a free slot and yields tensors viewing it
(:class:`RingTensor`, ordinary tensors to the worker's own code); when they cross a
multiprocessing queue they pickle to a handle of a few dozen bytes (segment path, slot,
generation, offsets, dtypes, shapes), and the main process unpickles it into tensors viewing the
same memory, mapping each segment once. A whole ``O41Batch`` crosses as one handle
(:func:`split_mapping`, :func:`join_mapping`).

Slot lifetime is exact, so nobody ever sees a batch change under them. A slot is reused only
when both are true:

- the worker's own tensors of it are gone (a weak reference to the slot's base array: a
  ``collate_fn`` may drop a batch without sending it);
- the main process has dropped every tensor it unpickled from it: pickling a handle sets the
  slot's byte in the segment header, and the main process clears it from the weak reference
  callback of the one NumPy array that all the slot's tensors there view.

When no slot is free the worker adds a segment (it never waits and never overwrites), with slots
sized for the batch at hand.

Segment files never outlive their use: the main process unlinks a segment as soon as it has
mapped it, and a worker unlinks, when it exits, the segments the main process never mapped. Only
a worker killed (SIGKILL) between creating a segment and the main process receiving its first
batch from it can leave an ``o41-ring-<pid>-*`` file behind.
"""

from __future__ import annotations

import contextlib
import errno
import mmap
import os
import secrets
import tempfile
import threading
import weakref
from collections.abc import Mapping
from multiprocessing import util
from multiprocessing.reduction import ForkingPickler
from typing import Any

import numpy as np
import torch

__all__ = [
    "SEGMENT_PREFIX",
    "RingTensor",
    "WorkerRing",
    "join_mapping",
    "segment_directories",
    "segment_of",
    "split_mapping",
    "worker_ring",
]

SEGMENT_PREFIX = "o41-ring-"
"""Segment files are named ``o41-ring-<worker pid>-<random>``."""

INITIAL_SLOTS = 4
"""Slots of a worker's first segment for a batch size: the ``DataLoader``'s default
``prefetch_factor`` (2) batches in flight, the one the trainer holds and the one it just let go
of. A worker needing more adds segments."""
MAX_SLOTS_PER_SEGMENT = 64
"""Growth doubles a worker's slots for a batch size up to this many per segment, so a trainer
that keeps many batches costs a handful of segments, not one per batch."""
# The header holds one "the main process may hold it" byte per slot; slots start page-aligned.
_PAGE = 4096
_HEADER_BYTES = _PAGE
_FIELD_ALIGN = 64  # cache-line aligned fields


def segment_directories() -> list[str]:
    """Where segments are created, in order of preference.

    ``/dev/shm`` (RAM-backed) first when it exists and is writable; the temporary directory is
    the fallback, also taken when ``/dev/shm`` is full.
    """
    candidates = []
    if os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK | os.X_OK):
        candidates.append("/dev/shm")
    candidates.append(tempfile.gettempdir())
    return candidates


def _round_up(n: int, to: int) -> int:
    return -(-n // to) * to


class RingTensor(torch.Tensor):
    """A tensor viewing a ring slot inside a worker; it crosses to the main process as a handle.

    Only ``multiprocessing``'s pickler (what ``DataLoader`` queues use) sends the handle. Plain
    ``pickle``, ``copy`` and ``torch.save`` see an ordinary tensor, and every operation on it
    returns an ordinary tensor (``__torch_function__`` disabled), so collate functions and
    transforms that run in the worker behave as with any tensor.
    """

    # torch's documented way to make a subclass whose operations return plain tensors.
    __torch_function__ = torch._C._disabled_torch_function_impl  # type: ignore[assignment]
    # (segment, slot, generation, offset in the slot, nbytes, dtype, shape, as_bool, data_ptr,
    # stride): where put() wrote the field, to check at pickling that it still views exactly that.
    _o41_slot: tuple[Any, ...]

    def __reduce_ex__(self, protocol: Any) -> Any:
        plain: Any = self.as_subclass(torch.Tensor)
        return plain.__reduce_ex__(protocol)

    def __deepcopy__(self, memo: dict[int, Any]) -> torch.Tensor:
        plain: Any = self.as_subclass(torch.Tensor)
        copied: torch.Tensor = plain.__deepcopy__(memo)
        return copied


def _reserve(fd: int, size: int) -> None:
    # Reserve the pages now: a full /dev/shm then fails here with ENOSPC, instead of killing
    # the worker with SIGBUS at its first write into the mapping.
    fallocate = getattr(os, "posix_fallocate", None)  # not on macOS
    if fallocate is not None:
        try:
            fallocate(fd, 0, size)
            return
        except OSError as e:
            if e.errno not in (errno.EOPNOTSUPP, errno.EINVAL):  # a filesystem without it
                raise
    os.ftruncate(fd, size)


class _OwnedSegment:
    """A worker's segment: the file it created, mapped, and which of its slots are in use."""

    def __init__(self, path: str, slots: int, slot_bytes: int) -> None:
        self.path = path
        self.slots = slots
        self.slot_bytes = slot_bytes
        size = _HEADER_BYTES + slots * slot_bytes
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0), 0o600)
        try:
            _reserve(fd, size)
            self.memory = mmap.mmap(fd, size, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
        except BaseException:
            os.close(fd)
            os.unlink(path)
            raise
        os.close(fd)
        # The header: 1 while the main process may hold tensors of the slot (set when a handle
        # is pickled, cleared by the main process).
        self.sent = np.frombuffer(self.memory, dtype=np.uint8, count=slots)
        self.generations = [0] * slots
        # The worker's own tensors of a slot are alive while its base array is: a weak reference
        # to it per slot in use (a collate_fn may drop them without sending anything). Keyed by
        # the reference's id: arrays, hence references to them, are unhashable.
        self.held: dict[int, tuple[weakref.ref[np.ndarray], int]] = {}

    def free_slot(self) -> int | None:
        held = {slot for _, slot in self.held.values()}
        slot = self.memory.find(b"\0", 0, self.slots)  # C-speed: a trainer may keep many slots
        while slot in held:
            slot = self.memory.find(b"\0", slot + 1, self.slots)
        return slot if slot >= 0 else None

    def fill(self, slot: int) -> tuple[np.ndarray, int]:
        """The slot's base array (every field view of it keeps it alive), and its generation."""
        start = _HEADER_BYTES + slot * self.slot_bytes
        # Straight over the mapping: NumPy collapses a view of a view onto the outer array, so
        # views of a slice of a whole-segment array would not keep the slice alive.
        base = np.frombuffer(self.memory, dtype=np.uint8, count=self.slot_bytes, offset=start)
        ref = weakref.ref(base, self._unheld)
        self.held[id(ref)] = (ref, slot)
        self.generations[slot] += 1
        return base, self.generations[slot]

    def _unheld(self, ref: weakref.ref[np.ndarray]) -> None:
        del self.held[id(ref)]


class WorkerRing:
    """A worker process's segments; :meth:`put` copies a batch into a free slot."""

    def __init__(self) -> None:
        self.pid = os.getpid()
        self.segments: list[_OwnedSegment] = []
        self._paths: list[str] = []
        # Runs when the worker process exits, after DataLoader stopped reading its queue; the
        # main process unlinks every segment it mapped, so only never-mapped ones are left.
        util.Finalize(None, _unlink_paths, args=(self._paths, self.pid), exitpriority=-10)

    def put(self, arrays: dict[str, np.ndarray], bool_fields: frozenset[str]) -> dict[str, torch.Tensor]:
        """Copies ``arrays`` into a free slot; returns tensors viewing it (``bool_fields`` as bool)."""
        layout: list[tuple[str, np.ndarray, int]] = []
        offset = 0
        for name, array in arrays.items():
            layout.append((name, array, offset))
            offset = _round_up(offset + array.nbytes, _FIELD_ALIGN)
        segment, slot = self._free_slot(max(offset, 1))
        base, generation = segment.fill(slot)
        out: dict[str, torch.Tensor] = {}
        for name, array, field_offset in layout:
            nbytes = array.nbytes
            view = base[field_offset : field_offset + nbytes].view(array.dtype).reshape(array.shape)
            np.copyto(view, array, casting="no")
            as_bool = name in bool_fields
            tensor = torch.from_numpy(view)
            ring_tensor = (tensor.view(torch.bool) if as_bool else tensor).as_subclass(RingTensor)
            ring_tensor._o41_slot = (
                segment,
                slot,
                generation,
                field_offset,
                nbytes,
                array.dtype.str,
                array.shape,
                as_bool,
                ring_tensor.data_ptr(),
                ring_tensor.stride(),
            )
            out[name] = ring_tensor
        return out

    def _free_slot(self, nbytes: int) -> tuple[_OwnedSegment, int]:
        fitting = [s for s in self.segments if s.slot_bytes >= nbytes]
        for segment in fitting:
            slot = segment.free_slot()
            if slot is not None:
                return segment, slot
        # Grow instead of waiting: whoever holds the busy slots may hold them forever.
        slots = min(MAX_SLOTS_PER_SEGMENT, max(INITIAL_SLOTS, sum(s.slots for s in fitting)))
        segment = self._create(slots, _round_up(nbytes, _PAGE))
        self.segments.append(segment)
        return segment, 0

    def _create(self, slots: int, slot_bytes: int) -> _OwnedSegment:
        error: OSError | None = None
        for directory in segment_directories():
            path = os.path.join(directory, f"{SEGMENT_PREFIX}{self.pid}-{secrets.token_hex(8)}")
            self._paths.append(path)  # before creating: an exit mid-way still unlinks it
            try:
                return _OwnedSegment(path, slots, slot_bytes)
            except OSError as e:
                self._paths.remove(path)
                if e.errno not in (errno.ENOSPC, errno.EACCES, errno.EPERM, errno.EROFS):
                    raise
                error = e
        assert error is not None
        raise error


def _unlink_paths(paths: list[str], pid: int) -> None:
    if os.getpid() != pid:  # a forked child inherits the list, not the segments
        return
    for path in paths:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)


_worker_ring: WorkerRing | None = None


def worker_ring() -> WorkerRing:
    """The ring of this process, created on first use (a forked child never reuses its parent's)."""
    global _worker_ring
    if _worker_ring is None or _worker_ring.pid != os.getpid():
        _worker_ring = WorkerRing()
    return _worker_ring


# -- Crossing the queue (in the worker).


def _intact(tensor: torch.Tensor) -> tuple[Any, ...] | None:
    """Where ``tensor`` lives in the ring, unless it is not (or no longer exactly) a slot field."""
    if type(tensor) is not RingTensor:
        return None
    field = tensor._o41_slot
    if (
        tensor.data_ptr() != field[8]
        or tensor.stride() != field[9]
        or tensor.shape != field[6]
        or tensor.requires_grad
    ):
        return None  # changed in place since put() (a transpose_, requires_grad_)
    return field


def _slot_handle(field: tuple[Any, ...]) -> tuple[str, int, int, int, int]:
    segment, slot, generation = field[0], field[1], field[2]
    # Set before the bytes leave: the main process clears it when its tensors are gone.
    segment.sent[slot] = 1
    return (segment.path, slot, generation, _HEADER_BYTES + slot * segment.slot_bytes, segment.slot_bytes)


def _field_spec(field: tuple[Any, ...]) -> tuple[int, int, str, tuple[int, ...], bool]:
    return (field[3], field[4], field[5], tuple(field[6]), field[7])


def _reduce_ring_tensor(tensor: RingTensor) -> Any:
    field = _intact(tensor)
    if field is None:
        from torch.multiprocessing import reductions

        torch_reduction: Any = reductions.reduce_tensor
        return torch_reduction(tensor.as_subclass(torch.Tensor))
    return (_rebuild, (_slot_handle(field), _field_spec(field)))


ForkingPickler.register(RingTensor, _reduce_ring_tensor)


def split_mapping(values: Mapping[str, Any]) -> tuple[Any, dict[str, Any]] | None:
    """One handle for all the slot fields of ``values`` and the other values, or None.

    None when no value is an intact slot field or they come from several slots; then each value
    pickles on its own. Call only while pickling ``values`` for the main process.
    """
    fields: dict[str, tuple[int, int, str, tuple[int, ...], bool]] = {}
    others: dict[str, Any] = {}
    first: tuple[Any, ...] | None = None
    for name, value in values.items():
        field = _intact(value) if isinstance(value, RingTensor) else None
        if field is None:
            others[name] = value
            continue
        if first is None:
            first = field
        elif field[:3] != first[:3]:
            return None
        fields[name] = _field_spec(field)
    if first is None:
        return None
    return (_slot_handle(first), fields, tuple(values)), others


def join_mapping(handle: Any, others: dict[str, Any]) -> dict[str, Any]:
    """The inverse of :func:`split_mapping` in the main process: a dict in the original key order."""
    slot, fields, order = handle
    base = _base(*slot)
    return {name: _field(base, *fields[name]) if name in fields else others[name] for name in order}


# -- The main process's side.


class _MappedSegment:
    """A segment the main process mapped (and unlinked) on the first handle naming it."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.pid = os.getpid()
        name = os.path.basename(path)
        self.owner = int(name[len(SEGMENT_PREFIX) :].split("-", 1)[0])
        try:
            fd = os.open(path, os.O_RDWR | getattr(os, "O_CLOEXEC", 0))
        except FileNotFoundError:
            raise RuntimeError(
                f"o41 ring segment {path} is gone: its DataLoader worker exited before this "
                "process received the batch"
            ) from None
        try:
            size = os.fstat(fd).st_size
            self.memory = mmap.mmap(fd, size, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
        finally:
            os.close(fd)
        # The mapping keeps the memory; the name is no longer needed by anyone.
        os.unlink(path)
        self.sent = np.frombuffer(self.memory, dtype=np.uint8, count=_HEADER_BYTES)
        self.address = int(self.sent.ctypes.data)
        self.size = len(self.memory)
        # A weak reference per slot base array alive here (by id: arrays are unhashable); its
        # callback frees the slot.
        self.bases: dict[int, tuple[weakref.ref[np.ndarray], int]] = {}
        _all_mapped.add(self)

    def _released(self, ref: weakref.ref[np.ndarray], getpid: Any = os.getpid) -> None:
        # (getpid bound early: this may run during interpreter shutdown, after `os` is gone.)
        _, slot = self.bases.pop(id(ref))
        # A process forked from this one inherits its tensors and this mapping; its garbage
        # collector must not free a slot that this process still uses.
        if getpid() == self.pid:
            self.sent[slot] = 0

    def owner_alive(self) -> bool:
        try:
            os.kill(self.owner, 0)
        except ProcessLookupError:
            return False
        except PermissionError:  # pragma: no cover - alive, another user's
            return True
        return True


_lock = threading.Lock()  # the pin-memory thread unpickles too
_mapped: dict[str, _MappedSegment] = {}  # live owners' segments, by path
# Every segment some tensor still views (each base array's weak reference callback holds it).
_all_mapped: weakref.WeakSet[_MappedSegment] = weakref.WeakSet()
# One base array per filled slot, shared by all its fields however many handles name them.
_bases: weakref.WeakValueDictionary[tuple[str, int, int], np.ndarray] = weakref.WeakValueDictionary()


def _segment(path: str) -> _MappedSegment:
    segment = _mapped.get(path)
    if segment is None:
        # A dead worker sends nothing more: forget its segments (the slots still viewed keep
        # theirs alive) so the memory goes with the last tensor.
        for other in [s for s in _mapped.values() if not s.owner_alive()]:
            del _mapped[other.path]
        segment = _mapped[path] = _MappedSegment(path)
    return segment


def _base(path: str, slot: int, generation: int, start: int, slot_bytes: int) -> np.ndarray:
    key = (path, slot, generation)
    with _lock:
        base = _bases.get(key)
        if base is None:
            segment = _segment(path)
            # Straight over the mapping, so the field views keep this very array alive.
            base = np.frombuffer(segment.memory, dtype=np.uint8, count=slot_bytes, offset=start)
            ref = weakref.ref(base, segment._released)
            segment.bases[id(ref)] = (ref, slot)
            _bases[key] = base
    return base


def _field(
    base: np.ndarray, offset: int, nbytes: int, dtype: str, shape: tuple[int, ...], as_bool: bool
) -> torch.Tensor:
    tensor = torch.from_numpy(base[offset : offset + nbytes].view(dtype).reshape(shape))
    return tensor.view(torch.bool) if as_bool else tensor


def _rebuild(
    slot: tuple[str, int, int, int, int], field: tuple[int, int, str, tuple[int, ...], bool]
) -> torch.Tensor:
    """Unpickles a ring handle: a tensor viewing the slot in this process, without a copy."""
    return _field(_base(*slot), *field)


def segment_of(tensor: torch.Tensor) -> str | None:
    """The path of the ring segment whose memory ``tensor`` views in this process, if any."""
    pointer = tensor.data_ptr()
    with _lock:
        for segment in list(_all_mapped):
            if segment.address <= pointer < segment.address + segment.size:
                return segment.path
    return None
