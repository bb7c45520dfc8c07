"""Shard writers for the record encodings, so each behaviour is tested on each."""

from __future__ import annotations

import gzip
import json
import struct
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import msgpack
import pyarrow as pa
import pyarrow.parquet as pq
from o41_training_data import ENCODINGS as SAVER_ENCODINGS
from o41_training_data import _core

__all__ = ["ENCODINGS", "SUFFIX", "Records", "write_shard"]

ENCODINGS = list(SAVER_ENCODINGS)  # the record encodings the saver writes, as the core lists them
# Each encoding's first (longest) suffix in the engine's table, which infers it back.
SUFFIX = {e: next(s for s, named in _core.encoding_suffixes() if named == e) for e in ENCODINGS}

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
