"""Streams over S3 (a real SeaweedFS server): identical batches, recovery, fail-closed errors."""

from __future__ import annotations

import itertools
import json
import pickle
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from o41_testkit import QUICK, SUFFIX, Fault, FaultProxy, LocalS3Server, data_for, upload, write_shard
from o41_training_data import (
    AccessDeniedError,
    BatchStreamConfig,
    Checkpoint,
    ConfigError,
    FileSource,
    MalformedShardError,
    ObjectNotFoundError,
    ProjectedField,
    RetryPolicy,
    Shuffle,
    Stage,
    StorageError,
    TrainingData,
    iter_shard,
    open_batch_stream,
)

V = ProjectedField("v", "v", "i64")
T = ProjectedField("t", "tokens", "i32", length=3)


def records(shard: int, n: int) -> list[dict[str, Any]]:
    return [{"v": shard * 10_000 + i, "tokens": [i % 7] * (i % 4), "pad": "x" * 200} for i in range(n)]


def make_shards(
    tmp_path: Path, client: Any, prefix: str, encoding: str, count: int = 3, rows: int = 300
) -> tuple[list[str], list[str]]:
    """Writes ``count`` shards locally and uploads each; returns (local paths, s3 uris)."""
    local, remote = [], []
    for k in range(count):
        path = write_shard(
            tmp_path / f"part-{k}{SUFFIX[encoding]}", encoding, records(k, rows), row_group_rows=64
        )
        local.append(str(path))
        remote.append(upload(client, path, f"{prefix}part-{k}{SUFFIX[encoding]}"))
    return local, remote


def config(sources: list[FileSource], batch_size: int = 16, window: int = 128) -> BatchStreamConfig:
    return BatchStreamConfig(
        fields=[V, T],
        stages=[
            Stage(sources=sources, batch_size=batch_size, shuffle=Shuffle(buffer_rows=window, unit_rows=4))
        ],
        seed=7,
        threads=2,
    )


def batches(stream_factory: Any) -> list[tuple[list[int], list[list[int]]]]:
    with stream_factory() as stream:
        return [(b.arrays()["v"].tolist(), b.arrays()["t"].tolist()) for b in stream]


@pytest.mark.parametrize("encoding", ["parquet", "jsonl", "jsonl.gz", "msgpack"])
def test_a_stream_from_s3_equals_the_stream_from_local_copies(
    tmp_path: Path, s3_server: LocalS3Server, boto3_client: Any, s3_prefix: str, encoding: str
) -> None:
    local, remote = make_shards(tmp_path, boto3_client, s3_prefix, encoding)
    training_data = data_for(s3_server)
    expected = batches(lambda: open_batch_stream(config([FileSource(local, weight=2.0)])))
    got = batches(lambda: training_data.batch_stream(config([FileSource(remote, weight=2.0)])))
    assert got == expected
    assert len(expected) == 900 // 16


@pytest.mark.parametrize("encoding", ["parquet", "jsonl.gz"])
def test_a_drop_stream_from_s3_equals_the_one_from_local_copies(
    tmp_path: Path, s3_server: LocalS3Server, boto3_client: Any, s3_prefix: str, encoding: str
) -> None:
    from dataclasses import replace

    local, remote = make_shards(tmp_path, boto3_client, s3_prefix, encoding)
    # Records whose `tokens` list holds 3 values are left out: a quarter of them.
    dropping = ProjectedField("t", "tokens", "i32", length=2, overflow="drop")
    local_config = replace(config([FileSource(local)]), fields=[V, dropping])
    remote_config = replace(config([FileSource(remote)]), fields=[V, dropping])
    expected = batches(lambda: open_batch_stream(local_config))
    training_data = data_for(s3_server)
    got = batches(lambda: training_data.batch_stream(remote_config))
    assert got == expected
    assert len(expected) == (900 - 225) // 16
    with training_data.batch_stream(remote_config) as stream:
        assert [s.dropped_rows for s in stream.stats.sources] == [225]


def test_local_and_s3_sources_mix_in_one_stream(
    tmp_path: Path, s3_server: LocalS3Server, boto3_client: Any, s3_prefix: str
) -> None:
    local, remote = make_shards(tmp_path, boto3_client, s3_prefix, "parquet")
    mixed = [FileSource(local[:1], weight=1.0), FileSource(remote[1:], weight=3.0)]
    all_local = [FileSource(local[:1], weight=1.0), FileSource(local[1:], weight=3.0)]
    training_data = data_for(s3_server)
    assert batches(lambda: training_data.batch_stream(config(mixed))) == batches(
        lambda: open_batch_stream(config(all_local))
    )


