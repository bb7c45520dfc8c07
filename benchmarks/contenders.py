"""Contenders: each builds the same batches (32 x 2,048 int32 tokens and a 0/1 uint8 mask,
truncated or padded with 0) from the same shards and consumes them with a NumPy reduction.

Run one contender per process: ``python benchmarks/contenders.py NAME SHARD...`` prints one
JSON line of figures (rows, seconds, time to first batch, peak RSS).
"""

from __future__ import annotations

import json
import resource
import sys
import time
from collections.abc import Callable, Iterator

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

BATCH = 32
SEQ = 2048

Batches = Iterator[tuple[np.ndarray, np.ndarray]]


def o41_stream(shards: list[str]) -> Batches:
    """This project's core stream: one finite, unshuffled stage over the shards.

    ``s3://`` shards are read with the storage settings of the ``AWS_*`` environment variables.
    """
    from o41_training_data import BatchStreamConfig, FileSource, ProjectedField, Stage, TrainingData

    config = BatchStreamConfig(
        fields=[
            ProjectedField(name="tokens", source="input_ids", dtype="i32", length=SEQ, pad=0),
            ProjectedField(name="loss_mask", source="loss_mask", dtype="bool", length=SEQ, pad=False),
        ],
        stages=[Stage(sources=[FileSource(files=shards)], batch_size=BATCH)],
        threads=int(__import__("os").environ.get("O41_THREADS", "2")),
        prefetch_batches=4,
    )
    with TrainingData().batch_stream(config) as stream:
        for batch in stream:
            arrays = batch.arrays()
            yield arrays["tokens"], arrays["loss_mask"]


def numpy_of(array: pa.Array) -> np.ndarray:
    """A NumPy view of a null-free primitive or boolean array, read from its buffers.

    ``Array.to_numpy`` makes pyarrow import pandas when it is installed (about a second, which
    would be charged to this contender); reading the buffers is what a careful user writes.
    """
    if pa.types.is_boolean(array.type):
        bits = np.frombuffer(array.buffers()[1], dtype=np.uint8)
        return np.unpackbits(bits, bitorder="little")[array.offset : array.offset + len(array)]
    dtype = np.dtype(array.type.to_pandas_dtype())
    return np.frombuffer(
        array.buffers()[1], dtype=dtype, count=len(array), offset=array.offset * dtype.itemsize
    )


def _fixed(column: pa.ListArray, dtype: type) -> np.ndarray:
    """Truncates/pads a list column to (rows, SEQ): one slice copy per row, the fastest plain way."""
    offsets = numpy_of(column.offsets)
    values = numpy_of(column.values)
    out = np.zeros((len(column), SEQ), dtype=dtype)
    for i in range(len(column)):
        start = offsets[i]
        n = min(offsets[i + 1] - start, SEQ)
        out[i, :n] = values[start : start + n]
    return out


def pyarrow_loop(shards: list[str]) -> Batches:
    """Plain ``ParquetFile.iter_batches`` plus NumPy, file after file.

    A partial batch at the end of a file is completed from the next file, as the stream does.
    """
    yield from _parquet_loop(pq.ParquetFile(path) for path in shards)


def boto3_pyarrow(shards: list[str]) -> Batches:
    """The plain object-storage loop: boto3 downloads each shard, pyarrow decodes it from memory."""
    import os

    import boto3
    from botocore.config import Config

    client = boto3.client(
        "s3",
        endpoint_url=os.environ["AWS_ENDPOINT_URL"],
        region_name=os.environ.get("AWS_REGION", "us-east-1"),
        config=Config(s3={"addressing_style": "path"}),
    )

    def files() -> Iterator[pq.ParquetFile]:
        for uri in shards:
            bucket, _, key = uri.removeprefix("s3://").partition("/")
            body = client.get_object(Bucket=bucket, Key=key)["Body"].read()
            yield pq.ParquetFile(pa.BufferReader(body))

    try:
        yield from _parquet_loop(files())
    finally:
        client.close()


def _parquet_loop(files: Iterator[pq.ParquetFile]) -> Batches:
    pending: list[pa.RecordBatch] = []
    pending_rows = 0
    for parquet_file in files:
        for record_batch in parquet_file.iter_batches(batch_size=BATCH, columns=["input_ids", "loss_mask"]):
            pending.append(record_batch)
            pending_rows += record_batch.num_rows
            while pending_rows >= BATCH:
                if len(pending) == 1 and pending[0].num_rows == BATCH:
                    batch, pending, pending_rows = pending[0], [], 0
                else:
                    table = pa.Table.from_batches(pending).combine_chunks()
                    batch = table.slice(0, BATCH).to_batches()[0]
                    rest = table.slice(BATCH)
                    pending, pending_rows = rest.to_batches(), rest.num_rows
                yield (_fixed(batch.column(0), np.int32), _fixed(batch.column(1), np.uint8))


CONTENDERS: dict[str, Callable[[list[str]], Batches]] = {
    "o41-stream": o41_stream,
    "pyarrow-loop": pyarrow_loop,
    "boto3-pyarrow": boto3_pyarrow,
}


def measure(name: str, shards: list[str]) -> dict[str, float]:
    """Runs one contender to the end and returns its figures."""
    start = time.perf_counter()
    cpu_start = time.process_time()
    first = None
    rows = 0
    checksum = 0
    for tokens, mask in CONTENDERS[name](shards):
        if first is None:
            first = time.perf_counter() - start
        assert tokens.shape == (BATCH, SEQ)
        assert mask.shape == (BATCH, SEQ)
        checksum += int(tokens.sum(dtype=np.int64)) + int(mask.sum(dtype=np.int64))
        rows += BATCH
    seconds = time.perf_counter() - start
    return {
        "rows": rows,
        "seconds": seconds,
        "rows_per_s": rows / seconds,
        "first_batch_s": first or 0.0,
        "cpu_s": time.process_time() - cpu_start,
        "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        "checksum": checksum,
    }


if __name__ == "__main__":
    print(json.dumps(measure(sys.argv[1], sys.argv[2:])))
