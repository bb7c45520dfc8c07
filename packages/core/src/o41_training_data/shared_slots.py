"""Batch slots in shared memory: a loader's worker process hands batches over by a small handle.

The engine's ``shared_slots`` (docs/torch.md, "Workers"): a worker's :class:`SlotRing` copies a
batch's fixed-shape columns into a free slot of a segment it owns (a file in ``/dev/shm``, else
the temporary directory), off the GIL; :meth:`BatchSlot.handle` names the slot; :func:`receive`
in another process maps the segment once and views the slot without a copy. A slot is reused
only once the worker's own views of it are gone and every handle sent for it was received and
its view dropped. The PyTorch adapter's ``DataLoader`` workers use it; so can any loader that
moves batches between processes.

Examples:
    >>> slot = SlotRing().put(batch.columns)  # in the worker  # doctest: +SKIP
    >>> handle = slot.handle()  # only when it is sent  # doctest: +SKIP
    >>> view = receive(handle)  # in the receiving process: a uint8 pyarrow array  # doctest: +SKIP

"""

from __future__ import annotations

from ._core import SHARED_SEGMENT_PREFIX as SEGMENT_PREFIX
from ._core import BatchSlot, SlotRing
from ._core import receive_slot as receive
from ._core import shared_segment_directories as segment_directories
from ._core import shared_segment_of as segment_of

__all__ = ["SEGMENT_PREFIX", "BatchSlot", "SlotRing", "receive", "segment_directories", "segment_of"]
