"""Small helpers shared by the tests."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
from o41_training_data import (
    BatchStreamConfig,
    FileSource,
    ProjectedField,
    RetryPolicy,
    Stage,
    TrainingData,
    open_batch_stream,
)
from o41_training_data._local_s3 import LocalS3Server

from .moto_server import MotoServer


def config_for(
    sources: Sequence[FileSource],
    fields: Sequence[ProjectedField],
    batch_size: int = 4,
    **kwargs: Any,
) -> BatchStreamConfig:
    """A one-stage config over ``sources``; ``infinite`` and ``shuffle`` go to the stage."""
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
    """Field ``name`` of every batch, concatenated."""
    return np.concatenate([b[name] for b in batches]) if batches else np.array([])


# -- S3 tests: storage settings for the local SeaweedFS server and uploads with boto3.

# Retries quick enough for tests; the limits under test are set per test.
QUICK = RetryPolicy(initial_backoff_s=0.01, max_backoff_s=0.05, read_timeout_s=2.0, connect_timeout_s=2.0)


def data_for(
    server: LocalS3Server | MotoServer, endpoint: str | None = None, retry: RetryPolicy = QUICK
) -> TrainingData:
    """Storage settings for ``server`` (or a proxy at ``endpoint`` before it), quick retries."""
    return TrainingData(
        s3_base_url=endpoint or server.endpoint_url,
        region=server.region,
        access_key_id=server.access_key_id,
        secret_access_key=server.secret_access_key,
        retry=retry,
    )


def upload(client: Any, path: Path, uri: str) -> str:
    """Uploads ``path`` to ``uri`` (``s3://bucket/key``) with ``client``; returns ``uri``."""
    bucket, _, key = uri.removeprefix("s3://").partition("/")
    client.upload_file(str(path), bucket, key)
    return uri


def copy_without_times(path: str | Path) -> None:
    """Replaces ``path`` by a plain copy of itself, as a restarted job's copy step does.

    Like ``cp`` without ``-p`` or a re-download: another inode and other times, the same bytes.
    """
    import os
    import shutil

    path = Path(path)
    before = path.stat()
    copy = path.with_name(f".{path.name}.copy")
    shutil.copyfile(path, copy)
    os.utime(copy, ns=(before.st_atime_ns + 10**12, before.st_mtime_ns + 10**12))
    copy.replace(path)
    after = path.stat()
    assert (after.st_ino, after.st_mtime_ns) != (before.st_ino, before.st_mtime_ns)
