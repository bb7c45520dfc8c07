"""Provenance: which rows a global batch holds (docs/order.md, "Provenance").

The order is a pure function of the resolved document and the position, so the source, shard
and row of every row of any global batch are computed from row counts alone: nothing is read
beyond what opening a stream reads (a checkpoint, nothing at all). :func:`read_traced_rows`
then reads the records themselves where wanted.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from . import _core
from ._config import BatchStreamConfig, config_json
from ._core import Checkpoint
from ._errors import ConfigError
from ._limits import LIMITS
from ._storage import StorageConfig

__all__ = ["TracedRow", "WindowDocument", "read_traced_rows", "trace_batches"]


@dataclass(frozen=True)
class WindowDocument:
    """A run of one document in a traced window of a stage that packs or windows tokens.

    Examples:
        >>> row = trace_batches(config, 12)[0]  # doctest: +SKIP
        >>> [(d.record, d.start, d.end) for d in row.documents]  # doctest: +SKIP
        [(41, 0, 812), (42, 0, 1236)]

    """

    record: int | None
    """The record of the shard the run starts in; ``None`` in a flat token stream (``.bin``,
    NumPy, a Megatron ``.bin`` packed at an eos id), whose ``start`` and ``end`` count from the
    stream's first token."""
    start: int
    """The run's first token, counted from the record's first token (or the stream's)."""
    end: int
    """One past its last token, counted as ``start`` is."""
    position: int
    """The position of its first token within its document: 0 unless the document was split
    across windows (``Packing(overflow="split")``) or a stream window starts inside it."""


@dataclass(frozen=True)
class TracedRow:
    """One row of a traced global batch.

    Examples:
        >>> row = trace_batches(checkpoint, 812_345)[0]  # doctest: +SKIP
        >>> row.path, row.row  # doctest: +SKIP
        ('s3://bucket/web/part-00042.parquet', 90_311)

    """

    global_batch: int
    """The global batch."""
    rank: int
    """The rank that receives the row, for the world size traced."""
    slot: int
    """The row's index in that rank's batch."""
    stage: int
    """The stage the row was drawn in (a drained row's is the earlier stage)."""
    source: int
    """The source's index within that stage."""
    shard: int
    """The shard's index within that source."""
    path: str
    """The shard's location ("" for padding)."""
    encoding: str
    """The shard's encoding ("" for padding)."""
    row: int
    """The record within the shard; in a stage that packs or windows tokens, the window."""
    padding: bool
    """A validation pass's padding row, which holds no data."""
    window: bool
    """The row is a window of a stage that packs or windows tokens, not a record."""
    skipped: bool
    """The batch is in one of the stream's ``skip_batches`` ranges: no rank receives the row."""
    documents: tuple[WindowDocument, ...] = ()
    """For a window, the documents it holds, in order (read from the shard's document
    boundaries, as opening a stream reads them); empty for a record."""


def _batches(global_batches: int | range) -> tuple[int, int]:
    if isinstance(global_batches, bool) or not isinstance(global_batches, int | range):
        raise ConfigError(f"invalid global_batches: {global_batches!r}; expected an int or a range")
    if isinstance(global_batches, int):
        global_batches = range(global_batches, global_batches + 1)
    if global_batches.step != 1 or global_batches.start < 0 or global_batches.stop <= global_batches.start:
        raise ConfigError(
            f"invalid global_batches: {global_batches!r}; expected a non-empty range of batches "
            "from 0 with step 1"
        )
    # No stream reaches a batch past the engine's positions; the engine counts in 64 bits.
    if global_batches.stop > LIMITS["max_position"]:
        raise ConfigError(
            f"invalid global_batches: {global_batches!r}; no stream reaches global batch "
            f"{LIMITS['max_position']}"
        )
    return global_batches.start, global_batches.stop


def _world(world_size: object) -> int:
    """``world_size`` as the engine takes it; a :class:`ConfigError` naming it otherwise."""
    largest = LIMITS["max_world_size"]
    if isinstance(world_size, bool) or not isinstance(world_size, int) or not 1 <= world_size <= largest:
        raise ConfigError(f"invalid world_size: {world_size!r}; a world has 1 to {largest} ranks")
    return world_size


def trace_batches(
    source: BatchStreamConfig | Checkpoint,
    global_batches: int | range,
    *,
    world_size: int | None = None,
    storage: StorageConfig | None = None,
) -> list[TracedRow]:
    """The rows of global batch ``global_batches`` (or of each batch of a range), in order.

    ``source`` is the config a run was opened with (its stream from the start: stage 0) or a
    checkpoint of the run (batches from its position's segment on, which is how a run that
    switched stages is traced; the checkpoint's document is used, so a manifest republished since
    does not change the answer, and nothing is read, unless a field's ``overflow="drop"`` left
    records out: the order counts a shard's kept records, so the traced shards' drop fields are
    read to give each row's number in its file). ``world_size`` (default: the config's or
    checkpoint's) decides which rank receives each row; the rows of a global batch are the same
    for every world size. Each :class:`TracedRow` names the stage, source, shard (path and
    index) and row; a batch past the end of a finite stage, or before the checkpoint's segment,
    raises :class:`ConfigError`.

    Examples:
        >>> rows = trace_batches(checkpoint, range(812_340, 812_346))  # doctest: +SKIP

    """
    start, end = _batches(global_batches)
    if isinstance(source, Checkpoint):
        world = _world(source.world_size if world_size is None else world_size)
        core_storage = None if storage is None else storage.core()
        raw, documents = _core.trace_checkpoint(source, start, end, world, core_storage)
    elif isinstance(source, BatchStreamConfig):
        world = _world(source.world_size if world_size is None else world_size)
        core_storage = None if storage is None else storage.core()
        raw, documents = _core.trace_config(config_json(source), start, end, world, core_storage)
    else:
        raise ConfigError(
            f"invalid source: {type(source).__name__}; expected a BatchStreamConfig or a Checkpoint"
        )
    return [
        TracedRow(*row, documents=tuple(WindowDocument(*d) for d in docs))
        for row, docs in zip(raw, documents, strict=True)
    ]


def read_traced_rows(
    rows: Iterable[TracedRow], *, storage: StorageConfig | None = None
) -> list[dict[str, Any] | None]:
    """The records ``rows`` name, read from their shards (``None`` for padding), in order.

    Each shard is read once, from its start up to the last row wanted of it, as
    :func:`iter_shard` reads it. A row of a stage that packs or windows tokens is a window, not
    a record: it gives ``{"window": w, "documents": [...]}``, each document its ``record``,
    ``start``, ``end`` and ``position`` (:class:`WindowDocument`), as the trace found them.
    """
    # Here, not at the top: iter_shard imports PyArrow, which tracing alone does not need.
    from ._iter_shard import iter_shard

    rows = list(rows)
    wanted: dict[tuple[str, str], set[int]] = {}
    for row in rows:
        if not row.padding and not row.window:
            wanted.setdefault((row.path, row.encoding), set()).add(row.row)
    found: dict[tuple[str, str, int], dict[str, Any]] = {}
    for (path, encoding), numbers in wanted.items():
        last = max(numbers)
        for k, record in enumerate(iter_shard(encoding, path, storage_config=storage)):
            if k in numbers:
                found[(path, encoding, k)] = record
            if k >= last:
                break
    return [
        None
        if row.padding
        else {"window": row.row, "documents": [dataclasses.asdict(d) for d in row.documents]}
        if row.window
        else found[(row.path, row.encoding, row.row)]
        for row in rows
    ]
