"""Batch streams: opening, iterating, advancing, checkpointing and resuming."""

from __future__ import annotations

import json
from dataclasses import dataclass
from types import TracebackType
from typing import Any

import numpy as np
import pyarrow as pa

from . import _core
from ._config import BatchStreamConfig
from ._core import Checkpoint
from ._errors import CheckpointError
from ._storage import StorageConfig

__all__ = [
    "Batch",
    "BatchStream",
    "Checkpoint",
    "MemoryBound",
    "StreamStats",
    "open_batch_stream",
    "resolve_batch_stream_config",
    "resume_batch_stream",
]

_Segment = tuple[int, int, int, int, int]


def _numpy_view(column: pa.Array, rows: int) -> np.ndarray:
    """A NumPy view shaped ``(rows, *dims)`` over a fixed-shape column's Arrow buffer."""
    dims: list[int] = []
    values: pa.Array = column
    while pa.types.is_fixed_size_list(values.type):
        dims.append(values.type.list_size)
        # The engine builds columns without offsets, so the child covers exactly these rows.
        values = values.values
    # np.frombuffer over the data buffer: a view, and unlike Array.to_numpy it never makes
    # pyarrow import pandas (a second's delay before the first batch where pandas is installed).
    dtype = np.dtype(values.type.to_pandas_dtype())
    flat = np.frombuffer(
        values.buffers()[1], dtype=dtype, count=len(values), offset=values.offset * dtype.itemsize
    )
    return flat.reshape((rows, *dims))


class Batch:
    """One batch of fixed-shape columns.

    ``columns`` is the ``pyarrow.RecordBatch`` that crossed from Rust through the Arrow C data
    interface; :meth:`arrays` views its buffers as NumPy arrays without copying.
    """

    __slots__ = ("_arrays", "_segment", "_stream", "batch_index", "columns", "local_index", "stage")

    def __init__(
        self,
        columns: pa.RecordBatch,
        stage: int,
        batch_index: int,
        local_index: int,
        segment: _Segment,
        stream: BatchStream,
    ) -> None:
        self.columns: pa.RecordBatch = columns
        """The projected columns; one ``FixedSizeList`` level per axis."""
        self.stage: int = stage
        """Stage that was active when the batch was produced."""
        self.batch_index: int = batch_index
        """Global batch number, the same on every rank; rank r of W sees g with g % W == r."""
        self.local_index: int = local_index
        """This rank's batch number since the stream was opened or resumed."""
        self._segment = segment
        self._stream = stream
        self._arrays: dict[str, np.ndarray] | None = None

    @property
    def num_rows(self) -> int:
        """Rows in the batch (the stage's batch size)."""
        return int(self.columns.num_rows)

    def arrays(self) -> dict[str, np.ndarray]:
        """Read-only NumPy views shaped ``(rows, *dims)``, keyed by field name.

        ``i32``/``i64``/``f32``/``f64`` keep their dtype; ``bool`` is ``uint8`` 0/1.

        Example:
            >>> batch.arrays()["tokens"].shape  # doctest: +SKIP
            (32, 2048)

        """
        if self._arrays is None:
            rows = self.num_rows
            self._arrays = {
                name: _numpy_view(self.columns.column(i), rows)
                for i, name in enumerate(self.columns.schema.names)
            }
        return self._arrays

    def position(self) -> str:
        """The position just after this batch as a small JSON text, without the resolved config.

        Framework adapters send it from worker processes with every batch; combine it with the
        stream's resolved config through :meth:`Checkpoint.from_position`.
        """
        return self._stream._core.position_at(self.local_index + 1, self._segment)

    def checkpoint(self) -> Checkpoint:
        """The stream position just after this batch (this batch and all before it consumed).

        Cheap to call for every batch: a trainer that prefetches keeps the checkpoint of the
        batch it last trained on, not of the last one fetched.
        """
        return self._stream._core.checkpoint_at(self.local_index + 1, self._segment)

    def __repr__(self) -> str:
        shapes = ", ".join(f"{k}={v.dtype}{list(v.shape)}" for k, v in self.arrays().items())
        return f"Batch(stage={self.stage}, batch_index={self.batch_index}, {shapes})"


@dataclass(frozen=True)
class StreamStats:
    """Delivery counters of a stream."""

    batches_yielded: int
    """Batches this rank has received over the run (resumed streams continue the count)."""
    rows_yielded: int
    """Rows this rank has received over the run."""
    dropped_rows: int
    """Rows of the active finite stage that no rank receives: the final round of
    ``world_size`` global batches that cannot be filled, and any partial batch."""


@dataclass(frozen=True)
class MemoryBound:
    """The stream's working-set bound in bytes, by term, and the limit it was checked against."""

    batches: int
    """Batches queued for the consumer and held by it, plus two planned groups of rows."""
    decode_units: int
    """Decoded rows of read jobs in flight."""
    readers: int
    """Open shard readers' buffers."""
    decode_scratch: int
    """Decoders' working memory (Parquet column chunks, the longest line or frame)."""
    total: int
    """The bound: the sum of the terms."""
    limit: int
    """``memory_limit_bytes``, or half the host's physical memory."""


