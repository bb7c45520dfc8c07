"""The dataset saver and manifests on S3 (a real SeaweedFS server): atomic, restartable publication."""

from __future__ import annotations

import json
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from typing import Any

import o41_training_data._saver as saver_module
import pytest
from o41_testkit import Fault, FaultProxy, LocalS3Server, data_for
from o41_training_data import (
    DataError,
    MalformedShardError,
    ManifestSource,
    ObjectConflictError,
    ObjectNotFoundError,
    ProjectedField,
    TrainingData,
    iter_shard,
)

from saver_jobs import die_mid_save, never_iterated, records, save_shard

V = ProjectedField("v", "v", "i64")


def keys(client: Any, uri_prefix: str) -> list[str]:
    bucket, _, prefix = uri_prefix.removeprefix("s3://").partition("/")
    listing = client.list_objects_v2(Bucket=bucket, Prefix=prefix)
    return sorted(o["Key"].removeprefix(prefix) for o in listing.get("Contents", []))


def get(client: Any, uri: str) -> bytes:
    bucket, _, key = uri.removeprefix("s3://").partition("/")
    body: bytes = client.get_object(Bucket=bucket, Key=key)["Body"].read()
    return body


def put(client: Any, uri: str, data: bytes) -> None:
    bucket, _, key = uri.removeprefix("s3://").partition("/")
    client.put_object(Bucket=bucket, Key=key, Body=data)


def values(training_data: TrainingData, source: ManifestSource, batch_size: int = 10) -> list[int]:
    from o41_training_data import BatchStreamConfig, Stage

    config = BatchStreamConfig(fields=[V], stages=[Stage(sources=[source], batch_size=batch_size)])
    with training_data.batch_stream(config) as stream:
        return [int(v) for b in stream for v in b.arrays()["v"]]


@pytest.fixture
def training_data(s3_server: LocalS3Server) -> TrainingData:
    return data_for(s3_server)


@pytest.mark.parametrize("data_format", ["parquet", "msgpack", "jsonl.gz"])
def test_round_trip_on_s3_selecting_stages(
    training_data: TrainingData, boto3_client: Any, s3_prefix: str, data_format: str
) -> None:
    saver = training_data.dataset_saver(f"{s3_prefix}data-manifest-v1.json", data_format=data_format)
    for shard_id, stage in enumerate(["easy", "medium", "easy", "hard"]):
        saver.save(
            "train", stage, records("train", stage, shard_id), {"stage": stage}, shard_id=str(shard_id)
        )
    saver.save("valid", None, records("valid", None, 0), shard_id="0")
    manifest = saver.commit_manifest()
    assert manifest.uri == saver.manifest_uri
    assert manifest.splits["train"].shards[0].path == f"{s3_prefix}train/easy/shard-0.{data_format}"
    document = json.loads(get(boto3_client, saver.manifest_uri))
    assert document["splits"]["train"]["shards"][0]["location"] == f"train/easy/shard-0.{data_format}"
    source = ManifestSource(saver.manifest_uri, "train", curriculum_stages=["easy", "hard"])
    expected = [r["v"] for k in (0, 2, 3) for r in records("train", None, k)]
    assert values(training_data, source) == expected
    (valid,) = manifest.splits["valid"].shards
    storage = training_data.storage_config
    assert list(iter_shard(data_format, valid, storage_config=storage)) == records("valid", None, 0)
    # Committing the same publication again is a no-op; a different manifest there is a conflict.
    assert saver.commit_manifest() == manifest
    saver.save("train", "hard", records("train", "hard", 9), shard_id="9")
    with pytest.raises(ObjectConflictError, match="different manifest"):
        saver.commit_manifest()
    assert json.loads(get(boto3_client, saver.manifest_uri)) == document


