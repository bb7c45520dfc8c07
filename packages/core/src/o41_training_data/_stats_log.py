"""The plain logging hook that reports a stream's stats every N batches (docs/metrics.md).

Apart from ``_stats`` (the read counters ``_stream`` builds its stats from), so that the two
import each other in one direction only.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator

from ._errors import ConfigError
from ._stream import Batch, BatchStream, StreamStats

__all__ = ["log_stats_every"]


def log_stats_every(
    stream: BatchStream,
    n: int,
    logger: logging.Logger | None = None,
    *,
    level: int = logging.INFO,
) -> Iterator[Batch]:
    """Iterates ``stream``, logging its stats for the last ``n`` batches after every ``n``-th.

    Each record's message is one line (the loader-bound fraction, the consumer's wait and its
    own time, rows, bytes and retries of the window); the window's :class:`StreamStats` is
    attached as the record's ``o41_stats`` attribute, and its :meth:`StreamStats.scalars` as
    ``o41_scalars``, for handlers that ship numbers elsewhere. The default logger is
    ``o41_training_data.stats``. No training framework is involved.

    Examples:
        >>> for batch in log_stats_every(stream, 100):  # doctest: +SKIP
        ...     train_step(batch)

    """
    if not isinstance(n, int) or isinstance(n, bool) or n < 1:
        raise ConfigError(f"log_stats_every: n must be a positive int, got {n!r}")
    log = logger if logger is not None else logging.getLogger("o41_training_data.stats")
    previous: StreamStats = stream.stats
    for count, batch in enumerate(stream, start=1):
        yield batch
        if count % n == 0:
            now = stream.stats
            window = now.since(previous)
            previous = now
            log.log(
                level,
                "o41 stream, %d batches: %s",
                now.batches_delivered,
                window.summary(),
                extra={"o41_stats": window, "o41_scalars": window.scalars()},
            )
