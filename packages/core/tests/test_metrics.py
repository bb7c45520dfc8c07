"""Stream metrics: counters exact against known data, loader-bound told from model-bound,
retries counted by cause through a fault-injecting proxy, resume semantics, and the logging
hook (plain logging; the framework hooks are tested in their packages)."""

from __future__ import annotations

import json
import logging
import time
from pathlib import Path
from typing import Any

import pytest
from o41_testkit import Fault, FaultProxy, LocalS3Server, data_for, upload, write_shard
from o41_training_data import (
    RETRY_CAUSES,
    BatchStreamConfig,
    Checkpoint,
    ConfigError,
    FileSource,
    ManifestSource,
    ProjectedField,
    Stage,
    StreamStats,
    log_stats_every,
    open_batch_stream,
    resume_batch_stream,
)

V = ProjectedField("v", "v", "i64")
SRC = ProjectedField("src", "@source", "i64")


def records(k: int, n: int) -> list[dict[str, Any]]:
    return [{"v": k * 10_000 + i, "pad": "x" * (i % 50)} for i in range(n)]


def manifest_dataset(root: Path, shards: int = 3, rows: int = 40) -> tuple[Path, list[Path]]:
    """MessagePack shards and a manifest listing them (rows and bytes)."""
    (root / "m").mkdir(parents=True)
    paths, entries = [], []
    for k in range(shards):
        path = write_shard(root / "m" / f"part-{k}.msgpack", "msgpack", records(k, rows))
        paths.append(path)
        entries.append(
            {
                "location": f"m/part-{k}.msgpack",
                "rows": rows,
                "bytes": path.stat().st_size,
                "checksum": "none:0",
            }
        )
    document = {
        "format": "o41-data-manifest",
        "version": 1,
        "data_format": "msgpack",
        "splits": {"train": {"shards": entries}},
    }
    manifest = root / "data-manifest-v1.json"
    manifest.write_text(json.dumps(document))
    return manifest, paths


def single_stage(
    sources: list[Any], batch_size: int, *, infinite: bool = False, **kwargs: Any
) -> BatchStreamConfig:
    return BatchStreamConfig(
        fields=[V, SRC],
        stages=[Stage(sources=sources, batch_size=batch_size, infinite=infinite)],
        **{"seed": 3, "threads": 1, **kwargs},
    )


# -- Counters, exact against the data.


