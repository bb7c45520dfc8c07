"""Writers of corpora other tools make, for tests that must not pull those tools' frameworks in.

megatron-core's ``IndexedDatasetBuilder`` and mosaicml-streaming's ``MDSWriter`` import PyTorch;
the core's tests run without it (``make wheel-test``). These write the same bytes from NumPy
alone: the root tests (``tests/test_corpora_peers.py``) check them against the libraries.
"""

from __future__ import annotations

import itertools
import json
import struct
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from o41_training_data import BatchStreamConfig, FileSource, ProjectedField, Stage, open_batch_stream

__all__ = [
    "MEGATRON_DTYPE_CODES",
    "assert_same_rows",
    "stream_rows",
    "token_config",
    "token_corpus",
    "token_fields",
    "write_mds_tokens_plain",
    "write_megatron_plain",
    "write_token_lists",
]


def token_corpus(lengths: Sequence[int], first: int = 1) -> list[list[int]]:
    """Documents of the given lengths holding unique ids from ``first`` on."""
    docs, next_id = [], first
    for n in lengths:
        docs.append(list(range(next_id, next_id + n)))
        next_id += n
    return docs


def write_token_lists(path: Path, docs: Sequence[Sequence[int]]) -> Path:
    """A Parquet shard of one record per document, its ids in the list column ``tokens``."""
    pq.write_table(pa.table({"tokens": pa.array(docs, pa.list_(pa.int64()))}), path, row_group_size=4)
    return path


def token_fields(width: int) -> list[ProjectedField]:
    """``tokens``, ``segment_ids`` and ``positions`` of ``width`` elements."""
    return [
        ProjectedField(name="tokens", source="tokens", dtype="i64", length=width),
        ProjectedField(name="segment_ids", source="@segment_ids", dtype="i32", length=width),
        ProjectedField(name="positions", source="@positions", dtype="i32", length=width),
    ]


def token_config(source: FileSource, seq_len: int = 8, **stage: Any) -> BatchStreamConfig:
    """One token stage over ``source`` (``packing=`` or ``windows=`` in ``stage``), a row a batch."""
    # A stream window holds the overlapping token too.
    width = seq_len + 1 if "windows" in stage else seq_len
    return BatchStreamConfig(
        fields=token_fields(width), stages=[Stage(sources=[source], batch_size=1, **stage)], threads=2
    )


def stream_rows(config: BatchStreamConfig, storage: Any = None) -> list[dict[str, np.ndarray]]:
    """Every row of a finite stream (opened by ``storage.batch_stream`` when given), as copies."""
    opened = storage.batch_stream(config) if storage is not None else open_batch_stream(config)
    out: list[dict[str, np.ndarray]] = []
    with opened as stream:
        for batch in stream:
            arrays = batch.arrays()
            out.extend({k: v[r].copy() for k, v in arrays.items()} for r in range(batch.num_rows))
    return out


def assert_same_rows(got: list[dict[str, np.ndarray]], expected: list[dict[str, np.ndarray]]) -> None:
    """The same rows, every column equal; at least one row."""
    assert len(got) == len(expected) > 0
    for r, (a, b) in enumerate(zip(got, expected, strict=True)):
        assert a.keys() == b.keys()
        for name in a:
            np.testing.assert_array_equal(a[name], b[name], err_msg=f"row {r}, {name}")


MEGATRON_DTYPE_CODES = {
    "uint8": 1,
    "int8": 2,
    "int16": 3,
    "int32": 4,
    "int64": 5,
    "float64": 6,
    "float32": 7,
    "uint16": 8,
}
"""Megatron's ``DType`` codes, by NumPy name."""


def write_megatron_plain(
    prefix: Path, docs: Sequence[Sequence[int]], dtype: str = "int32", pieces: int = 2
) -> Path:
    """``prefix.bin`` and ``prefix.idx`` as ``IndexedDatasetBuilder`` writes them.

    Each document is up to ``pieces`` sequences; no modes. Returns the ``.idx``.
    """
    sequences: list[np.ndarray] = []
    document_indices = [0]
    for doc in docs:
        cuts = [len(doc) * k // pieces for k in range(pieces + 1)]
        sequences.extend(np.asarray(doc[a:b], dtype=dtype) for a, b in itertools.pairwise(cuts))
        document_indices.append(len(sequences))
    with open(f"{prefix}.bin", "wb") as data:
        for sequence in sequences:
            data.write(sequence.tobytes())
    itemsize = np.dtype(dtype).itemsize
    pointers = np.cumsum([0] + [len(s) * itemsize for s in sequences[:-1]]) if sequences else np.array([])
    with open(f"{prefix}.idx", "wb") as idx:
        idx.write(b"MMIDIDX\x00\x00" + struct.pack("<Q", 1) + struct.pack("<B", MEGATRON_DTYPE_CODES[dtype]))
        idx.write(struct.pack("<QQ", len(sequences), len(document_indices)))
        idx.write(np.asarray([len(s) for s in sequences], np.int32).tobytes())
        idx.write(np.asarray(pointers, np.int64).tobytes())
        idx.write(np.asarray(document_indices, np.int64).tobytes())
    return Path(f"{prefix}.idx")


def write_mds_tokens_plain(out: Path, docs: Sequence[Sequence[int]], per_shard: int = 16) -> Path:
    """An uncompressed MDS dataset as ``MDSWriter`` lays it out; returns the directory.

    Its columns are ``tokens`` (``ndarray:int32``, its shape in each sample) and ``n`` (``int``).
    """
    out.mkdir(parents=True, exist_ok=True)
    names, encodings, sizes = ["tokens", "n"], ["ndarray:int32", "int"], [None, 8]
    shards: list[dict[str, Any]] = []
    for k in range(0, len(docs), per_shard):
        samples = []
        for doc in docs[k : k + per_shard]:
            ids = np.asarray(doc, np.int32)
            shape_width = 0 if len(ids) < 256 else 1 if len(ids) < 2**16 else 2
            shape = np.asarray([len(ids)], ["<u1", "<u2", "<u4"][shape_width]).tobytes()
            tokens = bytes([1 << 2 | shape_width]) + shape + ids.tobytes()
            samples.append(struct.pack("<I", len(tokens)) + tokens + struct.pack("<q", len(doc)))
        config = json.dumps(
            {"column_names": names, "column_encodings": encodings, "column_sizes": sizes}
        ).encode()
        start = 4 + 4 * (len(samples) + 1) + len(config)
        offsets = np.cumsum([start] + [len(s) for s in samples]).astype(np.uint32)
        raw = struct.pack("<I", len(samples)) + offsets.tobytes() + config + b"".join(samples)
        basename = f"shard.{len(shards):05}.mds"
        (out / basename).write_bytes(raw)
        shards.append(
            {
                "column_encodings": encodings,
                "column_names": names,
                "column_sizes": sizes,
                "compression": None,
                "format": "mds",
                "hashes": [],
                "raw_data": {"basename": basename, "bytes": len(raw), "hashes": {}},
                "samples": len(samples),
                "size_limit": 1 << 26,
                "version": 2,
                "zip_data": None,
            }
        )
    (out / "index.json").write_text(json.dumps({"shards": shards, "version": 2}))
    return out
