"""The first end-to-end stream: batches, zero-copy hand-over, lifecycle, mix and ranks."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest
from o41_testkit import ShardWriter, collect, config_for, rows_of
from o41_training_data import (
    Batch,
    FileSource,
    ProjectedField,
    StreamClosedError,
    open_batch_stream,
    resolve_batch_stream_config,
)

ID = ProjectedField("id", "id", "i64")
TOKENS = ProjectedField("tokens", "tokens", "i32", length=8, pad=0)


def records(start: int, n: int) -> list[dict]:
    return [{"id": i, "tokens": list(range(i % 11)), "text": f"row {i}"} for i in range(start, start + n)]


def test_rows_arrive_in_file_order_across_shards(shard: ShardWriter, encoding: str) -> None:
    files = [shard(encoding, records(0, 7)), shard(encoding, records(7, 5))]
    batches = collect(config_for([FileSource(files=files)], [ID, TOKENS], batch_size=4))
    assert len(batches) == 3  # 12 rows, batch 4
    np.testing.assert_array_equal(rows_of(batches, "id"), np.arange(12))
    tokens = rows_of(batches, "tokens")
    for i in range(12):
        expected = list(range(min(i % 11, 8))) + [0] * (8 - min(i % 11, 8))
        np.testing.assert_array_equal(tokens[i], expected)


def test_long_shards_read_in_parallel_units_keep_order(shard: ShardWriter, encoding: str) -> None:
    # More rows than one decode unit and one index stride, so units are read from mid-shard.
    files = [
        shard(encoding, records(0, 3000), row_group_rows=700)
        if encoding == "parquet"
        else shard(encoding, records(0, 3000))
    ]
    ids = rows_of(collect(config_for([FileSource(files=files)], [ID], batch_size=100, threads=3)), "id")
    np.testing.assert_array_equal(ids, np.arange(3000))


def test_batch_exposes_pyarrow_columns_stage_and_index(shard: ShardWriter) -> None:
    path = shard("parquet", records(0, 8))
    with open_batch_stream(config_for([FileSource(files=[path])], [ID, TOKENS], batch_size=4)) as stream:
        first, second = list(stream)
    assert isinstance(first, Batch)
    assert isinstance(first.columns, pa.RecordBatch)
    assert first.columns.schema.names == ["id", "tokens"]
    assert first.columns.schema.field("tokens").type == pa.list_(
        pa.field("item", pa.int32(), nullable=False), 8
    )
    assert (first.stage, first.batch_index, second.batch_index) == (0, 0, 1)
    assert first.num_rows == 4


def test_arrays_are_views_over_the_arrow_buffers(shard: ShardWriter) -> None:
    path = shard("parquet", records(0, 8))
    fields = [ID, TOKENS]
    with open_batch_stream(config_for([FileSource(files=[path])], fields, batch_size=8)) as stream:
        batch = next(stream)
        arrays = batch.arrays()
        tokens = arrays["tokens"]
        assert tokens.shape == (8, 8)
        data_buffer = batch.columns.column(1).values.buffers()[1]
        assert tokens.ctypes.data == data_buffer.address
        assert np.shares_memory(tokens, np.frombuffer(data_buffer, dtype=np.int32))
        assert arrays["id"].ctypes.data == batch.columns.column(0).buffers()[1].address
        assert not tokens.flags.writeable


def test_nested_arrays_are_views_too(shard: ShardWriter) -> None:
    path = shard("jsonl", [{"g": [[1, 2], [3, 4]]}] * 3)
    field = ProjectedField("g", "g", "f64", shape=(2, 2))
    with open_batch_stream(config_for([FileSource(files=[path])], [field], batch_size=3)) as stream:
        batch = next(stream)
        g = batch.arrays()["g"]
        leaf = batch.columns.column(0).values.values
        assert g.shape == (3, 2, 2)
        assert g.ctypes.data == leaf.buffers()[1].address


@pytest.mark.parametrize("batch_size", [1, 3, 8])
def test_every_column_starts_on_a_64_byte_boundary(shard: ShardWriter, batch_size: int) -> None:
    # Arrow's recommended alignment; JAX's CPU client views aligned host memory instead of copying.
    path = shard("msgpack", [{"g": [[1.5, 2.0, 3.0]], "mask": [True], "id": k} for k in range(9)])
    fields = [
        ProjectedField("g", "g", "f32", shape=(1, 3)),
        ProjectedField("mask", "mask", "bool", length=5, pad=False),
        ProjectedField("id", "id", "i64"),
    ]
    config = config_for([FileSource(files=[path])], fields, batch_size=batch_size)
    with open_batch_stream(config) as stream:
        for batch in stream:
            assert [a.ctypes.data % 64 for a in batch.arrays().values()] == [0, 0, 0]


def test_context_manager_closes_and_close_is_idempotent(shard: ShardWriter) -> None:
    path = shard("parquet", records(0, 40))
    with open_batch_stream(config_for([FileSource(files=[path])], [ID], batch_size=4)) as stream:
        next(stream)
    assert stream.closed
    stream.close()
    assert stream.closed
    with pytest.raises(StreamClosedError):
        next(stream)


def test_close_mid_stream_of_an_infinite_stage(shard: ShardWriter) -> None:
    path = shard("jsonl.gz", records(0, 50))
    stream = open_batch_stream(
        config_for([FileSource(files=[path])], [ID, TOKENS], batch_size=8, infinite=True)
    )
    ids = [next(stream).arrays()["id"].copy() for _ in range(20)]
    stream.close()
    # 20 batches of 8 = 160 rows: three full epochs of 50 and part of a fourth, in order.
    np.testing.assert_array_equal(np.concatenate(ids), np.arange(160) % 50)


def test_finite_stage_drops_the_partial_batch_and_reports_it(shard: ShardWriter) -> None:
    path = shard("msgpack", records(0, 10))
    with open_batch_stream(config_for([FileSource(files=[path])], [ID], batch_size=4)) as stream:
        batches = list(stream)
        assert len(batches) == 2
        stats = stream.stats
    assert (stats.batches_yielded, stats.rows_yielded, stats.dropped_rows) == (2, 8, 2)


def test_weighted_mix_interleaves_three_to_one(shard: ShardWriter) -> None:
    a = shard("parquet", [{"id": i} for i in range(300)])
    b = shard("jsonl", [{"id": 1000 + i} for i in range(100)])
    config = config_for(
        [FileSource(files=[a], weight=3.0), FileSource(files=[b], weight=1.0)], [ID], batch_size=8
    )
    ids = rows_of(collect(config), "id")
    assert len(ids) == 400
    from_b = ids >= 1000
    # Every prefix holds each source's share to within one row.
    prefix = np.cumsum(from_b)
    expected = np.arange(1, 401) * 0.25
    assert np.all(np.abs(prefix - expected) <= 1.0)
    # Each source keeps its own order.
    np.testing.assert_array_equal(ids[~from_b], np.arange(300))
    np.testing.assert_array_equal(ids[from_b], 1000 + np.arange(100))


def test_exhausted_source_leaves_the_mix(shard: ShardWriter) -> None:
    a = shard("parquet", [{"id": i} for i in range(20)])
    b = shard("parquet", [{"id": 1000 + i} for i in range(4)])
    config = config_for([FileSource(files=[a]), FileSource(files=[b])], [ID], batch_size=4)
    ids = rows_of(collect(config), "id")
    assert sorted(ids.tolist()) == [*list(range(20)), 1000, 1001, 1002, 1003]
    assert set(ids[8:].tolist()) <= set(range(20))


@pytest.mark.parametrize(("threads", "prefetch"), [(1, 0), (1, 8), (4, 0), (8, 8)])
def test_content_does_not_depend_on_threads_or_prefetch(
    shard: ShardWriter, threads: int, prefetch: int
) -> None:
    files = [shard("jsonl.gz", records(0, 2500)), shard("parquet", records(2500, 1500))]
    other = shard("msgpack", records(9000, 1200))
    sources = [FileSource(files=files, weight=2.0), FileSource(files=[other], weight=1.0)]
    reference = collect(config_for(sources, [ID, TOKENS], batch_size=16, threads=2, prefetch_batches=2))
    candidate = collect(
        config_for(sources, [ID, TOKENS], batch_size=16, threads=threads, prefetch_batches=prefetch)
    )
    assert len(candidate) == len(reference) == 325
    for a, b in zip(reference, candidate, strict=True):
        np.testing.assert_array_equal(a["id"], b["id"])
        np.testing.assert_array_equal(a["tokens"], b["tokens"])


@pytest.mark.parametrize("world_size", [1, 2, 3])
def test_ranks_take_interleaved_global_batches(shard: ShardWriter, world_size: int) -> None:
    path = shard("parquet", records(0, 50))
    per_rank = []
    for rank in range(world_size):
        config = config_for([FileSource(files=[path])], [ID], batch_size=4, rank=rank, world_size=world_size)
        with open_batch_stream(config) as stream:
            per_rank.append([(b.batch_index, b.arrays()["id"].copy()) for b in stream])
    counts = {len(batches) for batches in per_rank}
    assert len(counts) == 1  # every rank yields the same number of batches
    usable = (50 // 4) // world_size * world_size
    for rank, batches in enumerate(per_rank):
        assert [g for g, _ in batches] == list(range(rank, usable, world_size))
        for g, ids in batches:
            np.testing.assert_array_equal(ids, np.arange(g * 4, g * 4 + 4))


def test_resolved_config_pins_shards_and_row_counts(shard: ShardWriter, tmp_path, monkeypatch) -> None:
    a = shard("parquet", records(0, 5))
    b = shard("jsonl.gz", records(0, 3))
    monkeypatch.chdir(tmp_path)
    relative = FileSource(files=[a.rsplit("/", 1)[1], b.rsplit("/", 1)[1]])
    resolved = resolve_batch_stream_config(config_for([relative], [ID], batch_size=2))
    shards = resolved["stages"][0]["sources"][0]["shards"]
    assert [(s["path"], s["encoding"], s["rows"]) for s in shards] == [(a, "parquet", 5), (b, "jsonl.gz", 3)]
    assert resolved["version"] == 1
    with open_batch_stream(config_for([relative], [ID], batch_size=2)) as stream:
        assert stream.resolved_config() == resolved


def test_memory_bound_is_reported_and_enforced(shard: ShardWriter) -> None:
    from o41_training_data import ConfigError

    path = shard("parquet", records(0, 8))
    with open_batch_stream(config_for([FileSource(files=[path])], [TOKENS], batch_size=4)) as stream:
        bound = stream.memory_bound
    assert bound.total == bound.batches + bound.decode_units + bound.readers + bound.decode_scratch
    assert bound.decode_scratch > 0
    # (prefetch + 1) batches of 4 rows, plus two planned groups of at least 4096 rows; 8 int32 a row
    assert bound.batches == ((2 + 1) * 4 + 2 * 4096) * 8 * 4
    with pytest.raises(ConfigError, match="memory_limit_bytes.*decode units") as info:
        open_batch_stream(
            config_for([FileSource(files=[path])], [TOKENS], batch_size=4, memory_limit_bytes=1000)
        )
    assert info.value.option == "memory_limit_bytes"
