"""Provenance: which rows a global batch holds (docs/order.md, "Provenance").

The order is a pure function of the resolved document and the position, so the source, shard
and row of every row of any global batch are computed from row counts alone: nothing is read
beyond what opening a stream reads (a checkpoint, nothing at all). :func:`read_traced_rows`
then reads the records themselves where wanted.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from . import _core
from ._config import BatchStreamConfig, config_json
from ._core import Checkpoint
from ._errors import ConfigError
from ._storage import StorageConfig

__all__ = ["TracedRow", "read_traced_rows", "trace_batches"]


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
    return global_batches.start, global_batches.stop


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
        world = source.world_size if world_size is None else world_size
        core_storage = None if storage is None else storage.core()
        raw = _core.trace_checkpoint(source, start, end, world, core_storage)
    elif isinstance(source, BatchStreamConfig):
        world = source.world_size if world_size is None else world_size
        core_storage = None if storage is None else storage.core()
        raw = _core.trace_config(config_json(source), start, end, world, core_storage)
    else:
        raise ConfigError(
            f"invalid source: {type(source).__name__}; expected a BatchStreamConfig or a Checkpoint"
        )
    return [TracedRow(*row) for row in raw]


def read_traced_rows(
    rows: Iterable[TracedRow], *, storage: StorageConfig | None = None
) -> list[dict[str, Any] | None]:
    """The records ``rows`` name, read from their shards (``None`` for padding), in order.

    Each shard is read once, from its start up to the last row wanted of it, as
    :func:`iter_shard` reads it. Rows of a stage that packs or windows tokens are windows, not
    records: pass only rows of stages of records (:class:`ConfigError` otherwise).
    """
    # Here, not at the top: iter_shard imports PyArrow, which tracing alone does not need.
    from ._iter_shard import iter_shard

    rows = list(rows)
    for row in rows:
        if row.window:
            raise ConfigError(
                f"invalid rows: global batch {row.global_batch} holds windows of stage {row.stage}, "
                "which packs or windows tokens; its rows are not records to read"
            )
    wanted: dict[tuple[str, str], set[int]] = {}
    for row in rows:
        if not row.padding:
            wanted.setdefault((row.path, row.encoding), set()).add(row.row)
    found: dict[tuple[str, str, int], dict[str, Any]] = {}
    for (path, encoding), numbers in wanted.items():
        last = max(numbers)
        for k, record in enumerate(iter_shard(encoding, path, storage_config=storage)):
            if k in numbers:
                found[(path, encoding, k)] = record
            if k >= last:
                break
    return [None if row.padding else found[(row.path, row.encoding, row.row)] for row in rows]