def test_an_s3_source_without_storage_settings_fails_at_open(s3_prefix: str) -> None:
    with pytest.raises(ConfigError, match=r"stages\[0\]\.sources\[0\]\.files\[0\].*TrainingData") as info:
        open_batch_stream(config([FileSource([f"{s3_prefix}part-0.parquet"])]))
    assert info.value.option == "stages[0].sources[0].files[0]"


def test_a_checkpoint_resumes_from_s3_and_holds_no_credentials(
    tmp_path: Path, s3_server: LocalS3Server, boto3_client: Any, s3_prefix: str
) -> None:
    _, remote = make_shards(tmp_path, boto3_client, s3_prefix, "jsonl.gz")
    training_data = data_for(s3_server)
    cfg = config([FileSource(remote)])
    full = batches(lambda: training_data.batch_stream(cfg))
    with training_data.batch_stream(cfg) as stream:
        for _ in range(10):
            next(stream)
        text = stream.checkpoint().to_json()
    resolved = json.dumps(training_data.resolve_batch_stream_config(cfg))
    for secret in (s3_server.secret_access_key, s3_server.access_key_id):
        assert secret not in text
        assert secret not in resolved
    assert remote[0] in text
    resumed = batches(lambda: training_data.resume_batch_stream(Checkpoint.from_json(text)))
    assert resumed == full[10:]


def test_missing_objects_fail_closed_at_open(s3_server: LocalS3Server, s3_prefix: str) -> None:
    missing = f"{s3_prefix}nothing-here.parquet"
    with pytest.raises(ObjectNotFoundError, match="nothing-here") as info:
        data_for(s3_server).batch_stream(config([FileSource([missing])]))
    assert info.value.path == missing


def test_a_malformed_shard_in_s3_fails_closed_at_open(
    s3_server: LocalS3Server, boto3_client: Any, s3_prefix: str, tmp_path: Path
) -> None:
    bad = tmp_path / "bad.parquet"
    bad.write_bytes(b"PAR1 this is not a parquet file PAR1")
    broken = upload(boto3_client, bad, f"{s3_prefix}bad.parquet")
    with pytest.raises(MalformedShardError) as info:
        data_for(s3_server).batch_stream(config([FileSource([broken])]))
    assert info.value.path == broken


def test_bad_credentials_fail_closed_without_leaking_them(
    tmp_path: Path,
    s3_server: LocalS3Server,
    boto3_client: Any,
    s3_prefix: str,
    capfd: pytest.CaptureFixture[str],
    caplog: pytest.LogCaptureFixture,
) -> None:
    _, remote = make_shards(tmp_path, boto3_client, s3_prefix, "parquet", count=1)
    wrong_secret = "wrong-" + s3_server.secret_access_key[::-1]
    for key_id, secret in [(s3_server.access_key_id, wrong_secret), ("O41UNKNOWNKEY", wrong_secret)]:
        bad = TrainingData(
            s3_base_url=s3_server.endpoint_url,
            region=s3_server.region,
            access_key_id=key_id,
            secret_access_key=secret,
            retry=QUICK,
        )
        with pytest.raises(AccessDeniedError) as info:
            bad.batch_stream(config([FileSource(remote)]))
        message = str(info.value)
        assert remote[0] in message
        for leaked in (secret, key_id, s3_server.secret_access_key):
            assert leaked not in message
            assert leaked not in repr(bad)
    # Nothing printed or logged on the way carries them either.
    captured = capfd.readouterr()
    logged = captured.out + captured.err + caplog.text
    for leaked in (wrong_secret, s3_server.secret_access_key, "O41UNKNOWNKEY"):
        assert leaked not in logged


@pytest.mark.parametrize(("encoding", "after_bytes"), [("jsonl", 20_000), ("parquet", 500)])
def test_reset_connections_resume_byte_exact(
    tmp_path: Path,
    s3_server: LocalS3Server,
    boto3_client: Any,
    s3_prefix: str,
    fault_proxy: FaultProxy,
    encoding: str,
    after_bytes: int,
) -> None:
    local, remote = make_shards(tmp_path, boto3_client, s3_prefix, encoding, rows=2000)
    expected = batches(lambda: open_batch_stream(config([FileSource(local)], batch_size=50)))
    # Every shard's first few bodies are cut mid-way; the reads resume where they stopped.
    fault_proxy.add_fault(Fault(kind="reset", after_bytes=after_bytes, method="GET", times=12))
    training_data = data_for(s3_server, fault_proxy.endpoint_url)
    got = batches(lambda: training_data.batch_stream(config([FileSource(remote)], batch_size=50)))
    assert got == expected
    faulted = [r for r in fault_proxy.requests if r.fault == "reset"]
    assert len(faulted) == 12
    resumed = [r for r in fault_proxy.requests if r.method == "GET" and r.fault is None and r.range]
    # Resumed requests continue from a later byte, pinned to the version first seen.
    assert any(not r.range.startswith("bytes=0-") for r in resumed)
    assert all(r.if_match for r in resumed)


