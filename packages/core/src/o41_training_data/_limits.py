"""The engine's limits, read from the compiled engine once (not copied here): ``LIMITS``."""

from __future__ import annotations

from collections.abc import Mapping

from . import _core

__all__ = ["LIMITS"]

LIMITS: Mapping[str, int] = dict(_core.limits())
"""The engine's limits by name: ``max_world_size`` (ranks), ``max_threads``, ``max_seq_len``,
``max_bins``, ``max_ramp_steps``, ``max_position`` (batches or rows a stream may reach),
``max_nesting`` (levels of lists and objects a saved record's values may nest),
``max_retry_failures`` and ``max_retry_seconds`` (a retry policy's bounds)."""
