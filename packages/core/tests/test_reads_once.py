"""One rank's pass reads each byte it decodes once (issue 47).

A Parquet row group is read by several jobs: a planned group of batches ends inside it, and a
shuffled window scatters its rows over many jobs. Where the shard has no page index (pyarrow's
default) every such job needs the row group's column chunks whole; with a page index,
consecutive jobs share the page one ends and the next starts in. A compressed MDS shard is
inflated whole by the first job that reads it, on any decode thread. The stream keeps those
bytes for the later jobs, so its sources' ``bytes_read`` is the bytes decoded exactly, locally
and over S3.
"""

from __future__ import annotations

import gzip
import json
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from o41_testkit import LocalS3Server, data_for, upload
from o41_testkit.corpora import write_mds_tokens_plain
from o41_training_data import BatchStreamConfig, FileSource, ProjectedField, Shuffle, Stage, open_batch_stream

ROWS, WIDTH, GROUP = 4000, 300, 1000
T = ProjectedField("t", "tokens", "i32", length=WIDTH)


def write_corpus(path: Path, *, page_index: bool, page_bytes: int = 64 << 10) -> tuple[int, int]:
    """Four row groups of 1,000 lists of 300 ids (over 1 MiB each, so that a remote job's
    request never spans a row group it does not read), and an unprojected column beside them;
    returns the bytes of the projected column chunks and of the others."""
    values = np.random.default_rng(7).integers(0, 30_000, size=ROWS * WIDTH, dtype=np.int32)
    offsets = pa.array(np.arange(0, ROWS * WIDTH + 1, WIDTH, dtype=np.int32))
    table = pa.table({"tokens": pa.ListArray.from_arrays(offsets, values), "id": np.arange(ROWS)})
    pq.write_table(
        table,
        path,
        row_group_size=GROUP,
        compression="none",
        use_dictionary=False,
        data_page_size=page_bytes,
        write_page_index=page_index,
    )
    metadata = pq.ParquetFile(path).metadata
    assert metadata.num_row_groups == ROWS // GROUP
    chunks = [metadata.row_group(g).column(0) for g in range(metadata.num_row_groups)]
    assert all(c.path_in_schema.startswith("tokens") and c.total_compressed_size > 1 << 20 for c in chunks)
    others = [metadata.row_group(g).column(1) for g in range(metadata.num_row_groups)]
    return sum(c.total_compressed_size for c in chunks), sum(c.total_compressed_size for c in others)


def stream_config(uri: str, shuffled: bool) -> BatchStreamConfig:
    shuffle = Shuffle(buffer_rows=2048) if shuffled else None
    stage = Stage(sources=[FileSource([uri])], batch_size=16, shuffle=shuffle, infinite=False)
    return BatchStreamConfig(fields=[T], stages=[stage], threads=2, seed=5)


def one_pass(stream: Any, field: str = "t") -> tuple[list[list[int]], int]:
    """Every batch's values of ``field``, and the bytes the stream's source read."""
    with stream:
        batches = [b.arrays()[field].tolist() for b in stream]
        return batches, sum(s.bytes_read for s in stream.stats.sources)


CASES = [
    pytest.param(False, True, id="no-page-index-shuffled"),
    pytest.param(False, False, id="no-page-index-sequential"),
    pytest.param(True, False, id="page-index-sequential"),
]


@pytest.mark.parametrize(("page_index", "shuffled"), CASES)
def test_a_local_pass_reads_each_projected_byte_once(
    tmp_path: Path, page_index: bool, shuffled: bool
) -> None:
    path = tmp_path / "part-0.parquet"
    chunk_bytes, _ = write_corpus(path, page_index=page_index)
    batches, read = one_pass(open_batch_stream(stream_config(str(path), shuffled)))
    assert sum(len(b) for b in batches) == ROWS
    # Every row group is read by more than one job (planned groups of 4,096 rows start after a
    # first batch of 16), and each byte of its projected chunks still comes from the file once.
    assert read == chunk_bytes


@pytest.mark.parametrize("shuffled", [False, True], ids=["sequential", "shuffled"])
def test_a_page_several_jobs_read_is_read_once(tmp_path: Path, shuffled: bool) -> None:
    # A page index whose pages are whole column chunks (pages larger than a chunk): the first
    # job reads 16 rows of a page whose other rows later jobs read, and it is not the chunk's
    # dictionary page or a page with more pages after it.
    path = tmp_path / "part-0.parquet"
    chunk_bytes, _ = write_corpus(path, page_index=True, page_bytes=64 << 20)
    pages = pq.ParquetFile(path).metadata.row_group(0).column(0)
    assert pages.has_offset_index
    batches, read = one_pass(open_batch_stream(stream_config(str(path), shuffled)))
    assert sum(len(b) for b in batches) == ROWS
    assert read == chunk_bytes


