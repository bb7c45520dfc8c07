"""How batches cross from ``DataLoader`` workers to the main process: the engine's batch slots.

Torch sends a worker's tensors to the main process by moving each one into a fresh shared-memory
block and passing its file descriptor; for whole batches of tokens that costs more than decoding
them. Here a worker's batch is copied, off the GIL, into a slot of a shared-memory segment the
worker owns (``o41_training_data.shared_slots``, docs/torch.md "Workers"); the tensors the worker
yields view the slot (:class:`RingTensor`, ordinary tensors to the worker's own code), and when
they cross a multiprocessing queue they pickle to the slot's handle, a few dozen bytes. The main
process views the same memory. A whole ``O41Batch`` crosses as one handle (:func:`split_mapping`,
:func:`join_mapping`).

A slot is reused only once the worker's own tensors of it are gone (a ``collate_fn`` may drop a
batch without sending it) and every handle sent for it was received and its tensors dropped:
the engine counts both, so nobody ever sees a batch change under them. Segment files never
outlive their use (see ``shared_slots``).
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Mapping
from multiprocessing import util
from multiprocessing.reduction import ForkingPickler
from typing import Any

import numpy as np
import pyarrow as pa
import torch
from o41_training_data import shared_slots

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

SEGMENT_PREFIX: str = shared_slots.SEGMENT_PREFIX
"""Segment files are named ``o41-ring-<worker pid>-<random>``."""

# Slot views are read-only NumPy arrays over engine memory that the protocol keeps unchanged;
# torch warns about read-only arrays, but sharing them is the point (this module's warnings only).
warnings.filterwarnings(
    "ignore", message="The given NumPy array is not writable", category=UserWarning, module=__name__
)


segment_directories = shared_slots.segment_directories
"""Where segments are created: ``/dev/shm`` when writable, then the temporary directory."""


class RingTensor(torch.Tensor):
    """A tensor viewing a ring slot inside a worker; it crosses to the main process as a handle.

    Only ``multiprocessing``'s pickler (what ``DataLoader`` queues use) sends the handle. Plain
    ``pickle``, ``copy`` and ``torch.save`` see an ordinary tensor, and every operation on it
    returns an ordinary tensor (``__torch_function__`` disabled), so collate functions and
    transforms that run in the worker behave as with any tensor.
    """

    # torch's documented way to make a subclass whose operations return plain tensors.
    __torch_function__ = torch._C._disabled_torch_function_impl  # type: ignore[assignment]
    # (slot, offset in the slot, nbytes, dtype, shape, as_bool, data_ptr, stride): where put()
    # wrote the field, to check at pickling that it still views exactly that.
    _o41_slot: tuple[Any, ...]

    def __reduce_ex__(self, protocol: Any) -> Any:
        plain: Any = self.as_subclass(torch.Tensor)
        return plain.__reduce_ex__(protocol)

    def __deepcopy__(self, memo: dict[int, Any]) -> torch.Tensor:
        plain: Any = self.as_subclass(torch.Tensor)
        copied: torch.Tensor = plain.__deepcopy__(memo)
        return copied


def _bytes_of(view: pa.Array) -> np.ndarray:
    # The pyarrow buffer keeps the engine's view, and so the slot, alive as long as this does.
    return np.frombuffer(view.buffers()[1], dtype=np.uint8, count=len(view))


def _field(
    base: np.ndarray, offset: int, nbytes: int, dtype: str, shape: tuple[int, ...], as_bool: bool
) -> torch.Tensor:
    tensor = torch.from_numpy(base[offset : offset + nbytes].view(dtype).reshape(shape))
    return tensor.view(torch.bool) if as_bool else tensor


class WorkerRing:
    """A worker process's segments; :meth:`put` copies a batch into a free slot."""

    def __init__(self) -> None:
        self.pid = os.getpid()
        self.slots = shared_slots.SlotRing()
        # Runs when the worker exits, after DataLoader stopped reading its queue; the main
        # process unlinks every segment it mapped, so only never-mapped ones are left.
        util.Finalize(None, self.slots.unlink_unreceived, exitpriority=-10)

    def put(
        self, columns: pa.RecordBatch, arrays: Mapping[str, np.ndarray], bool_fields: frozenset[str]
    ) -> dict[str, torch.Tensor]:
        """Copies ``columns`` into a free slot; tensors viewing it, shaped as ``arrays`` (its views)."""
        slot = self.slots.put(columns)
        base = _bytes_of(slot.view())
        out: dict[str, torch.Tensor] = {}
        for (name, array), offset in zip(arrays.items(), slot.offsets, strict=True):
            as_bool = name in bool_fields
            spec = (offset, array.nbytes, array.dtype.str, tuple(array.shape), as_bool)
            tensor = _field(base, *spec).as_subclass(RingTensor)
            tensor._o41_slot = (slot, *spec, tensor.data_ptr(), tensor.stride())
            out[name] = tensor
        return out


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
        tensor.data_ptr() != field[6]
        or tensor.stride() != field[7]
        or tensor.shape != field[4]
        or tensor.requires_grad
    ):
        return None  # changed in place since put() (a transpose_, requires_grad_)
    return field


def _reduce_ring_tensor(tensor: RingTensor) -> Any:
    field = _intact(tensor)
    if field is None:
        from torch.multiprocessing import reductions

        torch_reduction: Any = reductions.reduce_tensor
        return torch_reduction(tensor.as_subclass(torch.Tensor))
    # handle() holds the slot until the main process's tensors of it are gone.
    return (_rebuild, (field[0].handle(), field[1:6]))


ForkingPickler.register(RingTensor, _reduce_ring_tensor)


def split_mapping(values: Mapping[str, Any]) -> tuple[Any, dict[str, Any]] | None:
    """One handle for all the slot fields of ``values`` and the other values, or None.

    None when no value is an intact slot field or they come from several slots; then each value
    pickles on its own. Call only while pickling ``values`` for the main process.
    """
    fields: dict[str, tuple[Any, ...]] = {}
    others: dict[str, Any] = {}
    slot: Any = None
    for name, value in values.items():
        field = _intact(value) if isinstance(value, RingTensor) else None
        if field is None:
            others[name] = value
            continue
        if slot is None:
            slot = field[0]
        elif field[0] is not slot:
            return None
        fields[name] = field[1:6]
    if slot is None:
        return None
    return (slot.handle(), fields, tuple(values)), others


def join_mapping(handle: Any, others: dict[str, Any]) -> dict[str, Any]:
    """The inverse of :func:`split_mapping` in the main process: a dict in the original key order."""
    slot, fields, order = handle
    base = _bytes_of(shared_slots.receive(slot))
    return {name: _field(base, *fields[name]) if name in fields else others[name] for name in order}


# -- The main process's side.


def _rebuild(slot: tuple[str, int, int, int, int], field: tuple[Any, ...]) -> torch.Tensor:
    """Unpickles a ring handle: a tensor viewing the slot in this process, without a copy."""
    return _field(_bytes_of(shared_slots.receive(slot)), *field)


def segment_of(tensor: torch.Tensor) -> str | None:
    """The path of the ring segment whose memory ``tensor`` views in this process, if any."""
    return shared_slots.segment_of(tensor.data_ptr())
