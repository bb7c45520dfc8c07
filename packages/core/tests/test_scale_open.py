"""Open and resume cost the sources, not the bytes.

A manifest's shards take their row counts and sizes from the manifest and are read first by the
stream itself, which holds each to that promise; a plain file list's counts are remembered on the
host by the inspection cache. These tests prove what open does not read by removing or corrupting
the shards it must not touch, and count requests on a real S3 server through the fault proxy.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest
from o41_testkit import FaultProxy, config_for, data_for, upload, write_shard
from o41_training_data import (
    CheckpointError,
    ConfigError,
    FileSource,
    MalformedShardError,
    ManifestSource,
    ObjectNotFoundError,
    ProjectedField,
    StorageError,
    open_batch_stream,
    resolve_batch_stream_config,
    resume_batch_stream,
)

V = ProjectedField("v", "v", "i64")


def write_dataset(root: Path, shards: int = 4, rows: int = 10, encoding: str = "jsonl") -> Path:
    """Shards ``part-k`` of ``rows`` records each (values ``100 k + i``) and a manifest listing them."""
    entries = []
    root.mkdir(parents=True, exist_ok=True)
    for k in range(shards):
        location = f"part-{k}.{encoding}"
        path = write_shard(root / location, encoding, [{"v": 100 * k + i} for i in range(rows)])
        entries.append(
            {"location": location, "rows": rows, "bytes": path.stat().st_size, "checksum": "none:0"}
        )
    manifest = root / "data-manifest-v1.json"
    document = {"format": "o41-data-manifest", "version": 1, "data_format": encoding}
    document["splits"] = {"train": {"shards": entries}}
    manifest.write_text(json.dumps(document))
    return manifest


def drain(stream: Any, into: list[int]) -> None:
    for batch in stream:
        into.extend(int(v) for v in batch.arrays()["v"])


def test_a_manifest_source_opens_reading_only_its_first_shard(tmp_path: Path) -> None:
    manifest = write_dataset(tmp_path)
    for k in (1, 2, 3):
        (tmp_path / f"part-{k}.jsonl").unlink()
    config = config_for([ManifestSource(str(manifest), "train")], [V], batch_size=5)
    resolved = resolve_batch_stream_config(config)
    shards = resolved["stages"][0]["sources"][0]["shards"]
    assert [(Path(s["path"]).name, s["rows"]) for s in shards] == [(f"part-{k}.jsonl", 10) for k in range(4)]
    delivered: list[int] = []
    with (
        open_batch_stream(config) as stream,
        pytest.raises(ObjectNotFoundError, match=r"part-1\.jsonl") as info,
    ):
        drain(stream, delivered)
    # Every batch of the shard that exists came first.
    assert delivered == list(range(10))
    assert info.value.path.endswith("part-1.jsonl")


def test_each_source_checks_its_projection_on_one_shard(tmp_path: Path) -> None:
    first = write_dataset(tmp_path / "a", shards=2)
    second = write_dataset(tmp_path / "b", shards=2)
    # The second source's first shard has no field "v": open reads it and refuses the source.
    write_shard(tmp_path / "b" / "part-0.jsonl", "jsonl", [{"w": i} for i in range(10)])
    size = (tmp_path / "b" / "part-0.jsonl").stat().st_size
    document = json.loads(second.read_text())
    document["splits"]["train"]["shards"][0]["bytes"] = size
    second.write_text(json.dumps(document))
    sources = [ManifestSource(str(first), "train"), ManifestSource(str(second), "train")]
    with pytest.raises(Exception, match=r"b/part-0\.jsonl") as info:
        open_batch_stream(config_for(sources, [V], batch_size=5))
    assert "'v'" in str(info.value)


def test_a_shard_holding_other_rows_than_listed_fails_at_its_first_read(tmp_path: Path) -> None:
    manifest = write_dataset(tmp_path, shards=2)
    path = tmp_path / "part-1.jsonl"
    size = path.stat().st_size
    # Same size, other row count: only counting its rows can tell.
    lines = [json.dumps({"v": 7}) for _ in range(8)]
    text = "\n".join(lines) + "\n"
    path.write_text(text + " " * (size - len(text) - 1) + "\n")
    assert path.stat().st_size == size
    delivered: list[int] = []
    config = config_for([ManifestSource(str(manifest), "train")], [V], batch_size=5)
    expected = r"part-1\.jsonl.*the manifest lists 10 rows, the shard holds 8"
    with open_batch_stream(config) as stream, pytest.raises(MalformedShardError, match=expected):
        drain(stream, delivered)
    assert delivered == list(range(10))


def test_resuming_a_manifest_source_reads_no_shard_it_does_not_need(tmp_path: Path) -> None:
    manifest = write_dataset(tmp_path)
    config = config_for([ManifestSource(str(manifest), "train")], [V], batch_size=5)
    with open_batch_stream(config) as stream:
        first = [int(v) for v in next(stream).arrays()["v"]]
        checkpoint = stream.checkpoint()
    assert first == [0, 1, 2, 3, 4]
    (tmp_path / "part-3.jsonl").unlink()
    delivered: list[int] = []
    with (
        resume_batch_stream(checkpoint) as resumed,
        pytest.raises(ObjectNotFoundError, match=r"part-3\.jsonl"),
    ):
        drain(resumed, delivered)
    assert delivered == [*range(5, 10), *range(100, 110), *range(200, 210)]


def test_a_resumed_shard_of_another_size_fails_closed_at_its_first_read(tmp_path: Path) -> None:
    manifest = write_dataset(tmp_path)
    config = config_for([ManifestSource(str(manifest), "train")], [V], batch_size=5)
    with open_batch_stream(config) as stream:
        next(stream)
        checkpoint = stream.checkpoint()
    write_shard(tmp_path / "part-2.jsonl", "jsonl", [{"v": 1000 + i} for i in range(12)])
    delivered: list[int] = []
    with (
        resume_batch_stream(checkpoint) as resumed,
        pytest.raises(
            CheckpointError, match=r"part-2\.jsonl is \d+ bytes, but the checkpoint's stream read it"
        ),
    ):
        drain(resumed, delivered)
    assert delivered == [*range(5, 10), *range(100, 110)]


# -- The inspection cache of plain file lists.


@pytest.fixture
def cache_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    directory = tmp_path / "inspect-cache"
    monkeypatch.setenv("O41_INSPECT_CACHE", str(directory))
    return directory


def corrupt_keeping_identity(path: Path) -> None:
    """Overwrites ``path`` in place with bytes that are no JSON, keeping its size, times and inode."""
    before = path.stat()
    with path.open("r+b") as file:
        file.write(b"\x00" * before.st_size)
    os.utime(path, ns=(before.st_atime_ns, before.st_mtime_ns))
    after = path.stat()
    assert (after.st_size, after.st_mtime_ns, after.st_ino) == (
        before.st_size,
        before.st_mtime_ns,
        before.st_ino,
    )


def file_list(tmp_path: Path) -> list[str]:
    return [
        str(write_shard(tmp_path / f"f-{k}.jsonl", "jsonl", [{"v": 100 * k + i} for i in range(10)]))
        for k in range(3)
    ]


def test_a_second_open_of_a_file_list_counts_no_rows(tmp_path: Path, cache_dir: Path) -> None:
    files = file_list(tmp_path)
    config = config_for([FileSource(files=files)], [V], batch_size=5)
    open_batch_stream(config).close()
    assert len(list(cache_dir.glob("*/*.json"))) == 3
    corrupt_keeping_identity(Path(files[2]))
    # Open takes the counts from the cache and reads only the first file: it succeeds, and the
    # stream fails closed where it first reads the corrupted file, after the earlier batches.
    delivered: list[int] = []
    with open_batch_stream(config) as stream, pytest.raises(MalformedShardError, match=r"f-2\.jsonl"):
        drain(stream, delivered)
    assert delivered == [*range(10), *range(100, 110)]


def test_without_the_cache_open_counts_every_file(
    tmp_path: Path, cache_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    files = file_list(tmp_path)
    config = config_for([FileSource(files=files)], [V], batch_size=5)
    open_batch_stream(config).close()
    corrupt_keeping_identity(Path(files[2]))
    monkeypatch.setenv("O41_INSPECT_CACHE", "off")
    with pytest.raises(MalformedShardError, match=r"f-2\.jsonl"):
        open_batch_stream(config)


def test_a_changed_file_misses_the_cache(tmp_path: Path, cache_dir: Path) -> None:
    files = file_list(tmp_path)
    config = config_for([FileSource(files=files)], [V], batch_size=5)
    open_batch_stream(config).close()
    write_shard(Path(files[1]), "jsonl", [{"v": 500 + i} for i in range(25)])
    resolved = resolve_batch_stream_config(config)
    assert [s["rows"] for s in resolved["stages"][0]["sources"][0]["shards"]] == [10, 25, 10]
    values: list[int] = []
    with open_batch_stream(config) as stream:
        drain(stream, values)
    assert values == [*range(10), *range(500, 525), *range(200, 210)]


def test_a_cached_count_the_file_no_longer_matches_fails_closed(tmp_path: Path, cache_dir: Path) -> None:
    files = file_list(tmp_path)
    config = config_for([FileSource(files=files)], [V], batch_size=5)
    open_batch_stream(config).close()
    # Rewritten with another row count but the same size, time and inode: the cache hits, and
    # the count it gives is checked when the stream first reads the file.
    path = Path(files[1])
    before = path.stat()
    text = "".join(json.dumps({"v": 9}) + "\n" for _ in range(8))
    with path.open("r+b") as file:
        file.write((text + " " * (before.st_size - len(text) - 1) + "\n").encode())
    os.utime(path, ns=(before.st_atime_ns, before.st_mtime_ns))
    delivered: list[int] = []
    with (
        open_batch_stream(config) as stream,
        pytest.raises(StorageError, match=r"f-1\.jsonl.*holds 8 rows, 10 when it was counted"),
    ):
        drain(stream, delivered)
    assert delivered == list(range(10))


# -- Requests at open on a real S3 server.


def test_an_s3_manifest_source_opens_with_one_shard_request(
    tmp_path: Path, s3_server: Any, boto3_client: Any, s3_prefix: str, fault_proxy: FaultProxy
) -> None:
    local = tmp_path / "dataset"
    # Shards larger than the two groups of rows a stream plans ahead, so that the snapshot taken
    # after open holds only what open read, not the planner's first inspections.
    manifest = write_dataset(local, shards=6, rows=10_000, encoding="parquet")
    for path in sorted(local.iterdir()):
        upload(boto3_client, path, s3_prefix + path.name)
    data = data_for(s3_server, fault_proxy.endpoint_url)
    config = config_for([ManifestSource(s3_prefix + manifest.name, "train")], [V], batch_size=500)
    fault_proxy.clear()
    stream = open_batch_stream(config, storage=data.storage_config)
    try:
        touched = {r.path.split("?")[0].rsplit("/", 1)[-1] for r in fault_proxy.requests}
        assert touched == {"data-manifest-v1.json", "part-0.parquet"}
        values: list[int] = []
        drain(stream, values)
    finally:
        stream.close()
    assert sorted(values) == sorted(100 * k + i for k in range(6) for i in range(10_000))


def test_an_s3_shard_stored_with_another_checksum_than_listed_fails_at_its_first_read(
    tmp_path: Path, s3_server: Any, boto3_client: Any, s3_prefix: str
) -> None:
    import hashlib

    # Shards uploaded as the saver stores them: with their SHA-256 in the object's metadata.
    manifest = write_dataset(tmp_path, shards=3)
    document = json.loads(manifest.read_text())
    for entry in document["splits"]["train"]["shards"]:
        data = (tmp_path / entry["location"]).read_bytes()
        entry["checksum"] = "sha256:" + hashlib.sha256(data).hexdigest()
        put(boto3_client, s3_prefix + entry["location"], data)
    put(boto3_client, s3_prefix + manifest.name, json.dumps(document).encode())
    # Shard 1 replaced by another of the same size and row count, stored with its own checksum:
    # only the checksum tells it from the listed one.
    other = (tmp_path / "part-1.jsonl").read_bytes().replace(b'"v": 1', b'"v": 9')
    assert len(other) == (tmp_path / "part-1.jsonl").stat().st_size
    put(boto3_client, s3_prefix + "part-1.jsonl", other)
    config = config_for([ManifestSource(s3_prefix + manifest.name, "train")], [V], batch_size=5)
    delivered: list[int] = []
    with (
        open_batch_stream(config, storage=data_for(s3_server).storage_config) as stream,
        pytest.raises(
            MalformedShardError, match=r"part-1\.jsonl.*the manifest lists checksum sha256:"
        ) as info,
    ):
        drain(stream, delivered)
    assert delivered == list(range(10))
    assert info.value.path == s3_prefix + "part-1.jsonl"


def put(client: Any, uri: str, data: bytes) -> None:
    import hashlib

    bucket, _, key = uri.removeprefix("s3://").partition("/")
    client.put_object(
        Bucket=bucket, Key=key, Body=data, Metadata={"o41-sha256": hashlib.sha256(data).hexdigest()}
    )


def test_a_shard_needing_more_decode_memory_than_reserved_fails_at_its_first_read(tmp_path: Path) -> None:
    # Shards a manifest lists are inspected when first read, so open reserves decode scratch for
    # them from the shard it inspected, within memory_limit_bytes. One far larger than that
    # reservation is refused at its first read, never decoded past the declared bound.
    small = write_shard(tmp_path / "part-0.parquet", "parquet", [{"v": i, "t": [i] * 4} for i in range(10)])
    large = tmp_path / "part-1.parquet"
    rows = [{"v": i, "t": [(i * 7919 + j * 104729) % 1_000_003 for j in range(64)]} for i in range(20_000)]
    write_shard(large, "parquet", rows, row_group_rows=20_000)  # one row group of ~5 MB
    shards = [
        {"location": p.name, "rows": n, "bytes": p.stat().st_size, "checksum": "none:0"}
        for p, n in ((small, 10), (large, 20_000))
    ]
    manifest = tmp_path / "data-manifest-v1.json"
    document = {"format": "o41-data-manifest", "version": 1, "data_format": "parquet"}
    document["splits"] = {"train": {"shards": shards}}
    manifest.write_text(json.dumps(document))
    fields = [V, ProjectedField("t", "t", "i32", length=64)]
    probe = config_for([FileSource(files=[str(small)])], fields, batch_size=5, threads=1)
    with open_batch_stream(probe) as stream:
        bound = stream.memory_bound
    # Room for the small shard's scratch and 64 KiB more, no more.
    limit = bound.batches + bound.decode_units + bound.readers + bound.decode_scratch + (64 << 10)
    source = ManifestSource(str(manifest), "train")
    config = config_for([source], fields, batch_size=5, threads=1, memory_limit_bytes=limit)
    delivered: list[int] = []
    stream = open_batch_stream(config)
    assert stream.memory_bound.total <= limit
    with (
        stream,
        pytest.raises(ConfigError, match=r"part-1\.parquet needs \d+ bytes of decode scratch") as info,
    ):
        drain(stream, delivered)
    assert info.value.option == "memory_limit_bytes"
    assert delivered == list(range(10))
