"""Small helpers shared by the tests."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
from o41_training_data import (
    BatchStreamConfig,
    FileSource,
    ProjectedField,
    Stage,
    open_batch_stream,
)


def config_for(
    sources: Sequence[FileSource],
    fields: Sequence[ProjectedField],
    batch_size: int = 4,
    **kwargs: Any,
) -> BatchStreamConfig:
    stage_kwargs = {k: kwargs.pop(k) for k in ("infinite", "shuffle") if k in kwargs}
    return BatchStreamConfig(
        fields=fields, stages=[Stage(sources=sources, batch_size=batch_size, **stage_kwargs)], **kwargs
    )


def collect(config: BatchStreamConfig, limit: int | None = None) -> list[dict[str, np.ndarray]]:
    """Every batch of a stream as copied arrays (so they outlive the batch)."""
    out = []
    with open_batch_stream(config) as stream:
        for i, batch in enumerate(stream):
            if limit is not None and i >= limit:
                break
            out.append({k: v.copy() for k, v in batch.arrays().items()})
    return out


def rows_of(batches: list[dict[str, np.ndarray]], name: str) -> np.ndarray:
    return np.concatenate([b[name] for b in batches]) if batches else np.array([])
