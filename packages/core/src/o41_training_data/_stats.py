"""What a stream read: the parts of a stream's stats that describe its reads.

:class:`StreamStats` (in ``_stream``) holds a stream's counters; the parts of it that describe
reads live here: :class:`ReadStats` (one source's, or the open's, storage and decode counters),
:class:`SourceStats` and :class:`DecodeStats`. See docs/metrics.md.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

__all__ = ["RETRY_CAUSES", "DecodeStats", "MixShare", "ReadStats", "SourceStats", "StageDelivered"]

RETRY_CAUSES = ("throttled", "server_error", "timeout", "connection", "interrupted")
"""Why a remote request was retried: the service throttled (429, S3's 503 ``SlowDown``), failed
(another 5xx), a timeout (or 408), a connection failure before any answer, or a response body
that broke off and was resumed from its last byte."""


@dataclass(frozen=True)
class ReadStats:
    """What one source of a stream (or the stream's open) read, since the stream was opened.

    Examples:
        >>> stream.stats.sources[0].bytes_read  # doctest: +SKIP
        1048576

    """

    bytes_read: int = 0
    """Bytes received from storage (local files or objects), inspections included."""
    read_wait_seconds: float = 0.0
    """Time the engine's threads waited for those bytes (summed over threads)."""
    rows_read: int = 0
    """Rows decoded (a row repeated within one read job is decoded once)."""
    shards_opened: int = 0
    """Shard readers opened: a shard read by two decode threads, or again after an
    ``advance``, counts each time."""
    retries: Mapping[str, int] = field(default_factory=dict)
    """Retried remote requests by cause (:data:`RETRY_CAUSES`)."""

    @property
    def retries_total(self) -> int:
        """Retried remote requests, all causes."""
        return sum(self.retries.values())

    @classmethod
    def _from_core(cls, raw: Mapping[str, Any]) -> ReadStats:
        return cls(
            bytes_read=int(raw["bytes_read"]),
            read_wait_seconds=float(raw["read_wait_seconds"]),
            rows_read=int(raw["rows_read"]),
            shards_opened=int(raw["shards_opened"]),
            retries=dict(raw["retries"]),
        )


@dataclass(frozen=True)
class SourceStats(ReadStats):
    """What one source read and delivered.

    ``stage`` and ``source`` index the config's stages and sources. The delivered counts are this
    rank's, since the stream was opened or resumed; :attr:`StreamStats.mixture` sets them
    against the configured weights.
    """

    stage: int = 0
    """The stage the source belongs to."""
    source: int = 0
    """The source's index within its stage."""
    rows_delivered: int = 0
    """Rows of the batches delivered that came from this source (a validation pass's padding
    rows excluded)."""
    tokens_delivered: int = 0
    """In a stage that packs or windows tokens, the tokens of those rows (padding excluded);
    0 in a stage of records."""
    weight_share: float = 0.0
    """The source's configured share of its stage: its weight over the sum of the stage's."""
    dropped_rows: int = 0
    """Rows of the source's shards that a field's ``overflow="drop"`` leaves out of each pass
    over it. Open finds them, so the figure is the same on every rank and after every resume."""

    @classmethod
    def _from_core(cls, raw: Mapping[str, Any]) -> SourceStats:
        read = ReadStats._from_core(raw)
        return cls(
            bytes_read=read.bytes_read,
            read_wait_seconds=read.read_wait_seconds,
            rows_read=read.rows_read,
            shards_opened=read.shards_opened,
            retries=read.retries,
            stage=int(raw["stage"]),
            source=int(raw["source"]),
            rows_delivered=int(raw["rows_delivered"]),
            tokens_delivered=int(raw["tokens_delivered"]),
            weight_share=float(raw["weight_share"]),
            dropped_rows=int(raw["dropped_rows"]),
        )


@dataclass(frozen=True)
class MixShare:
    """One source's realised share of its stage against its configured weight.

    Examples:
        >>> for share in stream.stats.mixture:  # doctest: +SKIP
        ...     print(share.stage, share.source, share.row_share, share.weight_share)
        0 0 0.7002 0.7

    """

    stage: int
    """The stage."""
    source: int
    """The source's index within the stage."""
    weight_share: float
    """The configured share: the source's weight over the stage's weights."""
    rows_delivered: int
    """Rows delivered from the source."""
    tokens_delivered: int
    """Tokens delivered from the source (token stages; 0 for records)."""
    row_share: float
    """Its rows over the rows the stage delivered (0.0 before the stage delivered any)."""
    token_share: float
    """Its tokens over the tokens the stage delivered (0.0 in a stage of records)."""


@dataclass(frozen=True)
class StageDelivered:
    """What one stage delivered to this rank since the stream was opened or resumed."""

    stage: int
    """The stage."""
    rows_delivered: int
    """Rows, every source of the stage together."""
    tokens_delivered: int
    """Tokens (a token stage's; 0 for records)."""


def _stages(sources: tuple[SourceStats, ...]) -> tuple[StageDelivered, ...]:
    totals: dict[int, tuple[int, int]] = {}
    for s in sources:
        rows, tokens = totals.get(s.stage, (0, 0))
        totals[s.stage] = (rows + s.rows_delivered, tokens + s.tokens_delivered)
    return tuple(StageDelivered(stage, rows, tokens) for stage, (rows, tokens) in sorted(totals.items()))


def _mixture(sources: tuple[SourceStats, ...]) -> tuple[MixShare, ...]:
    stages = {s.stage: s for s in _stages(sources)}
    return tuple(
        MixShare(
            stage=s.stage,
            source=s.source,
            weight_share=s.weight_share,
            rows_delivered=s.rows_delivered,
            tokens_delivered=s.tokens_delivered,
            row_share=s.rows_delivered / total.rows_delivered if total.rows_delivered else 0.0,
            token_share=s.tokens_delivered / total.tokens_delivered if total.tokens_delivered else 0.0,
        )
        for s in sources
        for total in (stages[s.stage],)
    )


@dataclass(frozen=True)
class DecodeStats:
    """What the decode threads did with one shard format."""

    rows: int = 0
    """Rows decoded."""
    seconds: float = 0.0
    """Time the decode threads spent in readers of this format, less the time they waited for
    storage (summed over threads, so it can exceed the wall time)."""


def _minus_read(now: ReadStats, then: ReadStats) -> dict[str, Any]:
    return {
        "bytes_read": now.bytes_read - then.bytes_read,
        "read_wait_seconds": now.read_wait_seconds - then.read_wait_seconds,
        "rows_read": now.rows_read - then.rows_read,
        "shards_opened": now.shards_opened - then.shards_opened,
        "retries": {k: v - then.retries.get(k, 0) for k, v in now.retries.items()},
    }