class BatchStream:
    """An open, iterable batch stream; also a context manager.

    Open one with :func:`open_batch_stream` or :func:`resume_batch_stream`. Iterating yields
    :class:`Batch` objects; a finite stage ends with ``StopIteration``. ``close()`` stops the
    engine's threads after the read in flight and is idempotent; using a closed stream raises
    :class:`StreamClosedError`.

    Example:
        >>> with open_batch_stream(config) as stream:  # doctest: +SKIP
        ...     for batch in stream:
        ...         tokens = batch.arrays()["tokens"]

    """

    def __init__(self, core: _core.Stream) -> None:
        self._core = core

    def __iter__(self) -> BatchStream:
        return self

    def __next__(self) -> Batch:
        item = self._core.next_batch()
        if item is None:
            raise StopIteration
        columns, stage, batch_index, local_index, segment = item
        return Batch(columns, stage, batch_index, local_index, segment, self)

    def __enter__(self) -> BatchStream:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def close(self) -> None:
        """Stops the stream, waiting for the shard read in flight. Idempotent."""
        self._core.close()

    @property
    def closed(self) -> bool:
        """True once :meth:`close` has run."""
        return self._core.closed

    @property
    def stage(self) -> int:
        """The active stage."""
        return self._core.stage

    def advance(self, stage: int) -> None:
        """Switches to ``stage`` at the next batch boundary.

        Takes effect after the batches already received: prefetched batches of the old stage
        are discarded (their rows are not lost), rows still in the old stage's shuffle window
        are delivered first, then the new stage starts. A same-stage advance is a no-op. With
        several ranks, call it after the same number of local batches on every rank. Waits for
        the shard read in flight.
        """
        self._core.advance(stage)

    def checkpoint(self) -> Checkpoint:
        """The position after the last delivered batch, which counts as consumed."""
        return self._core.checkpoint()

    @property
    def stats(self) -> StreamStats:
        """Delivery counters."""
        return StreamStats(**self._core.stats())

    @property
    def memory_bound(self) -> MemoryBound:
        """The working-set bound computed at open."""
        return MemoryBound(**self._core.memory_bound())

    def resolved_config(self) -> dict[str, Any]:
        """The resolved config document this stream runs (see :func:`resolve_batch_stream_config`)."""
        result: dict[str, Any] = json.loads(self._core.resolved_json())
        return result


def open_batch_stream(
    config: BatchStreamConfig,
    *,
    share: tuple[int, int] = (0, 1),
    storage: StorageConfig | None = None,
) -> BatchStream:
    """Opens a stream, eagerly, over local shards or, with ``storage``, ``s3://`` ones too.

    Every shard is opened, counted and checked against the projected fields before this
    returns, so a missing file, an unknown encoding or a field that no record carries raises
    here, not at the first ``next``. ``share=(offset, stride)`` yields only this rank's local
    batches ``offset, offset + stride, ...``: a framework adapter's worker ``w`` of ``N`` uses
    ``(w, N)``, so the workers' batches taken in turn are the rank's sequence. An ``s3://``
    source without ``storage`` (see :class:`TrainingData`) raises :class:`ConfigError` here.

    Example:
        >>> stream = open_batch_stream(config)  # doctest: +SKIP

    """
    offset, stride = share
    return BatchStream(_core.Stream(config.to_json(), offset, stride, _core_storage(storage)))


def resume_batch_stream(
    checkpoint: Checkpoint,
    *,
    rank: int | None = None,
    world_size: int | None = None,
    config: BatchStreamConfig | None = None,
    share: tuple[int, int] = (0, 1),
    storage: StorageConfig | None = None,
) -> BatchStream:
    """Re-opens the stream ``checkpoint`` was taken from, eagerly, right after its last batch.

    The checkpoint belongs to one rank: pass this process's ``rank``/``world_size`` to have a
    mismatch refused (use :meth:`Checkpoint.for_world` to move a position to another world
    size on purpose). Pass ``config`` to have a checkpoint of a different stream refused. The
    shards are re-opened; any whose row count changed since is refused. ``share`` is as in
    :func:`open_batch_stream`, counted from the checkpoint's position. The checkpoint holds
    no credentials: pass ``storage`` again to re-open ``s3://`` shards.

    Example:
        >>> checkpoint = Checkpoint.from_json(path.read_text())  # doctest: +SKIP
        >>> stream = resume_batch_stream(checkpoint, rank=0, world_size=2)  # doctest: +SKIP

    """
    if (rank is not None and rank != checkpoint.rank) or (
        world_size is not None and world_size != checkpoint.world_size
    ):
        raise CheckpointError(
            f"checkpoint refused: it belongs to rank {checkpoint.rank} of {checkpoint.world_size}, "
            f"this process is rank {rank} of {world_size}; resume each rank from its own "
            "checkpoint, or move the position with checkpoint.for_world(rank, world_size)"
        )
    if config is not None:
        resolved = resolve_batch_stream_config(config, storage=storage)
        expected = json.loads(checkpoint.resolved_json())
        if resolved["fields"] != expected["fields"] or resolved["stages"] != expected["stages"]:
            raise CheckpointError(
                "checkpoint refused: it was taken from a stream with other sources, fields or "
                "stages than this config; the file list or projection changed"
            )
        if resolved["seed"] != expected["seed"]:
            raise CheckpointError(
                f"checkpoint refused: seed {expected['seed']} != config seed {resolved['seed']}"
            )
    offset, stride = share
    return BatchStream(_core.Stream.resume(checkpoint, offset, stride, _core_storage(storage)))


def resolve_batch_stream_config(
    config: BatchStreamConfig, *, storage: StorageConfig | None = None
) -> dict[str, Any]:
    """The resolved document a stream over ``config`` would run.

    It pins every shard's absolute path, encoding and row count, plus the config's own
    settings; it holds no credentials. A checkpoint stores the same document.

    Example:
        >>> resolved = resolve_batch_stream_config(config)  # doctest: +SKIP
        >>> [s["rows"] for s in resolved["stages"][0]["sources"][0]["shards"]]  # doctest: +SKIP
        [1000, 1000]

    """
    result: dict[str, Any] = json.loads(_core.resolve_config(config.to_json(), _core_storage(storage)))
    return result


def _core_storage(storage: StorageConfig | None) -> _core.Storage | None:
    return None if storage is None else storage.core()
