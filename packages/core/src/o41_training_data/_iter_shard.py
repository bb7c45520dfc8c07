"""``iter_shard``: every record of one shard as a Python dict, for deriving datasets."""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

import pyarrow as pa

from . import _core
from ._config import ENCODINGS, IN_PLACE_ENCODINGS
from ._errors import UnsupportedFormatError
from ._errors import invalid as _invalid
from ._manifest import ManifestShard
from ._storage import StorageConfig, normalize

__all__ = ["iter_shard"]

# Records decoded per call into the engine: large enough that the call costs nothing per record.
_CHUNK = 1024


def _next_chunk(records: _core.ShardRecords, uri: str) -> list[dict[str, Any]] | pa.RecordBatch | None:
    try:
        return records.next_chunk(_CHUNK)
    except pa.ArrowInvalid as error:
        # Arrow's C data interface refuses what Parquet allows: a NUL in a column's name.
        refused = UnsupportedFormatError(f"{uri}: its columns cannot be handed to Python: {error}")
        refused.path = uri
        raise refused from None


def iter_shard(
    data_format: str,
    shard: ManifestShard | str | os.PathLike[str],
    storage_config: StorageConfig | None = None,
) -> Iterator[dict[str, Any]]:
    """Yields every record of ``shard`` (a manifest's shard, or a location) as a dict, in order.

    The engine reads the shard, in chunks, exactly as a stream does: the ``k``-th record yielded
    is the stream's row ``k`` of that shard (a blank JSON line is not a record), and a record that
    cannot be decoded raises :class:`MalformedShardError` naming the shard and row. Parquet rows
    carry every column; JSON Lines and MessagePack records must be maps; a Megatron dataset's
    record is one document, its ids under ``tokens`` (the dataset named by its ``.bin``, its
    ``.idx`` or their common prefix), as is an ArrayRecord file's of ids
    (``array_record:uint16``); an ArrayRecord file of JSON or MessagePack yields its maps.
    ``storage_config``
    (``training_data.storage_config``) serves ``s3://`` shards; local paths need none.

    Examples:
        >>> for shard in manifest.splits["train"].shards:  # doctest: +SKIP
        ...     for record in iter_shard(manifest.data_format, shard, storage_config=storage_config):
        ...         ...

    """
    readable = (*ENCODINGS, *IN_PLACE_ENCODINGS)
    if data_format not in readable:
        raise _invalid("data_format", f"{data_format!r}; expected one of {', '.join(readable)}")
    uri = normalize(shard.path or shard.location if isinstance(shard, ManifestShard) else shard, "shard")
    records = _core.ShardRecords(uri, data_format, (storage_config or StorageConfig()).core(), _CHUNK)
    while (chunk := _next_chunk(records, uri)) is not None:
        # Parquet arrives as Arrow; its rows become dicts in pyarrow's C++, not here.
        yield from chunk if isinstance(chunk, list) else chunk.to_pylist()
