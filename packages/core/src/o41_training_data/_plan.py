"""What a run will read before it starts: bytes per rank, cluster amplification, memory, diversity.

Everything here follows from the order function, which is a pure function of the resolved
config: the first global batches of the first stage are traced for the planned world size (no
shard is read), and each read unit (``read_unit_rows`` consecutive rows of a shard: a row
group's rows without a page index, a page's with one) is charged to every rank whose rows it
holds. The figures are estimates from that sample (said so in :class:`ReadPlan`), for choosing
``partitions``, ``buffer_rows`` and ``block_rows`` before a run (docs/order.md, "Partitions").
"""

from __future__ import annotations

import dataclasses
import itertools
import re
from collections import defaultdict
from dataclasses import dataclass
from typing import Any

from . import _core
from ._config import BatchStreamConfig
from ._errors import ConfigError
from ._storage import StorageConfig

# The trace's sample, at most: enough rows to cover rounds of windows on small configs, and
# quick (about a second) on large ones.
_MAX_SAMPLE_ROWS = 1 << 20


@dataclass(frozen=True)
class ReadPlan:
    """The reads of one pass over the first stage's corpus, for one world size.

    Examples:
        >>> plan = plan_reads(config, world_size=64)  # doctest: +SKIP
        >>> plan.amplification  # doctest: +SKIP
        1.0

    """

    world_size: int
    """The ranks the plan is for."""
    partitions: int
    """The config's ``partitions``."""
    corpus_bytes: int
    """Bytes of the first stage's shards, as resolved."""
    amplification: float
    """Estimated bytes all ranks fetch over the bytes they deliver: 1.0 when every read unit is
    read by one rank; up to the world size when every rank reads every unit."""
    bytes_per_rank: int
    """Estimated bytes one rank fetches in one pass over the corpus: ``amplification`` times
    the corpus over the world size."""
    planned_rows: int
    """Rows a rank decodes ahead of its consumer at once (with partitions, the windows it reads
    of a round); the engine holds up to two such groups."""
    decoded_bytes_per_rank: int
    """Bytes of two planned groups of rows as declared: the decoded-row memory of a rank."""
    distinct_blocks_per_batch: float
    """Mean distinct blocks (``block_rows`` rows of a shard) a global batch draws rows from."""
    consecutive_neighbours: float
    """Fraction of neighbouring rows of a batch that are consecutive records of one shard."""
    sampled_batches: int
    """Global batches traced for the estimates."""


def plan_reads(
    config: BatchStreamConfig,
    world_size: int | None = None,
    *,
    read_unit_rows: int = 1024,
    block_rows: int = 1024,
    batches: int | None = None,
    storage: StorageConfig | None = None,
) -> ReadPlan:
    """Estimates what ``config``'s ranks read on ``world_size`` ranks (default: the config's).

    The shards are resolved (as ``o41 config resolve`` does) but not read. ``batches`` global
    batches of the first stage are traced (default: as many as fit a million rows, or the
    stage). Raises :class:`ConfigError` for a world size out of range and whatever resolving
    the config raises.

    Examples:
        >>> plan = plan_reads(config, world_size=64, read_unit_rows=1024)  # doctest: +SKIP

    """
    from ._stream import resolve_batch_stream_config
    from ._trace import trace_batches

    world = config.world_size if world_size is None else world_size
    if isinstance(world, bool) or not isinstance(world, int) or world < 1:
        raise ConfigError(f"invalid world_size: {world!r}; expected a whole number of ranks of at least 1")
    for name, value in (("read_unit_rows", read_unit_rows), ("block_rows", block_rows)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ConfigError(f"invalid {name}: {value!r}; expected a whole number of rows of at least 1")
    resolved = resolve_batch_stream_config(config, storage=storage)
    shards = _shards(resolved["stages"][0])
    corpus = sum(bytes_ for bytes_, _ in shards.values())
    batch = config.stages[0].batch_size
    count = batches if batches is not None else max(1, _MAX_SAMPLE_ROWS // batch)
    traced = _trace_prefix(trace_batches, config, count, world, storage)
    readers: dict[tuple[str, int], set[int]] = defaultdict(set)
    by_batch: dict[int, list[tuple[str, int]]] = defaultdict(list)
    for row in traced:
        if row.padding:
            continue
        readers[row.path, row.row // read_unit_rows].add(row.rank)
        by_batch[row.global_batch].append((row.path, row.row))
    fetched = delivered = 0.0
    for (path, _), ranks in readers.items():
        size, shard_rows = shards.get(path, (0, 1))
        unit = size * min(read_unit_rows, shard_rows) / max(shard_rows, 1)
        fetched += unit * len(ranks)
        delivered += unit
    amplification = fetched / delivered if delivered else 1.0
    blocks: list[int] = []
    pairs = consecutive = 0
    for slots in by_batch.values():
        blocks.append(len({(path, row // block_rows) for path, row in slots}))
        for (p, a), (q, b) in itertools.pairwise(slots):
            pairs += 1
            consecutive += p == q and b == a + 1
    planned, row_bytes = _core.planned_rows(dataclasses.replace(config, world_size=world, rank=0))
    return ReadPlan(
        world_size=world,
        partitions=config.partitions,
        corpus_bytes=corpus,
        amplification=amplification,
        bytes_per_rank=round(amplification * corpus / world),
        planned_rows=planned,
        decoded_bytes_per_rank=2 * planned * row_bytes,
        distinct_blocks_per_batch=sum(blocks) / len(blocks) if blocks else 0.0,
        consecutive_neighbours=consecutive / pairs if pairs else 0.0,
        sampled_batches=len(by_batch),
    )


def _shards(stage: dict[str, Any]) -> dict[str, tuple[int, int]]:
    """Each shard of a resolved stage by path: its bytes and rows."""
    out: dict[str, tuple[int, int]] = {}
    for source in stage["sources"]:
        for shard in source["shards"]:
            out[shard["path"]] = (int(shard.get("bytes") or 0), int(shard["rows"]))
    return out


def _trace_prefix(trace: Any, config: BatchStreamConfig, count: int, world: int, storage: Any) -> list[Any]:
    """The first ``count`` global batches, or all of a finite stage's when it has fewer."""
    try:
        return list(trace(config, range(count), world_size=world, storage=storage))
    except ConfigError as error:
        # The refusal names the stage's end: trace up to it instead.
        end = re.search(r"ends before global batch (\d+)", str(error))
        if end is None or int(end.group(1)) == 0:
            raise
        return list(trace(config, range(int(end.group(1))), world_size=world, storage=storage))
