"""A dependency-free progress bar for the command line."""

from __future__ import annotations

import sys
import time
from typing import TextIO

__all__ = ["Progress"]


class Progress:
    """Draws ``label [#####.....] done/total rate unit/s`` on one terminal line."""

    def __init__(self, total: int, label: str, unit: str = "rows", stream: TextIO | None = None) -> None:
        self.total = total
        self.label = label
        self.unit = unit
        self.done = 0
        self._stream = stream if stream is not None else sys.stderr
        self._start = time.perf_counter()
        self._last_draw = 0.0

    def update(self, n: int) -> None:
        """Adds ``n`` to the count and redraws at most ten times a second."""
        self.done += n
        now = time.perf_counter()
        if now - self._last_draw >= 0.1 or self.done >= self.total:
            self._last_draw = now
            self._draw(now)

    def rate(self) -> float:
        """Units per second so far."""
        elapsed = time.perf_counter() - self._start
        return self.done / elapsed if elapsed > 0 else 0.0

    def close(self) -> None:
        """Finishes the line."""
        self._draw(time.perf_counter())
        self._stream.write("\n")
        self._stream.flush()

    def _draw(self, now: float) -> None:
        width = 30
        filled = int(width * min(self.done, self.total) / max(self.total, 1))
        bar = "#" * filled + "." * (width - filled)
        self._stream.write(
            f"\r{self.label} [{bar}] {self.done}/{self.total} {self.rate():,.0f} {self.unit}/s"
        )
        self._stream.flush()