def test_server_errors_are_retried_until_the_consecutive_failure_limit(
    tmp_path: Path, s3_server: LocalS3Server, boto3_client: Any, s3_prefix: str, fault_proxy: FaultProxy
) -> None:
    local, remote = make_shards(tmp_path, boto3_client, s3_prefix, "parquet", count=1)
    limit = RetryPolicy(
        max_consecutive_failures=4, initial_backoff_s=0.01, max_backoff_s=0.02, read_timeout_s=2.0
    )
    training_data = data_for(s3_server, fault_proxy.endpoint_url, retry=limit)
    # Three failures in a row stay under the limit of four.
    fault_proxy.add_fault(Fault(kind="status", status=503, times=2))
    fault_proxy.add_fault(Fault(kind="status", status=500, times=1))
    expected = batches(lambda: open_batch_stream(config([FileSource(local)])))
    assert batches(lambda: training_data.batch_stream(config([FileSource(remote)]))) == expected
    fault_proxy.clear()
    fault_proxy.add_fault(Fault(kind="status", status=503, times=4))
    with pytest.raises(StorageError, match="4 consecutive failed attempts.*503") as info:
        training_data.batch_stream(config([FileSource(remote)]))
    assert info.value.path == remote[0]
    assert len(fault_proxy.requests) == 4


def test_stalls_are_retried_and_a_stall_without_progress_gives_up(
    tmp_path: Path, s3_server: LocalS3Server, boto3_client: Any, s3_prefix: str, fault_proxy: FaultProxy
) -> None:
    local, remote = make_shards(tmp_path, boto3_client, s3_prefix, "msgpack", count=1, rows=3000)
    patient = RetryPolicy(read_timeout_s=0.3, initial_backoff_s=0.01, max_backoff_s=0.02)
    fault_proxy.add_fault(Fault(kind="stall", method="GET", after_bytes=10_000, seconds=2.0, times=2))
    training_data = data_for(s3_server, fault_proxy.endpoint_url, retry=patient)
    expected = batches(lambda: open_batch_stream(config([FileSource(local)])))
    assert batches(lambda: training_data.batch_stream(config([FileSource(remote)]))) == expected
    assert [r.fault for r in fault_proxy.requests].count("stall") == 2

    fault_proxy.clear()
    impatient = RetryPolicy(
        read_timeout_s=0.2, no_progress_timeout_s=1.0, initial_backoff_s=0.01, max_backoff_s=0.05
    )
    fault_proxy.add_fault(Fault(kind="stall", method="GET", seconds=3.0, times=1000))
    stalled = data_for(s3_server, fault_proxy.endpoint_url, retry=impatient)
    with pytest.raises(StorageError, match="without progress") as info:
        stalled.batch_stream(config([FileSource(remote)]))
    assert info.value.path == remote[0]


@pytest.mark.parametrize("encoding", ["jsonl", "parquet"])
def test_an_object_replaced_after_open_fails_closed(
    tmp_path: Path, s3_server: LocalS3Server, boto3_client: Any, s3_prefix: str, encoding: str
) -> None:
    # Eight shards read in order, at most two reads in flight: the last is read long after the
    # replacement below, whatever the timing.
    _, remote = make_shards(tmp_path, boto3_client, s3_prefix, encoding, count=8, rows=200)
    training_data = data_for(s3_server)
    sequential = BatchStreamConfig(
        fields=[V], stages=[Stage(sources=[FileSource(remote)], batch_size=10)], threads=1, prefetch_batches=1
    )
    replacement = write_shard(tmp_path / f"other{SUFFIX[encoding]}", encoding, records(9, 200))
    with training_data.batch_stream(sequential) as stream:
        first = next(stream).arrays()["v"].tolist()
        upload(boto3_client, replacement, remote[7])  # same row count, other content
        with pytest.raises(StorageError, match="replaced") as info:
            for _ in stream:
                pass
    assert first == list(range(10))
    assert info.value.path == remote[7]


