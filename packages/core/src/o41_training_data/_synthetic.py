"""Synthetic tokenised corpora for the demo and the benchmarks.

Rows look like a language-model corpus: ``input_ids`` (variable-length int32 tokens) and a
``loss_mask`` of the same length. Generation is seeded, so a corpus is reproducible.
"""

from __future__ import annotations

import gzip
import json
from pathlib import Path
from typing import Literal

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

__all__ = ["token_table", "write_jsonl_gz", "write_parquet"]


def token_table(
    rows: int,
    *,
    seed: int,
    mean_length: int = 1500,
    max_length: int = 4096,
    vocab: int = 50_000,
    first_id: int = 0,
    spread: Literal["normal", "lognormal"] = "normal",
) -> pa.Table:
    """A table of ``rows`` tokenised documents with an ``id`` column counting from ``first_id``.

    Lengths average ``mean_length`` and are clipped to ``[1, max_length]``. ``"normal"`` draws
    them with a standard deviation of a third of the mean; ``"lognormal"`` from a log-normal
    distribution of shape 1 (median about 0.6 of the mean, one document in twenty over three
    times the mean), the long tail of many short documents that web text has.
    """
    rng = np.random.default_rng(seed)
    if spread == "normal":
        drawn = rng.normal(mean_length, mean_length / 3, rows)
    else:
        # A log-normal's mean is exp(mu + sigma^2 / 2); with sigma 1, mu = ln(mean) - 1/2.
        drawn = np.rint(rng.lognormal(np.log(mean_length) - 0.5, 1.0, rows))
    lengths = np.clip(drawn, 1, max_length).astype(np.int64)
    offsets = np.zeros(rows + 1, dtype=np.int32)
    np.cumsum(lengths, out=offsets[1:])
    tokens = rng.integers(0, vocab, int(offsets[-1]), dtype=np.int32)
    mask = rng.random(int(offsets[-1])) < 0.9
    offsets_arr = pa.array(offsets, type=pa.int32())
    return pa.table(
        {
            "id": pa.array(np.arange(first_id, first_id + rows, dtype=np.int64)),
            "input_ids": pa.ListArray.from_arrays(offsets_arr, pa.array(tokens)),
            "loss_mask": pa.ListArray.from_arrays(offsets_arr, pa.array(mask)),
        }
    )


def write_parquet(
    table: pa.Table, path: Path, *, row_group_rows: int = 1024, page_bytes: int | None = None
) -> Path:
    """Writes ``table`` as a zstd Parquet shard with row groups of ``row_group_rows``.

    ``page_bytes`` sets the data page size and writes a page index, so readers can fetch
    single pages of a row group.
    """
    options = {} if page_bytes is None else {"data_page_size": page_bytes, "write_page_index": True}
    pq.write_table(table, path, compression="zstd", row_group_size=row_group_rows, **options)
    return path


def write_jsonl_gz(table: pa.Table, path: Path) -> Path:
    """Writes ``table`` as gzip-compressed JSON Lines, one record per line.

    A batch of records at a time: a whole shard as Python objects can take tens of times its
    Arrow size, and an interrupt lands between batches.
    """
    with gzip.open(path, "wt", encoding="utf-8", compresslevel=1) as out:
        for batch in table.to_batches(max_chunksize=1024):
            for record in batch.to_pylist():
                out.write(json.dumps(record, separators=(",", ":")))
                out.write("\n")
    return path
