"""``o41_training_data.shared_slots``: batches handed between processes by a small handle, through
the core alone (the PyTorch adapter's workers are one user; docs/torch.md, "Workers")."""

from __future__ import annotations

import multiprocessing
import pickle

import numpy as np
import pyarrow as pa
import pytest
from o41_training_data import shared_slots


def tokens(values: np.ndarray) -> pa.RecordBatch:
    column = pa.FixedSizeListArray.from_arrays(pa.array(values.reshape(-1)), values.shape[1])
    return pa.record_batch({"tokens": column})


def received_sum(handle: tuple[str, int, int, int, int]) -> int:
    """In another process: the slot's first field as int32 values, summed."""
    view = shared_slots.receive(handle)
    return int(np.frombuffer(view.buffers()[1], dtype=np.int32, count=12).sum())


def test_another_process_reads_the_slot_and_it_is_free_once_released() -> None:
    ring = shared_slots.SlotRing()
    try:
        values = np.arange(12, dtype=np.int32).reshape(3, 4)
        slot = ring.put(tokens(values))
        assert (slot.index, slot.offsets) == (0, [0])
        handle = slot.handle()
        assert len(pickle.dumps(handle)) < 256  # what crosses a queue, whatever the batch's size
        del slot
        # Sent and not yet received: the next batch takes another slot.
        assert ring.put(tokens(values)).index == 1
        with multiprocessing.get_context("spawn").Pool(1) as pool:
            assert pool.apply(received_sum, (handle,)) == int(values.sum())
        # The receiver's view is gone with its process: the slot is free again.
        assert ring.put(tokens(values)).index == 0
    finally:
        ring.unlink_unreceived()


def test_a_view_in_this_process_keeps_its_bytes_and_names_its_segment() -> None:
    ring = shared_slots.SlotRing()
    try:
        values = np.arange(8, dtype=np.int32).reshape(2, 4)
        handle = ring.put(tokens(values)).handle()
        view = shared_slots.receive(handle)
        array = np.frombuffer(view.buffers()[1], dtype=np.int32, count=8)
        assert shared_slots.segment_of(array.ctypes.data) == handle[0]
        for _ in range(8):  # held: never written while viewed
            ring.put(tokens(values + 100))
        assert array.tolist() == list(range(8))
        assert handle[0].rsplit("/", 1)[-1].startswith(shared_slots.SEGMENT_PREFIX)
        assert handle[0].rsplit("/", 1)[0] in shared_slots.segment_directories()
    finally:
        ring.unlink_unreceived()


def test_only_fixed_shape_columns_and_segment_files_are_taken() -> None:
    ring = shared_slots.SlotRing()
    try:
        with pytest.raises(OSError, match='column "text" is not a fixed-shape numeric column'):
            ring.put(pa.record_batch({"text": pa.array(["a", "b"])}))
        with pytest.raises(OSError, match="not a ring segment"):
            shared_slots.receive(("/etc/passwd", 0, 1, 4096, 4096))
    finally:
        ring.unlink_unreceived()
