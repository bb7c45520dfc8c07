"""``iter_shard``: every record of one shard as a Python dict, for deriving datasets."""

from __future__ import annotations

import gzip
import io
import json
import os
from collections.abc import Iterator
from typing import IO, Any

import pyarrow.parquet as pq

from . import _core
from ._errors import ConfigError, MalformedShardError
from ._manifest import ManifestShard
from ._storage import StorageConfig, is_remote, normalize

__all__ = ["iter_shard"]

_CHUNK = 1024
# Remote shards are read in ranged requests of this size.
_READ_BYTES = 8 << 20


class _ObjectFile(io.RawIOBase):
    """A seekable read-only file over one opened object, read by ranged requests.

    Every request is pinned to the version seen when the object was opened.
    """

    def __init__(self, opened: _core.StorageObject) -> None:
        super().__init__()
        self._object = opened
        self._size = opened.size
        self._pos = 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self._pos

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self._pos, io.SEEK_END: self._size}[whence]
        self._pos = max(0, base + offset)
        return self._pos

    def readinto(self, buffer: Any) -> int:
        view = memoryview(buffer).cast("B")
        end = min(self._size, self._pos + len(view))
        if end <= self._pos:
            return 0
        data = self._object.read_range(self._pos, end)
        view[: len(data)] = data
        self._pos += len(data)
        return len(data)


def iter_shard(
    data_format: str,
    shard: ManifestShard | str | os.PathLike[str],
    storage_config: StorageConfig | None = None,
) -> Iterator[dict[str, Any]]:
    """Yields every record of ``shard`` (a manifest's shard, or a location) as a dict, in order.

    ``storage_config`` (``training_data.storage_config``) serves ``s3://`` shards; local paths
    need none.

    Example:
        >>> for shard in manifest.splits["train"].shards:  # doctest: +SKIP
        ...     for record in iter_shard(manifest.data_format, shard, storage_config=storage_config):
        ...         ...

    """
    if data_format not in ("parquet", "jsonl", "jsonl.gz", "msgpack"):
        raise ConfigError(
            f"invalid data_format: {data_format!r}; expected parquet, msgpack, jsonl or jsonl.gz"
        )
    uri = normalize(shard.path or shard.location) if isinstance(shard, ManifestShard) else normalize(shard)
    storage = (storage_config or StorageConfig()).core()
    if data_format == "msgpack":
        records = _core.MsgpackRecords(uri, storage)
        while chunk := records.next_chunk(_CHUNK):
            yield from (json.loads(text) for text in chunk)
        return
    opened = storage.open(uri)  # a missing shard raises ObjectNotFoundError, local or remote
    # Local files are read natively; remote objects in large ranged requests.
    raw: IO[bytes] = (
        io.BufferedReader(_ObjectFile(opened), buffer_size=_READ_BYTES) if is_remote(uri) else open(uri, "rb")  # noqa: SIM115 - closed by the with below
    )
    with raw:
        if data_format == "parquet":
            for batch in pq.ParquetFile(raw).iter_batches():
                yield from batch.to_pylist()
            return
        binary: IO[bytes] = gzip.GzipFile(fileobj=raw, mode="rb") if data_format == "jsonl.gz" else raw  # type: ignore[assignment]
        for row, line in enumerate(io.TextIOWrapper(binary, encoding="utf-8")):
            if line.strip():
                try:
                    yield json.loads(line)
                except json.JSONDecodeError as err:
                    raise MalformedShardError(f"{uri}, row {row}: {err}") from None