@pytest.mark.parametrize(("page_index", "shuffled"), CASES)
def test_a_remote_pass_fetches_each_projected_byte_once(
    tmp_path: Path,
    s3_server: LocalS3Server,
    boto3_client: Any,
    s3_prefix: str,
    page_index: bool,
    shuffled: bool,
) -> None:
    path = tmp_path / "part-0.parquet"
    chunk_bytes, other_bytes = write_corpus(path, page_index=page_index)
    uri = upload(boto3_client, path, f"{s3_prefix}part-0.parquet")
    expected, _ = one_pass(open_batch_stream(stream_config(str(path), shuffled)))
    got, fetched = one_pass(data_for(s3_server).batch_stream(stream_config(uri, shuffled)))
    assert got == expected
    # A request also takes the short gaps between the ranges it joins (a request costs about a
    # megabyte of transfer): here the unprojected column's chunk between two row groups' ids,
    # which a job reading both row groups spans. Each row group's ids are fetched by one job,
    # so each gap at most once.
    assert chunk_bytes <= fetched <= chunk_bytes + other_bytes


def test_compressed_mds_shards_are_fetched_once_per_pass(tmp_path: Path) -> None:
    # Eight gzip-compressed shards of 1,000 samples, shuffled in blocks of 100 rows so that each
    # planned group of 4,096 rows reads every shard. One decode thread keeps 4 shard readers,
    # each holding its shard inflated; the stream keeps the inflated shards for all of them, so
    # a shard whose reader was closed is not fetched and inflated again by the next group.
    docs = [[k] * (1 + k % 40) for k in range(8000)]
    plain = write_mds_tokens_plain(tmp_path / "plain", docs, per_shard=1000)
    out = tmp_path / "mds"
    out.mkdir()
    index = json.loads((plain / "index.json").read_text())
    compressed = 0
    for entry in index["shards"]:
        raw = entry["raw_data"]["basename"]
        data = gzip.compress((plain / raw).read_bytes())
        (out / f"{raw}.gz").write_bytes(data)
        entry["compression"] = "gz"
        entry["zip_data"] = {"basename": f"{raw}.gz", "bytes": len(data), "hashes": {}}
        compressed += len(data)
    (out / "index.json").write_text(json.dumps(index))

    field = ProjectedField("tokens", "tokens", "i32", length=40)
    shuffle = Shuffle(buffer_rows=2000, block_rows=100)
    stage = Stage(
        sources=[FileSource([str(out)], encoding="mds")], batch_size=8, shuffle=shuffle, infinite=False
    )
    config = BatchStreamConfig(fields=[field], stages=[stage], threads=1, seed=5)
    batches, read = one_pass(open_batch_stream(config), "tokens")
    assert sorted(row[0] for batch in batches for row in batch) == list(range(8000))
    # Each shard's bytes once; the stream also reads the dataset's index.json again, once, to
    # inspect the shards open did not.
    assert compressed <= read <= compressed + (out / "index.json").stat().st_size


def test_a_gzip_stream_is_fetched_once_by_jobs_starting_at_its_access_points(tmp_path: Path) -> None:
    # One gzip stream (as `gzip` writes) of about 10 MB of lines: open notes an access point
    # every 2 MiB of output, and each read job inflates from the point before its rows. Jobs of
    # a shuffled pass start at every point, often the same one, on two threads; the compressed
    # blocks they read are kept for each other, so the pass fetches each byte once.
    rng = np.random.default_rng(11)
    lines = [json.dumps({"v": i, "text": rng.bytes(200).hex()}) for i in range(24_000)]
    path = tmp_path / "part-0.jsonl.gz"
    path.write_bytes(gzip.compress(("\n".join(lines) + "\n").encode()))
    field = ProjectedField("v", "v", "i64")
    stage = Stage(
        sources=[FileSource([str(path)])], batch_size=16, shuffle=Shuffle(buffer_rows=4096), infinite=False
    )
    config = BatchStreamConfig(fields=[field], stages=[stage], threads=2, seed=5)
    batches, read = one_pass(open_batch_stream(config), "v")
    assert sorted(v for batch in batches for v in batch) == list(range(24_000))
    assert read == path.stat().st_size