def test_rows_bytes_shards_and_batches_match_the_shards_and_the_manifest(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Open counts a file list's rows itself, whatever this host's inspection cache remembers.
    monkeypatch.setenv("O41_INSPECT_CACHE", "off")
    manifest, msgpack_paths = manifest_dataset(tmp_path)
    jsonl_paths = [
        write_shard(tmp_path / f"extra-{k}.jsonl", "jsonl", records(100 + k, 60)) for k in range(2)
    ]
    config = single_stage(
        [
            ManifestSource(str(manifest), "train", weight=2.0),
            FileSource([str(p) for p in jsonl_paths], weight=1.0),
        ],
        batch_size=8,
    )
    delivered_by_source = [0, 0]
    batches = 0
    with open_batch_stream(config) as stream:
        for batch in stream:
            batches += 1
            for src in batch.arrays()["src"].tolist():
                delivered_by_source[src] += 1
        stats = stream.stats

    manifest_rows, jsonl_rows = 3 * 40, 2 * 60
    # A finite stage reads each source once: every row decoded once, and delivered.
    assert delivered_by_source == [manifest_rows, jsonl_rows]
    assert [s.rows_read for s in stats.sources] == [manifest_rows, jsonl_rows]
    assert [(s.stage, s.source) for s in stats.sources] == [(0, 0), (0, 1)]
    assert stats.rows_read == manifest_rows + jsonl_rows
    assert stats.batches_delivered == stats.batches_yielded == batches == (manifest_rows + jsonl_rows) // 8
    assert stats.rows_yielded == manifest_rows + jsonl_rows
    # One decode thread keeps its readers open: each shard is opened once.
    assert [s.shards_opened for s in stats.sources] == [3, 2]
    assert stats.shards_opened == 5
    assert {name: d.rows for name, d in stats.decode.items()} == {
        "msgpack": manifest_rows,
        "jsonl": jsonl_rows,
    }
    assert all(d.seconds > 0 for d in stats.decode.values())
    # Bytes: each shard is read whole twice, once to index it and once to decode it, and the
    # manifest once. Open indexes a file list's shards (it counts their rows) and the first
    # shard of a manifest source (it checks the fields against it); the stream indexes the
    # other manifest shards at their first read. A local file list's shards are read once more
    # at their first open, for their content identity (docs/storage.md), which the inspection
    # cache then keeps.
    msgpack_bytes = [p.stat().st_size for p in msgpack_paths]
    jsonl_bytes = [p.stat().st_size for p in jsonl_paths]
    manifest_bytes = manifest.stat().st_size
    assert stats.sources[0].bytes_read == 2 * sum(msgpack_bytes) - msgpack_bytes[0]
    assert stats.sources[1].bytes_read == sum(jsonl_bytes)
    assert stats.open.bytes_read == manifest_bytes + msgpack_bytes[0] + 2 * sum(jsonl_bytes)
    assert stats.bytes_read == manifest_bytes + 2 * sum(msgpack_bytes) + 3 * sum(jsonl_bytes)
    assert stats.bytes_read == stats.open.bytes_read + sum(s.bytes_read for s in stats.sources)
    assert stats.retries == dict.fromkeys(RETRY_CAUSES, 0)
    # Nothing waits in the channel once the stream has ended.
    assert stats.prefetch_depth == 0
    assert stats.prefetch_capacity == config.prefetch_batches


# -- Loader-bound or model-bound.


def test_a_slow_consumer_and_a_slow_source_are_told_apart(
    tmp_path: Path, s3_server: LocalS3Server, boto3_client: Any, s3_prefix: str, fault_proxy: FaultProxy
) -> None:
    # Slow consumer: a local source read in microseconds, a "training step" of 30 ms per batch.
    local = [write_shard(tmp_path / f"fast-{k}.jsonl", "jsonl", records(k, 80)) for k in range(2)]
    depths = []
    with open_batch_stream(single_stage([FileSource([str(p) for p in local])], batch_size=4)) as stream:
        for _ in range(40):
            next(stream)
            time.sleep(0.03)
            depths.append(stream.stats.prefetch_depth)
        slow_consumer = stream.stats

    # Slow source: every request to the object store takes 0.15 s more; the consumer does nothing.
    remote = []
    for k in range(8):
        path = write_shard(tmp_path / f"slow-{k}.jsonl", "jsonl", records(k, 20))
        remote.append(upload(boto3_client, path, f"{s3_prefix}slow-{k}.jsonl"))
    training_data = data_for(s3_server, fault_proxy.endpoint_url)
    with training_data.batch_stream(single_stage([FileSource(remote)], batch_size=4)) as stream:
        fault_proxy.add_fault(Fault(kind="delay", seconds=0.15, times=10_000))
        for _ in stream:
            pass
        slow_source = stream.stats

    assert slow_consumer.batches_delivered == 40
    assert slow_source.batches_delivered == 8 * 20 // 4
    # The consumer's sleeps are its own time; the source's latency is time next waited.
    assert slow_consumer.consumer_seconds >= 39 * 0.03
    assert slow_source.consumer_wait_seconds >= 0.15
    assert slow_consumer.loader_bound_fraction < 0.5 < slow_source.loader_bound_fraction
    assert slow_source.loader_bound_fraction > 2 * slow_consumer.loader_bound_fraction
    # A loader ahead of its consumer keeps the prefetch channel full; a slow one keeps it empty.
    assert max(depths) == slow_consumer.prefetch_capacity
    assert slow_consumer.batches_waited < slow_source.batches_waited
    # Storage waits are the source's, and they show where the time went.
    assert slow_source.sources[0].read_wait_seconds > slow_consumer.sources[0].read_wait_seconds


# -- Retries and their causes.


def test_retries_are_counted_by_cause(
    tmp_path: Path, s3_server: LocalS3Server, boto3_client: Any, s3_prefix: str, fault_proxy: FaultProxy
) -> None:
    remote = []
    for k in range(3):
        path = write_shard(tmp_path / f"part-{k}.jsonl", "jsonl", records(k, 200))
        remote.append(upload(boto3_client, path, f"{s3_prefix}part-{k}.jsonl"))
    # Matched first come, first served by the stream's GETs, at open and while streaming.
    fault_proxy.add_fault(Fault(kind="status", status=500, method="GET", times=2))
    fault_proxy.add_fault(Fault(kind="status", status=503, method="GET", times=3))
    fault_proxy.add_fault(Fault(kind="reset", after_bytes=1000, method="GET", times=2))
    fault_proxy.add_fault(Fault(kind="lose", method="GET", times=1))
    training_data = data_for(s3_server, fault_proxy.endpoint_url)
    with training_data.batch_stream(single_stage([FileSource(remote)], batch_size=10)) as stream:
        rows = sum(batch.num_rows for batch in stream)
        stats = stream.stats
    assert rows == 600
    assert fault_proxy.pending_faults == []
    assert stats.retries == {
        "throttled": 3,
        "server_error": 2,
        "timeout": 0,
        "connection": 1,
        "interrupted": 2,
    }
    assert stats.open.retries_total + stats.sources[0].retries_total == 8


def test_a_local_stream_counts_no_retries_and_its_bytes(tmp_path: Path) -> None:
    path = write_shard(tmp_path / "a.parquet", "parquet", records(0, 100), row_group_rows=10)
    with open_batch_stream(single_stage([FileSource([str(path)])], batch_size=10)) as stream:
        assert sum(batch.num_rows for batch in stream) == 100
        stats = stream.stats
    assert sum(stats.retries.values()) == 0
    # Parquet reads the footer and the projected column chunks: some bytes, never the whole
    # file's worth more than twice over (open's check and the stream's reads).
    assert 0 < stats.sources[0].bytes_read <= path.stat().st_size
    assert stats.sources[0].rows_read == 100
    assert set(stats.decode) == {"parquet"}


def test_a_closed_stream_answers_with_the_counters_it_ended_with(tmp_path: Path) -> None:
    path = write_shard(tmp_path / "a.parquet", "parquet", records(0, 100), row_group_rows=10)
    with open_batch_stream(single_stage([FileSource([str(path)])], batch_size=10)) as stream:
        for _ in range(3):
            next(stream)
        before = stream.stats
    assert stream.closed
    after = stream.stats  # a trainer's loop that broke out still reads what the stream did
    assert (after.batches_delivered, after.rows_yielded) == (before.batches_delivered, 30)
    # Reads in flight at close may still count; once closed, the counters stay where they ended.
    assert after.sources[0].bytes_read >= before.sources[0].bytes_read > 0
    assert stream.stats.sources[0].bytes_read == after.sources[0].bytes_read


# -- Resume.


def test_a_resumed_stream_continues_the_run_counters_and_restarts_the_rest(tmp_path: Path) -> None:
    paths = [write_shard(tmp_path / f"p-{k}.msgpack", "msgpack", records(k, 50)) for k in range(2)]
    config = single_stage([FileSource([str(p) for p in paths])], batch_size=5)
    with open_batch_stream(config) as stream:
        for _ in range(6):
            next(stream)
        checkpoint = Checkpoint.from_json(stream.checkpoint().to_json())
        before = stream.stats
    with resume_batch_stream(checkpoint) as resumed:
        fresh = resumed.stats
        for _ in range(4):
            next(resumed)
        after = resumed.stats
    assert before.batches_delivered == before.batches_yielded == 6
    # The run's counters come from the checkpoint...
    assert (fresh.batches_yielded, fresh.rows_yielded) == (6, 30)
    assert (after.batches_yielded, after.rows_yielded) == (10, 50)
    # ...this stream object's own start at zero.
    assert (fresh.batches_delivered, fresh.batches_waited, fresh.consumer_seconds) == (0, 0, 0.0)
    assert after.batches_delivered == 4
    assert fresh.open.bytes_read > 0
    # The resumed stream decodes from the checkpoint on: at most the 100 - 30 rows left.
    assert 20 <= after.sources[0].rows_read <= 70


# -- Windows and the plain logging hook.


def test_log_stats_every_reports_each_window(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    path = write_shard(tmp_path / "a.jsonl", "jsonl", records(0, 100))
    logger = logging.getLogger("test-o41-stats")
    with open_batch_stream(single_stage([FileSource([str(path)])], batch_size=4)) as stream:
        with caplog.at_level(logging.INFO, logger="test-o41-stats"):
            batches = list(log_stats_every(stream, 10, logger))
        total = stream.stats
    assert len(batches) == 25
    reports = [r for r in caplog.records if r.name == "test-o41-stats"]
    assert len(reports) == 2
    windows: list[StreamStats] = [r.o41_stats for r in reports]  # type: ignore[attr-defined]
    assert [w.batches_delivered for w in windows] == [10, 10]
    assert [w.batches_yielded for w in windows] == [10, 10]
    assert all("loader-bound" in r.getMessage() for r in reports)
    scalars = reports[0].o41_scalars  # type: ignore[attr-defined]
    assert scalars["batches_delivered"] == 10.0
    assert scalars["source0.0/rows_read"] == windows[0].sources[0].rows_read
    # The windows and what came after them add up to the whole.
    assert sum(w.consumer_seconds for w in windows) <= total.consumer_seconds
    assert sum(w.sources[0].rows_read for w in windows) <= total.sources[0].rows_read == 100


def test_log_stats_every_refuses_a_bad_interval(tmp_path: Path) -> None:
    path = write_shard(tmp_path / "a.jsonl", "jsonl", records(0, 8))
    config = single_stage([FileSource([str(path)])], batch_size=4)
    with open_batch_stream(config) as stream, pytest.raises(ConfigError, match="positive int"):
        next(log_stats_every(stream, 0))


def test_since_subtracts_counters_and_keeps_gauges(tmp_path: Path) -> None:
    path = write_shard(tmp_path / "a.jsonl", "jsonl", records(0, 40))
    with open_batch_stream(single_stage([FileSource([str(path)])], batch_size=4)) as stream:
        next(stream)
        first = stream.stats
        for _ in range(3):
            next(stream)
        second = stream.stats
    window = second.since(first)
    assert (window.batches_delivered, window.batches_yielded, window.rows_yielded) == (3, 3, 12)
    assert window.consumer_seconds == pytest.approx(second.consumer_seconds - first.consumer_seconds)
    assert window.prefetch_capacity == second.prefetch_capacity
    assert window.sources[0].rows_read == second.sources[0].rows_read - first.sources[0].rows_read


# -- Mixture shares: delivered rows and tokens per source and stage against the weights.


def test_the_mixture_counts_every_delivered_row_by_source_against_its_weight(tmp_path: Path) -> None:
    a = write_shard(tmp_path / "a.jsonl", "jsonl", records(0, 300))
    b = write_shard(tmp_path / "b.parquet", "parquet", records(1, 300))
    config = single_stage(
        [FileSource([str(a)], weight=3.0), FileSource([str(b)], weight=1.0)], batch_size=8, infinite=True
    )
    seen = [0, 0]
    with open_batch_stream(config) as stream:
        for _ in range(3):
            next(stream)
        before = stream.stats
        for _ in range(60):
            for value in next(stream).arrays()["v"].tolist():
                seen[value // 10_000] += 1
        after = stream.stats
    window = after.since(before)
    assert [s.rows_delivered for s in window.sources] == seen
    assert [s.rows_delivered for s in after.sources] == [
        s.rows_delivered + n for s, n in zip(before.sources, seen, strict=True)
    ]
    assert sum(s.rows_delivered for s in after.sources) == after.rows_yielded == 63 * 8
    shares = window.mixture
    assert [(m.stage, m.source, m.weight_share) for m in shares] == [(0, 0, 0.75), (0, 1, 0.25)]
    assert [m.row_share for m in shares] == [seen[0] / sum(seen), seen[1] / sum(seen)]
    assert abs(shares[0].row_share - 0.75) < 0.02  # exact mixtures hold the weights closely
    assert [(m.tokens_delivered, m.token_share) for m in shares] == [(0, 0.0), (0, 0.0)]
    assert [(s.stage, s.rows_delivered, s.tokens_delivered) for s in window.stages] == [(0, 480, 0)]
    scalars = window.scalars("d/")
    assert scalars["d/source0.1/rows_delivered"] == seen[1]
    assert scalars["d/source0.0/weight_share"] == 0.75
    assert scalars["d/stage0/rows_delivered"] == 480
    assert "d/source0.0/tokens_delivered" not in scalars


def test_a_token_stage_counts_the_tokens_it_delivers_padding_excluded(tmp_path: Path) -> None:
    from o41_testkit.corpora import token_corpus, write_token_lists
    from o41_training_data import Packing

    short = write_token_lists(tmp_path / "short.parquet", token_corpus([3, 5, 2, 7] * 10))
    long = write_token_lists(tmp_path / "long.parquet", token_corpus([11, 9, 13] * 10, first=100_000))
    config = BatchStreamConfig(
        fields=[
            ProjectedField("tokens", "tokens", "i64", length=16),
            ProjectedField("segments", "@segment_ids", "i32", length=16),
        ],
        stages=[
            Stage(
                sources=[FileSource([str(short)]), FileSource([str(long)], weight=2.0)],
                batch_size=4,
                packing=Packing(field="tokens", seq_len=16),
                infinite=True,
            )
        ],
        seed=4,
        threads=1,
    )
    tokens = [0, 0]
    rows = [0, 0]
    with open_batch_stream(config) as stream:
        for _ in range(20):
            arrays = next(stream).arrays()
            for ids, segments in zip(arrays["tokens"], arrays["segments"], strict=True):
                real = ids[segments > 0]
                source = int(real[0] >= 100_000)
                assert all((t >= 100_000) == bool(source) for t in real)
                tokens[source] += len(real)
                rows[source] += 1
        stats = stream.stats
    assert [s.tokens_delivered for s in stats.sources] == tokens
    assert [s.rows_delivered for s in stats.sources] == rows
    mixture = stats.mixture
    assert [m.token_share for m in mixture] == [tokens[0] / sum(tokens), tokens[1] / sum(tokens)]
    assert [m.weight_share for m in mixture] == pytest.approx([1 / 3, 2 / 3])
    assert stats.stages[0].tokens_delivered == sum(tokens)
    assert stats.scalars()["source0.1/tokens_delivered"] == tokens[1]
