"""``iter_shard``: every record of one shard as a Python dict, for deriving datasets."""

from __future__ import annotations

import gzip
import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq

from . import _core
from ._errors import ConfigError, MalformedShardError, ObjectNotFoundError
from ._manifest import ManifestShard

__all__ = ["iter_shard"]

_CHUNK = 1024


def iter_shard(
    data_format: str, shard: ManifestShard | str | os.PathLike[str], storage_config: object | None = None
) -> Iterator[dict[str, Any]]:
    """Yields every record of ``shard`` (a manifest's shard, or a path) as a dict, in order.

    Example:
        >>> for shard in manifest.splits["train"].shards:  # doctest: +SKIP
        ...     for record in iter_shard(manifest.data_format, shard):
        ...         ...

    """
    if storage_config is not None:
        raise ConfigError("storage_config: object storage is not available in this release; use local shards")
    path = Path(shard.path or shard.location) if isinstance(shard, ManifestShard) else Path(shard)
    if not path.exists():
        raise ObjectNotFoundError(f"{path}: not found")
    if data_format == "parquet":
        for batch in pq.ParquetFile(path).iter_batches():
            yield from batch.to_pylist()
    elif data_format in ("jsonl", "jsonl.gz"):
        opener = gzip.open if data_format == "jsonl.gz" else open
        with opener(path, "rt", encoding="utf-8") as lines:
            for row, line in enumerate(lines):
                if line.strip():
                    try:
                        yield json.loads(line)
                    except json.JSONDecodeError as err:
                        raise MalformedShardError(f"{path}, row {row}: {err}") from None
    elif data_format == "msgpack":
        start = 0
        while True:
            chunk = _core.msgpack_records(str(path), start, _CHUNK)
            yield from (json.loads(text) for text in chunk)
            if len(chunk) < _CHUNK:
                return
            start += len(chunk)
    else:
        raise ConfigError(
            f"invalid data_format: {data_format!r}; expected parquet, msgpack, jsonl or jsonl.gz"
        )