def test_iter_shard_reads_s3_shards(
    tmp_path: Path, s3_server: LocalS3Server, boto3_client: Any, s3_prefix: str
) -> None:
    training_data = data_for(s3_server)
    for encoding in ("parquet", "jsonl.gz", "msgpack"):
        local, remote = make_shards(tmp_path, boto3_client, s3_prefix, encoding, count=1, rows=1500)
        got = list(iter_shard(encoding, remote[0], storage_config=training_data.storage_config))
        assert got == list(iter_shard(encoding, local[0]))
        assert len(got) == 1500
    with pytest.raises(ConfigError, match="TrainingData"):
        next(iter_shard("parquet", remote[0]))


def test_credentials_stay_out_of_reprs_and_pickles(s3_server: LocalS3Server) -> None:
    training_data = data_for(s3_server)
    saver = training_data.dataset_saver("s3://o41/leak-check/data-manifest-v1.json")
    secrets = (s3_server.secret_access_key, s3_server.access_key_id)
    for thing in (training_data, training_data.storage_config, saver):
        text = repr(thing)
        blob = pickle.dumps(thing)
        for secret in secrets:
            assert secret not in text
            assert secret.encode() not in blob
    assert s3_server.endpoint_url in repr(training_data)
    # In this process (and forked children) the pickle finds the credentials it left behind.
    assert pickle.loads(pickle.dumps(training_data)).storage_config.secret_access_key == secrets[0]


def test_a_spawned_process_takes_credentials_from_its_environment(
    tmp_path: Path, s3_server: LocalS3Server, boto3_client: Any, s3_prefix: str
) -> None:
    _, remote = make_shards(tmp_path, boto3_client, s3_prefix, "parquet", count=1, rows=10)
    pickled = tmp_path / "storage.pickle"
    pickled.write_bytes(pickle.dumps(data_for(s3_server).storage_config))
    child = (
        "import pickle, sys\n"
        "from o41_training_data import iter_shard, ConfigError\n"
        "storage = pickle.loads(open(sys.argv[1], 'rb').read())\n"
        "try:\n"
        "    print(len(list(iter_shard('parquet', sys.argv[2], storage_config=storage))))\n"
        "except ConfigError as err:\n"
        "    print('ConfigError', err)\n"
    )
    base = {k: v for k, v in __import__("os").environ.items() if not k.startswith("AWS_")}
    without = subprocess.run(
        [sys.executable, "-c", child, str(pickled), remote[0]],
        env=base,
        capture_output=True,
        text=True,
        check=True,
    )
    assert without.stdout.startswith("ConfigError")
    assert "AWS_ACCESS_KEY_ID" in without.stdout
    with_env = dict(
        base, AWS_ACCESS_KEY_ID=s3_server.access_key_id, AWS_SECRET_ACCESS_KEY=s3_server.secret_access_key
    )
    ok = subprocess.run(
        [sys.executable, "-c", child, str(pickled), remote[0]],
        env=with_env,
        capture_output=True,
        text=True,
        check=True,
    )
    assert ok.stdout.strip() == "10"


def test_the_memory_bound_counts_bytes_fetched_ahead_for_remote_shards(
    tmp_path: Path, s3_server: LocalS3Server, boto3_client: Any, s3_prefix: str
) -> None:
    local, remote = make_shards(tmp_path, boto3_client, s3_prefix, "parquet")
    with open_batch_stream(config([FileSource(local)])) as stream:
        local_bound = stream.memory_bound
    with data_for(s3_server).batch_stream(config([FileSource(remote)])) as stream:
        remote_bound = stream.memory_bound
    # A remote job's scratch adds the gaps its merged requests may fetch: at most one 1 MiB gap
    # per projected leaf column (v, tokens) and its dictionary, in each of two row groups. And
    # every job in flight (two per decode thread) may hold its bytes, not only those decoding.
    threads, leaves, merge_gap = 2, 2, 1 << 20
    gaps = threads * 2 * 2 * leaves * merge_gap
    assert remote_bound.decode_scratch == 2 * (local_bound.decode_scratch + gaps)
    # Both keep the pages later jobs read again, within one budget (the readers term).
    assert remote_bound.readers == local_bound.readers
    assert remote_bound.total - remote_bound.decode_scratch == local_bound.total - local_bound.decode_scratch


