"""What a stream read: the parts of a stream's stats that describe its reads.

:class:`StreamStats` (in ``_stream``) holds a stream's counters; the parts of it that describe
reads live here: :class:`ReadStats` (one source's, or the open's, storage and decode counters),
:class:`SourceStats` and :class:`DecodeStats`. See docs/metrics.md.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

__all__ = ["RETRY_CAUSES", "DecodeStats", "ReadStats", "SourceStats"]

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
    """What one source read; ``stage`` and ``source`` index the config's stages and sources."""

    stage: int = 0
    """The stage the source belongs to."""
    source: int = 0
    """The source's index within its stage."""

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