def test_a_restarted_saver_reuses_verified_shards_and_rewrites_orphans(
    training_data: TrainingData, boto3_client: Any, s3_prefix: str
) -> None:
    saver = training_data.dataset_saver(f"{s3_prefix}data-manifest-v1.json")
    first = saver.save("train", "easy", records("train", "easy", 0), shard_id="0")
    restarted = training_data.dataset_saver(saver.manifest_uri)
    assert restarted.save("train", "easy", never_iterated(), shard_id="0") == first
    assert restarted.recover("train", "easy", shard_id="0") == first
    with pytest.raises(ObjectNotFoundError, match="never completed"):
        restarted.recover("train", "easy", shard_id="7")
    orphan = f"{s3_prefix}train/_/shard-1.parquet"
    put(boto3_client, orphan, b"half a shard")  # a crash before its descriptor was written
    shard = restarted.save("train", None, records("train", None, 1), shard_id="1")
    assert len(get(boto3_client, orphan)) == shard.bytes
    # A data object that no longer matches its descriptor fails closed.
    put(boto3_client, f"{s3_prefix}{first.location}", b"tampered")
    with pytest.raises(MalformedShardError, match="does not match its completion descriptor"):
        restarted.save("train", "easy", never_iterated(), shard_id="0")


def test_oversized_shards_are_refused_before_upload(
    training_data: TrainingData, boto3_client: Any, s3_prefix: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(saver_module, "MAX_SHARD_BYTES", 100)
    saver = training_data.dataset_saver(f"{s3_prefix}data-manifest-v1.json")
    with pytest.raises(DataError, match="5 GiB limit"):
        saver.save("train", None, records("train", None, 12, n=200), shard_id="12")
    assert keys(boto3_client, s3_prefix) == []


def test_workers_save_to_s3_and_the_parent_publishes(training_data: TrainingData, s3_prefix: str) -> None:
    saver = training_data.dataset_saver(f"{s3_prefix}data-manifest-v1.json")
    jobs = [
        (saver, "train", stage, {"stage": stage}, k) for k, stage in enumerate(["easy", "medium", "hard"] * 2)
    ]
    jobs += [(saver, "valid", None, None, 100)]
    with ProcessPoolExecutor(max_workers=2) as pool:
        assert len(list(pool.map(save_shard, jobs))) == 7
    manifest = saver.commit_manifest()
    assert sum(s.rows for s in manifest.splits["train"].shards) == 120
    assert values(training_data, ManifestSource(saver.manifest_uri, "valid")) == [
        r["v"] for r in records("valid", None, 100)
    ]


def test_killed_workers_then_a_restart_publish_every_record_once_on_s3(
    training_data: TrainingData, boto3_client: Any, s3_prefix: str
) -> None:
    saver = training_data.dataset_saver(f"{s3_prefix}data-manifest-v1.json")
    jobs = [(saver, "train", None, None, k) for k in range(8)]
    with (
        pytest.raises(BrokenProcessPool),
        ProcessPoolExecutor(max_workers=2, initializer=die_mid_save, initargs=("2,5",)) as pool,
    ):
        list(pool.map(save_shard, jobs))
    written = keys(boto3_client, s3_prefix)
    assert "train/_/shard-2.parquet" in written  # the data object of a crashed save
    assert "train/_/shard-2.parquet.done.json" not in written
    assert "data-manifest-v1.json" not in written
    with ProcessPoolExecutor(max_workers=2) as pool:
        list(pool.map(save_shard, jobs))
    saver.commit_manifest()
    got = values(training_data, ManifestSource(saver.manifest_uri, "train"), batch_size=1)
    assert sorted(got) == sorted(r["v"] for k in range(8) for r in records("train", None, k))


def test_manifests_copy_between_local_and_s3(
    tmp_path: Any, training_data: TrainingData, boto3_client: Any, s3_prefix: str
) -> None:
    saver = training_data.dataset_saver(f"{s3_prefix}data/data-manifest-v1.json")
    saver.save("train", None, records("train", None, 4), shard_id="4")
    manifest = saver.commit_manifest()
    copy_uri = f"{s3_prefix}copies/run-1/data-manifest-v1.json"
    training_data.save_manifest(copy_uri, manifest)
    copy = training_data.load_manifest(copy_uri)
    assert [s.path for s in copy.splits["train"].shards] == [s.path for s in manifest.splits["train"].shards]
    location = json.loads(get(boto3_client, copy_uri))["splits"]["train"]["shards"][0]["location"]
    assert location == "../../data/train/_/shard-4.parquet"
    local_copy = tmp_path / "local" / "data-manifest-v1.json"
    training_data.save_manifest(local_copy, manifest)
    assert json.loads(local_copy.read_text())["splits"]["train"]["shards"][0]["location"].startswith("s3://")
    assert values(training_data, ManifestSource(str(local_copy), "train")) == [
        r["v"] for r in records("train", None, 4)
    ]


def test_writes_are_create_only_and_idempotent(training_data: TrainingData, s3_prefix: str) -> None:
    storage = training_data.storage_config.core()
    uri = f"{s3_prefix}object.bin"
    assert storage.write(uri, b"first") is True
    assert storage.write(uri, b"first") is False  # a repeated (or retried) write of the same bytes
    with pytest.raises(ObjectConflictError, match="never replaced"):
        storage.write(uri, b"second")
    assert storage.read(uri) == b"first"
    assert storage.write(uri, b"second", create_only=False) is True
    assert storage.read(uri) == b"second"


def test_cli_inspects_and_verifies_an_s3_manifest_with_environment_settings(
    training_data: TrainingData,
    s3_server: LocalS3Server,
    boto3_client: Any,
    s3_prefix: str,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    from o41_training_data._cli import main

    saver = training_data.dataset_saver(f"{s3_prefix}data-manifest-v1.json")
    for k in range(2):
        saver.save("train", "easy", records("train", "easy", k), shard_id=str(k))
    saver.commit_manifest()
    monkeypatch.setenv("AWS_ENDPOINT_URL", s3_server.endpoint_url)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", s3_server.access_key_id)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", s3_server.secret_access_key)
    assert main(["manifest", "inspect", saver.manifest_uri]) == 0
    assert "stage easy" in capsys.readouterr().out
    assert main(["manifest", "verify", saver.manifest_uri]) == 0
    assert "2 of 2 shards verified" in capsys.readouterr().out
    shard = f"{s3_prefix}train/easy/shard-1.parquet"
    original = get(boto3_client, shard)
    put(boto3_client, shard, original[:-1] + bytes([original[-1] ^ 1]))
    assert main(["manifest", "verify", saver.manifest_uri]) == 1
    captured = capsys.readouterr()
    assert "checksum differs" in captured.err
    assert s3_server.secret_access_key not in captured.out + captured.err


def test_a_write_whose_answer_was_lost_is_retried_and_counts_as_done(
    s3_server: LocalS3Server, fault_proxy: FaultProxy, s3_prefix: str
) -> None:
    storage = data_for(s3_server, fault_proxy.endpoint_url).storage_config.core()
    uri = f"{s3_prefix}descriptor.json"
    fault_proxy.add_fault(Fault(kind="lose", method="PUT"))
    # The server stored the object but the answer never arrived: the retry finds it taken and
    # compares checksums instead of reporting a conflict.
    assert storage.write(uri, b'{"rows": 20}') is False
    puts = [r for r in fault_proxy.requests if r.method == "PUT"]
    assert [(r.fault, r.if_none_match) for r in puts] == [("lose", "*"), (None, "*")]
    assert storage.read(uri) == b'{"rows": 20}'
    fault_proxy.add_fault(Fault(kind="lose", method="PUT"))
    with pytest.raises(ObjectConflictError):
        storage.write(uri, b'{"rows": 21}')  # a different object is still a conflict
