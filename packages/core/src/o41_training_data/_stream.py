"""Batch streams: opening, iterating, advancing, checkpointing and resuming."""

from __future__ import annotations

import json
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any

import numpy as np
import pyarrow as pa

from . import _core
from ._config import BatchStreamConfig, config_json
from ._core import Checkpoint, Drain, Position, Segment
from ._errors import ConfigError, StreamClosedError
from ._stats import (
    DecodeStats,
    MixShare,
    ReadStats,
    SourceStats,
    StageDelivered,
    _minus_read,
    _mixture,
    _stages,
)
from ._storage import StorageConfig

__all__ = [
    "Batch",
    "BatchStream",
    "Checkpoint",
    "Drain",
    "MemoryBound",
    "Position",
    "Segment",
    "StreamStats",
    "TokenStats",
    "open_batch_stream",
    "resolve_batch_stream_config",
    "resume_batch_stream",
]


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

    __slots__ = ("_arrays", "_stream", "batch_index", "columns", "local_index", "position", "stage")

    def __init__(
        self,
        columns: pa.RecordBatch,
        stage: int,
        batch_index: int,
        local_index: int,
        position: Position,
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
        self.position: Position = position
        """The rank's position once this batch (and every one before it) is consumed.

        Adapters send it along with the batch; :meth:`Checkpoint.from_position` or
        :meth:`BatchStream.checkpoint` turn it into a checkpoint.
        """
        self._stream = stream
        self._arrays: dict[str, np.ndarray] | None = None

    @property
    def num_rows(self) -> int:
        """Rows in the batch (the stage's batch size)."""
        return int(self.columns.num_rows)

    def arrays(self) -> dict[str, np.ndarray]:
        """Read-only NumPy views shaped ``(rows, *dims)``, keyed by field name.

        ``i32``/``i64``/``f32``/``f64`` keep their dtype; ``bool`` is ``uint8`` 0/1.

        Examples:
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

    def checkpoint(self) -> Checkpoint:
        """The stream position just after this batch (this batch and all before it consumed).

        A trainer that prefetches keeps the checkpoint (or just the :attr:`position`) of the
        batch it last trained on, not of the last one fetched. It works after the stream closed.
        """
        return self._stream.checkpoint(self.position)

    def __repr__(self) -> str:
        shapes = ", ".join(f"{k}={v.dtype}{list(v.shape)}" for k, v in self.arrays().items())
        return f"Batch(stage={self.stage}, batch_index={self.batch_index}, {shapes})"


@dataclass(frozen=True)
class StreamStats:
    """Counters and timings of a stream (docs/metrics.md), cheap enough to read every step.

    ``batches_yielded``, ``rows_yielded`` and ``dropped_rows`` belong to the run: a resumed
    stream continues them from its checkpoint. Every other figure counts this stream object's
    work since it was opened or resumed, and starts at zero again in a resumed stream (a
    checkpoint stores positions, not timings).

    Loader-bound or model-bound: :attr:`consumer_wait_seconds` is the time ``next`` blocked
    because the batch was not assembled yet, :attr:`consumer_seconds` the time between a batch's
    delivery and the next call of ``next`` (the training step's own time), and
    :attr:`loader_bound_fraction` the share of the first in their sum. Use :meth:`since` for a
    window of steps rather than the whole run.

    Examples:
        >>> stats = stream.stats  # doctest: +SKIP
        >>> stats.loader_bound_fraction  # doctest: +SKIP
        0.02

    """

    batches_yielded: int
    """Batches this rank has received over the run (resumed streams continue the count)."""
    rows_yielded: int
    """Rows this rank has received over the run (a validation pass's padding rows excluded)."""
    dropped_rows: int
    """Rows of the active finite stage that no rank receives: the final round of
    ``world_size`` global batches that cannot be filled, and any partial batch (in a ramped
    stage, the final partial global batch). Always 0 in a validation pass, which pads instead."""
    skipped_batches: int = 0
    """This rank's batches in ``skip_batches`` ranges that the stream passed by since it was
    opened or resumed (never delivered, not counted in :attr:`batches_yielded`)."""
    skipped_rows: int = 0
    """The rows those batches would have held."""
    batches_delivered: int = 0
    """Batches this stream delivered since it was opened or resumed."""
    batches_waited: int = 0
    """Of those, the ones that were not ready when ``next`` asked for them."""
    consumer_wait_seconds: float = 0.0
    """Time ``next`` blocked waiting for a batch the pipeline had not yet assembled."""
    consumer_seconds: float = 0.0
    """Time between each delivery and the following call of ``next``: the consumer's own time
    (the time before the first ``next`` is not counted)."""
    prefetch_depth: int = 0
    """Batches assembled and waiting for the consumer at this moment."""
    prefetch_capacity: int = 0
    """The most batches that can wait for the consumer (``prefetch_batches``)."""
    sources: tuple[SourceStats, ...] = ()
    """What each source read, in stage then source order."""
    open: ReadStats = field(default_factory=ReadStats)
    """What opening or resuming the stream read: manifests, and the shards checked at open."""
    decode: Mapping[str, DecodeStats] = field(default_factory=dict)
    """Decode rows and time by shard format (``"parquet"``, ``"jsonl"``, ...)."""

    @property
    def loader_bound_fraction(self) -> float:
        """The share of the loop spent waiting for data: ``wait / (wait + consumer)``.

        Near 0 the consumer (the model) sets the pace, near 1 the loader does; 0.0 before any
        batch was delivered.
        """
        total = self.consumer_wait_seconds + self.consumer_seconds
        return self.consumer_wait_seconds / total if total > 0 else 0.0

    @property
    def bytes_read(self) -> int:
        """Bytes read from storage, every source and the open together."""
        return self.open.bytes_read + sum(s.bytes_read for s in self.sources)

    @property
    def rows_read(self) -> int:
        """Rows decoded, every source together."""
        return sum(s.rows_read for s in self.sources)

    @property
    def shards_opened(self) -> int:
        """Shard readers opened, every source together."""
        return sum(s.shards_opened for s in self.sources)

    @property
    def retries(self) -> dict[str, int]:
        """Retried remote requests by cause, every source and the open together."""
        total = dict(self.open.retries)
        for source in self.sources:
            for cause, count in source.retries.items():
                total[cause] = total.get(cause, 0) + count
        return total

    @property
    def mixture(self) -> tuple[MixShare, ...]:
        """Each source's delivered rows and tokens, and their share of its stage.

        Set beside the configured weight share: how the realised mix compares with the
        configured one.
        """
        return _mixture(self.sources)

    @property
    def stages(self) -> tuple[StageDelivered, ...]:
        """Rows and tokens delivered per stage, in stage order."""
        return _stages(self.sources)

    def since(self, earlier: StreamStats) -> StreamStats:
        """The counters of the window after ``earlier`` (a reading of the same stream).

        Counters and timings are differences; ``prefetch_depth``, ``prefetch_capacity`` and
        ``dropped_rows`` are as now.

        Examples:
            >>> window = stream.stats.since(previous)  # doctest: +SKIP

        """
        sources = tuple(
            SourceStats(
                stage=now.stage,
                source=now.source,
                rows_delivered=now.rows_delivered - then.rows_delivered,
                tokens_delivered=now.tokens_delivered - then.tokens_delivered,
                weight_share=now.weight_share,
                dropped_rows=now.dropped_rows,
                **_minus_read(now, then),
            )
            for now, then in zip(self.sources, earlier.sources, strict=True)
        )
        decode = {
            name: DecodeStats(
                rows=now.rows - earlier.decode.get(name, DecodeStats()).rows,
                seconds=now.seconds - earlier.decode.get(name, DecodeStats()).seconds,
            )
            for name, now in self.decode.items()
        }
        return StreamStats(
            batches_yielded=self.batches_yielded - earlier.batches_yielded,
            rows_yielded=self.rows_yielded - earlier.rows_yielded,
            dropped_rows=self.dropped_rows,
            skipped_batches=self.skipped_batches - earlier.skipped_batches,
            skipped_rows=self.skipped_rows - earlier.skipped_rows,
            batches_delivered=self.batches_delivered - earlier.batches_delivered,
            batches_waited=self.batches_waited - earlier.batches_waited,
            consumer_wait_seconds=self.consumer_wait_seconds - earlier.consumer_wait_seconds,
            consumer_seconds=self.consumer_seconds - earlier.consumer_seconds,
            prefetch_depth=self.prefetch_depth,
            prefetch_capacity=self.prefetch_capacity,
            sources=sources,
            open=ReadStats(**_minus_read(self.open, earlier.open)),
            decode=decode,
        )

    def scalars(self, prefix: str = "") -> dict[str, float]:
        """Flat numbers for a metrics logger, each key starting with ``prefix``.

        Keys: ``loader_bound_fraction``, ``consumer_wait_seconds``, ``consumer_seconds``,
        ``batches_delivered``, ``batches_waited``, ``prefetch_depth``, ``rows_read``,
        ``bytes_read``, ``shards_opened``, ``retries`` and ``retries/<cause>``,
        ``source<stage>.<source>/rows_read``, ``/bytes_read``, ``/rows_delivered``,
        ``/row_share`` and ``/weight_share`` (and, in a token stage, ``/tokens_delivered`` and
        ``/token_share``), ``stage<stage>/rows_delivered`` (and ``/tokens_delivered``), and
        ``decode_seconds/<format>``.

        Examples:
            >>> pl_module.log_dict(stream.stats.scalars("data/"))  # doctest: +SKIP

        """
        out: dict[str, float] = {
            "loader_bound_fraction": self.loader_bound_fraction,
            "consumer_wait_seconds": self.consumer_wait_seconds,
            "consumer_seconds": self.consumer_seconds,
            "batches_delivered": float(self.batches_delivered),
            "batches_waited": float(self.batches_waited),
            "prefetch_depth": float(self.prefetch_depth),
            "rows_read": float(self.rows_read),
            "bytes_read": float(self.bytes_read),
            "shards_opened": float(self.shards_opened),
        }
        retries = self.retries
        out["retries"] = float(sum(retries.values()))
        for cause, count in retries.items():
            out[f"retries/{cause}"] = float(count)
        for s in self.sources:
            out[f"source{s.stage}.{s.source}/rows_read"] = float(s.rows_read)
            out[f"source{s.stage}.{s.source}/bytes_read"] = float(s.bytes_read)
        for share in self.mixture:
            key = f"source{share.stage}.{share.source}"
            out[f"{key}/rows_delivered"] = float(share.rows_delivered)
            out[f"{key}/row_share"] = share.row_share
            out[f"{key}/weight_share"] = share.weight_share
            if share.tokens_delivered:
                out[f"{key}/tokens_delivered"] = float(share.tokens_delivered)
                out[f"{key}/token_share"] = share.token_share
        for stage in self.stages:
            out[f"stage{stage.stage}/rows_delivered"] = float(stage.rows_delivered)
            if stage.tokens_delivered:
                out[f"stage{stage.stage}/tokens_delivered"] = float(stage.tokens_delivered)
        for name, decode in self.decode.items():
            out[f"decode_seconds/{name}"] = decode.seconds
        return {prefix + key: value for key, value in out.items()}

    def summary(self) -> str:
        """One line for a log: the loader-bound fraction and the figures behind it."""
        retries = self.retries
        causes = ", ".join(f"{k} {v}" for k, v in retries.items() if v)
        return (
            f"loader-bound {self.loader_bound_fraction:.0%} (waited {self.consumer_wait_seconds:.3f} s, "
            f"consumer {self.consumer_seconds:.3f} s; {self.batches_waited} of "
            f"{self.batches_delivered} batches not ready), prefetched {self.prefetch_depth}/"
            f"{self.prefetch_capacity}, read {self.rows_read} rows, {self.bytes_read} bytes from "
            f"{self.shards_opened} shard opens, {sum(retries.values())} retries"
            + (f" ({causes})" if causes else "")
        )

    @classmethod
    def _from_core(cls, raw: Mapping[str, Any]) -> StreamStats:
        return cls(
            batches_yielded=int(raw["batches_yielded"]),
            rows_yielded=int(raw["rows_yielded"]),
            dropped_rows=int(raw["dropped_rows"]),
            skipped_batches=int(raw["skipped_batches"]),
            skipped_rows=int(raw["skipped_rows"]),
            batches_delivered=int(raw["batches_delivered"]),
            batches_waited=int(raw["batches_waited"]),
            consumer_wait_seconds=float(raw["consumer_wait_seconds"]),
            consumer_seconds=float(raw["consumer_seconds"]),
            prefetch_depth=int(raw["prefetch_depth"]),
            prefetch_capacity=int(raw["prefetch_capacity"]),
            sources=tuple(SourceStats._from_core(s) for s in raw["sources"]),
            open=ReadStats._from_core(raw["open"]),
            decode={
                name: DecodeStats(rows=int(r), seconds=float(t)) for name, (r, t) in raw["decode"].items()
            },
        )


@dataclass(frozen=True)
class TokenStats:
    """What one epoch of a token stage's windows holds (``Stage(packing=...)`` or ``windows=``).

    Examples:
        >>> stats = TokenStats(tokens=3, windows=1, row_tokens=4, padding_fraction=0.25, most_segments=2)
        >>> stats.padding_fraction
        0.25

    """

    tokens: int
    """Tokens in the windows, padding excluded (a stream window's overlapping token counts in
    both windows it is in)."""
    windows: int
    """Windows (rows) over all the stage's shards."""
    row_tokens: int
    """Tokens per window, padding included."""
    padding_fraction: float
    """The share of the windows' token slots that is padding."""
    most_segments: int
    """The most segments (documents, or pieces of them) any window holds: the shortest
    ``@segment_lengths`` field that fits."""


@dataclass(frozen=True)
class MemoryBound:
    """The stream's working-set bound in bytes, by term, and the limit it was checked against."""

    batches: int
    """Batches queued for the consumer and held by it, plus two planned groups of rows."""
    decode_units: int
    """Decoded rows of read jobs in flight: their record columns only, since reserved columns
    (``@row_id``, ``@segment_ids``, ...) are written straight into batches."""
    readers: int
    """Open shard readers' buffers, and the Parquet pages kept for later read jobs (dictionary
    pages, a page a job ended in, column chunks read whole) when some shard is Parquet."""
    decode_scratch: int
    """Decoders' working memory (Parquet column chunks, the longest line or frame)."""
    token_plans: int
    """Token shards' packing plans and record offsets, held while the stream runs."""
    total: int
    """The bound: the sum of the terms."""
    limit: int
    """``memory_limit_bytes``, or half the host's physical memory."""


class BatchStream:
    """An open, iterable batch stream; also a context manager.

    Open one with :func:`open_batch_stream` or :func:`resume_batch_stream`. Iterating yields
    :class:`Batch` objects; a finite stage ends with ``StopIteration``. ``close()`` stops the
    engine's threads after the read in flight and is idempotent; using a closed stream raises
    :class:`StreamClosedError`. A stream belongs to the process that opened it: used in a forked
    child (which has none of its engine's threads) it raises :class:`StreamClosedError` at once
    instead of waiting for them; open a new stream in the child.

    Examples:
        >>> with open_batch_stream(config) as stream:  # doctest: +SKIP
        ...     for batch in stream:
        ...         tokens = batch.arrays()["tokens"]

    """

    def __init__(self, core: _core.Stream) -> None:
        self._stream = core
        self._pid = os.getpid()

    @property
    def _core(self) -> _core.Stream:
        """The engine's stream, in the process that opened it only."""
        if os.getpid() != self._pid:
            raise StreamClosedError(
                f"this stream was opened in process {self._pid}; in a forked child (process "
                f"{os.getpid()}) its engine threads do not exist, so it cannot deliver batches: "
                "open a new stream in the child"
            )
        return self._stream

    def __iter__(self) -> BatchStream:
        return self

    def __next__(self) -> Batch:
        item = self._core.next_batch()
        if item is None:
            raise StopIteration
        columns, stage, batch_index, local_index, position = item
        return Batch(columns, stage, batch_index, local_index, position, self)

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
        """Stops the stream, cancelling the shard reads in flight. Idempotent.

        Any thread may call it, also while another thread waits in ``next``, which then raises
        :class:`StreamClosedError`.
        """
        if os.getpid() != self._pid:
            return  # a forked child's copy: the parent's stream is the parent's to close
        self._core.close()

    @property
    def closed(self) -> bool:
        """True once :meth:`close` has run, and in a forked child."""
        return os.getpid() != self._pid or self._core.closed

    @property
    def stage(self) -> int:
        """The active stage."""
        return self._core.stage

    def advance(self, stage: int, *, at: int | None = None) -> None:
        """Switches to ``stage`` at the next batch boundary, or at global batch ``at``.

        Without ``at`` the switch takes effect after the batches already received: prefetched
        batches of the old stage are discarded (their rows are not lost), rows still in the old
        stage's shuffle window are delivered first, then the new stage starts. With several
        ranks, call it after the same number of local batches on every rank.

        ``at`` is a global batch number (``batch.batch_index``, or a position's
        ``next_batch``): the new stage starts with the first round of ``world_size`` global
        batches that begins at or after it. Every worker or process that passes the same
        ``at`` switches at the same batch, whenever it makes the call, as long as it has not yet
        delivered a batch of that round. A same-stage advance is a no-op.

        Examples:
            >>> stream.advance(1, at=batch.position.next_batch + 8)  # doctest: +SKIP

        """
        _whole("stage", stage)
        if at is not None:
            _whole("at", at)
        self._core.advance(stage, at)

    @property
    def position(self) -> Position:
        """The position after the last delivered batch, which counts as consumed."""
        return self._core.position()

    def checkpoint(self, position: Position | None = None) -> Checkpoint:
        """The checkpoint after the last delivered batch, or at ``position``.

        ``position`` is one of this stream's positions (a :attr:`Batch.position`), for example
        of the batch the model last consumed while later ones were already fetched. A position's
        checkpoint can be taken after :meth:`close` too; the stream's own cannot.
        """
        return self._core.checkpoint(position)

    @property
    def stats(self) -> StreamStats:
        """Counters and timings (:class:`StreamStats`), read without waiting for any batch.

        A closed stream answers with the counters it ended with.
        """
        return StreamStats._from_core(self._core.stats())

    @property
    def token_stats(self) -> list[TokenStats | None]:
        """Per stage, what its token windows hold (``None`` for a stage of records).

        Counted from the shards' packing plans at open: the padding fraction of a packed stage
        is that of the corpus, not of the batches delivered so far.
        """
        return [None if s is None else TokenStats(**s) for s in self._core.token_stats()]

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

    Open costs the sources, not the bytes: a manifest source's row counts come from the
    manifest, a file list's from the host's inspection cache or by counting, and one shard of
    every source is checked against the projected fields before this returns, so a missing
    manifest or file list entry, an unknown encoding or a field that no record carries raises
    here. Other shards are read first by the stream, which holds each to what it was promised
    (``docs/storage.md``) and fails closed at the batch that first needs a shard that differs.
    ``share=(offset, stride)`` yields only this rank's local batches ``offset, offset +
    stride, ...``: a framework adapter's worker ``w`` of ``N`` uses
    ``(w, N)``, so the workers' batches taken in turn are the rank's sequence. An ``s3://``
    source without ``storage`` (see :class:`TrainingData`) raises :class:`ConfigError` here.

    Examples:
        >>> stream = open_batch_stream(config)  # doctest: +SKIP

    """
    offset, stride = _share(share)
    return BatchStream(_core.Stream(config_json(config), offset, stride, _core_storage(storage)))


def _refused(name: str, message: str) -> ConfigError:
    """``ConfigError`` for argument ``name`` (``share offset`` is option ``share``)."""
    error = ConfigError(f"invalid {name}: {message}")
    error.option = name.split(" ", 1)[0]
    return error


def _whole(name: str, value: object) -> int:
    """``value`` if it is a whole number (not a bool) from 0 to 2^64 - 1; ConfigError naming it."""
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < 2**64:
        raise _refused(name, f"expected a whole number >= 0, got {value!r}")
    return value


def _share(share: object) -> tuple[int, int]:
    """``share=(offset, stride)`` checked: ``stride`` of at least 1 and ``offset`` below it."""
    if not isinstance(share, tuple) or len(share) != 2:
        raise _refused("share", f"expected (offset, stride), got {share!r}")
    offset, stride = _whole("share offset", share[0]), _whole("share stride", share[1])
    if stride < 1 or offset >= stride:
        raise _refused(
            "share", f"expected 0 <= offset < stride (stride >= 1), got offset {offset}, stride {stride}"
        )
    return offset, stride


def resume_batch_stream(
    checkpoint: Checkpoint,
    *,
    rank: int | None = None,
    world_size: int | None = None,
    config: BatchStreamConfig | None = None,
    share: tuple[int, int] = (0, 1),
    storage: StorageConfig | None = None,
    skip_batches: Sequence[tuple[int, int] | range] | None = None,
) -> BatchStream:
    """Re-opens the stream ``checkpoint`` was taken from, eagerly, right after its last batch.

    The checkpoint belongs to one rank: pass this process's ``rank``/``world_size`` to have a
    mismatch refused (use :meth:`Checkpoint.for_world` to move a position to another world
    size on purpose). Pass ``config`` to have a checkpoint of a different stream refused: the
    engine compares the fields, seed, stages, weights, file lists and manifest selections
    without reading any shard, and the :class:`CheckpointError` names the first difference
    (:meth:`Checkpoint.check` runs the same checks alone). A file list's shards are looked at
    again, and any whose size or version changed since is refused; a manifest's are held to
    the checkpoint's sizes and row counts when the stream first reads them. ``share`` is as in
    :func:`open_batch_stream`, counted from the checkpoint's position. The checkpoint holds no
    credentials: pass ``storage`` again to re-open ``s3://`` shards.

    ``skip_batches`` (or a ``config`` that lists them) adds ranges of global batches no rank
    receives, at or after the checkpoint's position: the loss-spike recovery of
    docs/order.md, "Skipping batches". They join the stream's fingerprint, and every later
    checkpoint keeps them.

    Examples:
        >>> checkpoint = Checkpoint.from_json(path.read_text())  # doctest: +SKIP
        >>> stream = resume_batch_stream(checkpoint, rank=0, world_size=2)  # doctest: +SKIP

    """
    offset, stride = _share(share)
    if skip_batches is not None:
        checkpoint = checkpoint.with_skipped_batches(skip_batches)
    if rank is not None:
        _whole("rank", rank)
    if world_size is not None and _whole("world_size", world_size) < 1:
        raise _refused("world_size", "must be at least 1, got 0")
    return BatchStream(
        _core.Stream.resume(
            checkpoint,
            offset,
            stride,
            _core_storage(storage),
            rank=rank,
            world_size=world_size,
            config=config,
        )
    )


def resolve_batch_stream_config(
    config: BatchStreamConfig, *, storage: StorageConfig | None = None
) -> dict[str, Any]:
    """The resolved document a stream over ``config`` would run.

    It pins every shard's absolute path, encoding and row count, plus the config's own
    settings; it holds no credentials. A checkpoint stores the same document.

    Examples:
        >>> resolved = resolve_batch_stream_config(config)  # doctest: +SKIP
        >>> [s["rows"] for s in resolved["stages"][0]["sources"][0]["shards"]]  # doctest: +SKIP
        [1000, 1000]

    """
    result: dict[str, Any] = json.loads(_core.resolve_config(config_json(config), _core_storage(storage)))
    return result


def _core_storage(storage: StorageConfig | None) -> _core.Storage | None:
    return None if storage is None else storage.core()