def test_jobs_of_one_row_group_fetch_its_pages_once(
    tmp_path: Path, s3_server: LocalS3Server, boto3_client: Any, s3_prefix: str, fault_proxy: FaultProxy
) -> None:
    # One row group read by five jobs (the first batch alone, then jobs of at most 1,024 rows):
    # each needs the column's dictionary page, and each but the first starts inside the page
    # its predecessor ended in. They take those pages from the job that fetched them, so no
    # byte is asked for twice (the row group is over 1 MiB: a job's own pages are too far from
    # the dictionary page to merge with it).
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq

    rows, width = 4000, 300
    values = np.random.default_rng(3).integers(0, 30_000, size=rows * width, dtype=np.int32)
    tokens = pa.ListArray.from_arrays(pa.array(np.arange(0, rows * width + 1, width, dtype=np.int32)), values)
    path = tmp_path / "dictionary.parquet"
    pq.write_table(pa.table({"tokens": tokens}), path, data_page_size=64 << 10, write_page_index=True)
    uri = upload(boto3_client, path, f"{s3_prefix}dictionary.parquet")
    chunk = pq.ParquetFile(path).metadata.row_group(0).column(0)
    assert chunk.dictionary_page_offset is not None, "the writer wrote a dictionary page"
    assert chunk.total_compressed_size > 1 << 20

    def stream_config(source: FileSource) -> BatchStreamConfig:
        return BatchStreamConfig(fields=[T], stages=[Stage(sources=[source], batch_size=16)], threads=2)

    expected = [b.arrays()["t"].tolist() for b in open_batch_stream(stream_config(FileSource([str(path)])))]
    training_data = data_for(s3_server, fault_proxy.endpoint_url)
    before = len(fault_proxy.requests)
    with training_data.batch_stream(stream_config(FileSource([uri]))) as stream:
        got = [b.arrays()["t"].tolist() for b in stream]
    assert got == expected
    spans = []
    for request in fault_proxy.requests[before:]:
        if request.method != "GET":
            continue  # open's look at the object
        assert request.range
        first, last = request.range.removeprefix("bytes=").split("-")
        spans.append((int(first), int(last)))
    # Open reads the footer and checks the first record (the dictionary page and the first data
    # page); the jobs start as soon as it returns, so which requests are open's and which the
    # jobs' depends on timing, and how many the jobs make on how far they ran ahead of each
    # other. What the protocol guarantees: the dictionary page is fetched by open's check and
    # once for the jobs, and no other byte is asked for twice.
    size = path.stat().st_size
    asked = [span for span in spans if span[0] <= chunk.dictionary_page_offset <= span[1]]
    assert 1 <= len(asked) <= 2, f"the dictionary page was asked for in {asked}"
    rest = sorted(span for span in spans if span not in asked and span[1] < size - 8)
    assert rest, "the jobs read pages of their own"
    assert all(a[1] < b[0] for a, b in itertools.pairwise(rest)), f"overlapping requests: {rest}"


def test_an_opened_object_reads_only_the_version_it_opened(
    tmp_path: Path, s3_server: LocalS3Server, boto3_client: Any, s3_prefix: str
) -> None:
    _, remote = make_shards(tmp_path, boto3_client, s3_prefix, "jsonl", count=1, rows=50)
    storage = data_for(s3_server).storage_config.core()
    opened = storage.open(remote[0])
    first = opened.read_range(0, 10)
    assert first == storage.read(remote[0])[:10]
    other = write_shard(tmp_path / "other.jsonl", "jsonl", records(9, 50))
    upload(boto3_client, other, remote[0])
    with pytest.raises(StorageError, match="replaced"):
        opened.read_range(10, 20)


def test_a_listed_shard_is_asked_for_once_and_its_reads_are_pinned(
    tmp_path: Path,
    s3_server: LocalS3Server,
    boto3_client: Any,
    s3_prefix: str,
    fault_proxy: FaultProxy,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Open asks for each shard's size and ETag once (a HEAD): it reads and counts the shards with
    # it when the inspection cache does not know them, and the inspection at a shard's first
    # read (the cache knowing them) reuses it.
    monkeypatch.setenv("O41_INSPECT_CACHE", str(tmp_path / "cache"))
    local, remote = make_shards(tmp_path, boto3_client, s3_prefix, "parquet", count=3)
    keys = sorted("/" + uri.removeprefix("s3://") for uri in remote)
    training_data = data_for(s3_server, fault_proxy.endpoint_url)
    expected = batches(lambda: open_batch_stream(config([FileSource(local)])))
    for cache in ("cold", "warm"):
        fault_proxy.clear()
        with training_data.batch_stream(config([FileSource(remote)])) as stream:
            at_open = len(fault_proxy.requests)
            heads = sorted(r.path for r in fault_proxy.requests if r.method == "HEAD")
            assert heads == keys, cache
            got = [(b.arrays()["v"].tolist(), b.arrays()["t"].tolist()) for b in stream]
        assert got == expected
        after_open = fault_proxy.requests[at_open:]
        assert after_open
        assert all(r.method == "GET" and r.if_match for r in after_open), cache
