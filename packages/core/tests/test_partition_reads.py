"""Partitions keep each window on one rank: what every rank of a world fetches from S3.

Eight ranks read one pass over a Parquet corpus whose row groups each hold one shuffle window,
through a proxy that logs every request. With ``partitions=8`` each data byte of the corpus is
fetched by exactly one rank; with one partition (the layout before partitions) every rank
fetches most of the corpus.
"""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from o41_testkit import LocalS3Server, data_for, upload
from o41_testkit.fault_proxy import FaultProxy
from o41_training_data import BatchStreamConfig, FileSource, ProjectedField, Shuffle, Stage

WORLD = 8
SHARDS, ROWS, GROUP, WIDTH = 8, 512, 64, 1024
FIELDS = [ProjectedField("v", "v", "i64"), ProjectedField("x", "x", "i32", length=WIDTH)]
# Every rank that opens a remote Parquet shard reads its last 256 KiB at once, for the footer
# (the engine's `REMOTE_TAIL_BYTES`): the row groups there are read by each rank that opens it.
TAIL = 256 << 10

Span = tuple[int, int]


@pytest.fixture
def corpus(tmp_path: Path, boto3_client: Any, s3_prefix: str) -> dict[str, list[Span]]:
    """The shards' S3 URIs, each with the byte ranges of its row groups' column chunks before
    the tail every rank reads for the footer."""
    rng = np.random.default_rng(5)
    chunks: dict[str, list[Span]] = {}
    for k in range(SHARDS):
        v = np.arange(k * ROWS, (k + 1) * ROWS, dtype=np.int64)
        x = pa.FixedSizeListArray.from_arrays(
            pa.array(rng.integers(0, 1 << 30, ROWS * WIDTH, dtype=np.int32)), WIDTH
        ).cast(pa.list_(pa.int32()))
        path = tmp_path / f"part-{k}.parquet"
        pq.write_table(
            pa.table({"v": v, "x": x}),
            path,
            row_group_size=GROUP,
            use_dictionary=False,
            write_page_index=True,
        )
        meta = pq.ParquetFile(path).metadata
        uri = upload(boto3_client, path, f"{s3_prefix}part-{k}.parquet")
        tail = path.stat().st_size - TAIL
        chunks[uri] = [
            (column.data_page_offset, column.data_page_offset + column.total_compressed_size)
            for g in range(meta.num_row_groups)
            for column in (meta.row_group(g).column(c) for c in range(meta.num_columns))
            if column.data_page_offset + column.total_compressed_size <= tail
        ]
        assert len(chunks[uri]) >= 8, "most row groups lie before the tail"
    return chunks


def config(
    files: list[str], rank: int, partitions: int, weights: tuple[float, ...] = (1.0,)
) -> BatchStreamConfig:
    # A window is one row group: 64 rows, four batches of 16. Several weights split the files
    # into as many sources, in order.
    per = len(files) // len(weights)
    stage = Stage(
        sources=[FileSource(files[j * per : (j + 1) * per], weight=w) for j, w in enumerate(weights)],
        batch_size=16,
        shuffle=Shuffle(buffer_rows=GROUP, unit_rows=4),
        infinite=False,
    )
    return BatchStreamConfig(
        fields=FIELDS, stages=[stage], seed=9, rank=rank, world_size=WORLD, partitions=partitions, threads=2
    )


def fetched_by_rank(
    s3_server: LocalS3Server,
    proxy: FaultProxy,
    files: list[str],
    partitions: int,
    weights: tuple[float, ...] = (1.0,),
) -> tuple[list[dict[str, list[Span]]], list[int]]:
    """Each rank's GET ranges per object key, and the rows each rank received."""
    per_rank: list[dict[str, list[Span]]] = []
    rows: list[int] = []
    for rank in range(WORLD):
        before = len(proxy.requests)
        stream_config = config(files, rank, partitions, weights)
        with data_for(s3_server, proxy.endpoint_url).batch_stream(stream_config) as stream:
            rows.extend(v for batch in stream for v in batch.arrays()["v"].tolist())
        spans: dict[str, list[Span]] = defaultdict(list)
        for request in proxy.requests[before:]:
            if request.method == "GET" and request.range:
                first, last = request.range.removeprefix("bytes=").split("-")
                spans[request.path.split("?")[0]].append((int(first), int(last) + 1))
        per_rank.append(spans)
    return per_rank, rows


def readers(per_rank: list[dict[str, list[Span]]], key: str, chunk: Span) -> set[int]:
    """The ranks that fetched any byte of ``chunk`` of object ``key``."""
    return {
        rank
        for rank, spans in enumerate(per_rank)
        if any(first < chunk[1] and chunk[0] < last for first, last in spans.get(key, []))
    }


def key_of(uri: str) -> str:
    return "/" + uri.removeprefix("s3://")


@pytest.mark.parametrize("weights", [(1.0,), (2.0, 1.0)], ids=["one source", "two sources 2:1"])
def test_with_partitions_each_data_byte_is_fetched_by_one_rank(
    s3_server: LocalS3Server,
    fault_proxy: FaultProxy,
    corpus: dict[str, list[Span]],
    weights: tuple[float, ...],
) -> None:
    # Two sources 2:1: a window of 64 rows holds 42 or 43 rows of the first, so windows of the
    # mix dealt to ranks (partition layout 1) cut row groups that two ranks then both read;
    # shares of each source's epoch (layout 2: 256 rows, four whole row groups) do not.
    files = list(corpus)
    per_rank, rows = fetched_by_rank(s3_server, fault_proxy, files, partitions=WORLD, weights=weights)
    assert sorted(rows) == list(range(SHARDS * ROWS)), "one pass delivers every row once"
    shared = []
    for uri, chunks in corpus.items():
        for chunk in chunks:
            ranks = readers(per_rank, key_of(uri), chunk)
            assert ranks, f"no rank fetched {chunk} of {uri}"
            if len(ranks) > 1:
                shared.append((uri, chunk, ranks))
    # Open checks the first record of each source's first shard on every rank: that shard's
    # first row group is the one chunk more than one rank may fetch.
    firsts = files[:: len(files) // len(weights)]
    assert all(uri in firsts and chunk in corpus[uri][:2] for uri, chunk, _ in shared), shared


def test_without_partitions_every_rank_fetches_most_of_the_corpus(
    s3_server: LocalS3Server, fault_proxy: FaultProxy, corpus: dict[str, list[Span]]
) -> None:
    # The contrast that makes the test above mean something: one partition, the same world.
    per_rank, rows = fetched_by_rank(s3_server, fault_proxy, list(corpus), partitions=1)
    assert len(rows) == len(set(rows))
    chunks = [(key_of(uri), chunk) for uri, spans in corpus.items() for chunk in spans]
    fetched = sum(len(readers(per_rank, key, chunk)) for key, chunk in chunks)
    assert fetched > len(chunks) * WORLD // 2
