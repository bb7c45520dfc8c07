"""Shared fixtures: shard writers for every encoding, so each behaviour is tested on each."""

from __future__ import annotations

import gzip
import json
import os
import struct
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import msgpack
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import HealthCheck, settings

# CI explores the same examples on every run (derandomize) so a landing never depends on luck;
# HYPOTHESIS_PROFILE=thorough explores many more, freshly drawn.
settings.register_profile(
    "ci",
    max_examples=40,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
    derandomize=bool(os.environ.get("CI")),
)
settings.register_profile("thorough", max_examples=500, deadline=None)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))

ENCODINGS = ["parquet", "jsonl", "jsonl.gz", "msgpack"]
SUFFIX = {"parquet": ".parquet", "jsonl": ".jsonl", "jsonl.gz": ".jsonl.gz", "msgpack": ".msgpack"}

Records = Sequence[dict[str, Any]]


def write_shard(
    path: Path, encoding: str, records: Records, schema: pa.Schema | None = None, row_group_rows: int = 1000
) -> Path:
    """Writes ``records`` to ``path`` in ``encoding``; framed MessagePack is u32-LE length + map."""
    if encoding == "parquet" and schema is None and not records:
        raise ValueError("an empty Parquet shard needs a schema")
    if encoding == "parquet":
        table = pa.Table.from_pylist(list(records), schema=schema)
        pq.write_table(table, path, row_group_size=row_group_rows)
    elif encoding == "jsonl":
        path.write_text("".join(json.dumps(r) + "\n" for r in records))
    elif encoding == "jsonl.gz":
        with gzip.open(path, "wt") as out:
            out.writelines(json.dumps(r) + "\n" for r in records)
    elif encoding == "msgpack":
        with path.open("wb") as out:
            for r in records:
                frame = msgpack.packb(r)
                out.write(struct.pack("<I", len(frame)))
                out.write(frame)
    else:  # pragma: no cover - a test bug
        raise AssertionError(encoding)
    return path


ShardWriter = Callable[..., str]


@pytest.fixture
def shard(tmp_path: Path) -> ShardWriter:
    """``shard(encoding, records, name=..., schema=...)`` writes a shard and returns its path."""
    counter = iter(range(1_000_000))

    def write(encoding: str, records: Records, name: str | None = None, **kwargs: Any) -> str:
        name = name or f"shard-{next(counter):04d}"
        return str(write_shard(tmp_path / f"{name}{SUFFIX[encoding]}", encoding, records, **kwargs))

    return write


@pytest.fixture(params=ENCODINGS)
def encoding(request: pytest.FixtureRequest) -> str:
    """Every shard encoding in turn."""
    return str(request.param)
