"""The dataset saver: restartable saves, curricula, split orders, atomic publication."""

from __future__ import annotations

import json
import pickle
import sys
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from pathlib import Path

import o41_training_data._saver as saver_module
import pytest
from o41_testkit import collect, config_for
from o41_training_data import (
    ConfigError,
    DataError,
    MalformedShardError,
    ManifestSource,
    ObjectNotFoundError,
    ProjectedField,
    TrainingData,
    load_manifest,
)

from saver_jobs import die_mid_save, never_iterated, records, save_shard

V = ProjectedField("v", "v", "i64")


@pytest.fixture
def saver(tmp_path: Path):
    return TrainingData().dataset_saver(tmp_path / "data" / "data-manifest-v1.json")


def test_a_restarted_saver_reuses_completed_shards_without_records(saver, tmp_path: Path) -> None:
    first = saver.save("train", "easy", records("train", "easy", 0), shard_id="0")
    assert (first.rows, first.location) == (20, "train/easy/shard-0.parquet")
    assert (tmp_path / "data" / (first.location + ".done.json")).exists()
    again = (
        TrainingData().dataset_saver(saver.manifest_uri).save("train", "easy", never_iterated(), shard_id="0")
    )
    assert again == first
    assert saver.recover("train", "easy", shard_id="0") == first
    with pytest.raises(ObjectNotFoundError, match="never completed"):
        saver.recover("train", "easy", shard_id="9")


def test_a_data_object_without_descriptor_is_rewritten(saver, tmp_path: Path) -> None:
    orphan = tmp_path / "data/train/_/shard-1.parquet"
    orphan.parent.mkdir(parents=True)
    orphan.write_bytes(b"half a shard")
    shard = saver.save("train", None, records("train", None, 1), shard_id="1")
    assert shard.rows == 20
    assert orphan.stat().st_size == shard.bytes


def test_a_descriptor_whose_data_does_not_verify_fails_closed(saver, tmp_path: Path) -> None:
    shard = saver.save("train", None, records("train", None, 2), shard_id="2")
    path = tmp_path / "data" / shard.location
    path.write_bytes(path.read_bytes()[:-1] + b"x")
    with pytest.raises(MalformedShardError, match="does not match its completion descriptor"):
        saver.save("train", None, never_iterated(), shard_id="2")
    with pytest.raises(MalformedShardError):
        saver.commit_manifest()


@pytest.mark.parametrize("data_format", ["parquet", "msgpack", "jsonl.gz"])
def test_round_trip_through_a_stream_selecting_stages(tmp_path: Path, data_format: str) -> None:
    saver = TrainingData().dataset_saver(tmp_path / "data-manifest-v1.json", data_format=data_format)
    shards = {}
    for shard_id, stage in enumerate(["easy", "medium", "easy", "hard"]):
        shards[shard_id] = saver.save(
            "train", stage, records("train", stage, shard_id), {"stage": stage}, shard_id=str(shard_id)
        )
    saver.save("valid", None, records("valid", None, 0), shard_id="0")
    manifest = saver.commit_manifest()
    assert manifest.data_format == data_format
    assert sorted(manifest.splits) == ["train", "valid"]
    source = ManifestSource(saver.manifest_uri, "train", curriculum_stages=["easy", "hard"])
    got = [int(v) for b in collect(config_for([source], [V], batch_size=10)) for v in b["v"]]
    expected = [r["v"] for k in (0, 2, 3) for r in records("train", None, k)]
    assert got == expected
    tokens = ProjectedField("t", "tokens", "i32", length=4)
    first = collect(config_for([ManifestSource(saver.manifest_uri, "valid")], [tokens], batch_size=5))[0]["t"]
    assert first.tolist()[:3] == [[0, 0, 0, 0], [0, 0, 0, 0], [0, 1, 0, 0]]


def test_curricula_keep_order_and_repeat_idempotently(saver) -> None:
    first = saver.save("train", None, records("train", None, 1), shard_id="delta-001")
    second = saver.save("train", None, records("train", None, 2), shard_id="delta-002")
    saver.register_curriculum("train", "small", [first])
    saver.register_curriculum("train", "large", [second, first], metadata={"size": "large"})
    saver.register_curriculum("train", "large", [second, first], metadata={"size": "large"})
    with pytest.raises(ConfigError, match="already registered"):
        saver.register_curriculum("train", "large", [first, second], metadata={"size": "large"})
    with pytest.raises(ConfigError, match="listed twice"):
        saver.register_curriculum("train", "twice", [first, first])
    candidate = saver.build_manifest()
    assert not Path(saver.manifest_uri).exists()  # build only; publication is commit's
    large = next(c for c in candidate.splits["train"].curricula if c.name == "large")
    assert large.shards == (second.location, first.location)
    assert [s.location for s in candidate.splits["train"].shards] == [first.location, second.location]
    manifest = saver.commit_manifest()
    assert saver.commit_manifest() == manifest  # the same publication again
    assert {c.name for c in manifest.splits["train"].curricula} == {"small", "large"}


def test_registrations_need_shards_known_to_this_saver(saver) -> None:
    shard = pickle.loads(pickle.dumps(saver)).save("train", None, records("train", None, 3), shard_id="3")
    with pytest.raises(ConfigError, match="was not saved or recovered"):
        saver.register_curriculum("train", "c", [shard])
    restarted = TrainingData().dataset_saver(saver.manifest_uri)
    restarted.recover("train", None, shard_id="3")
    restarted.register_curriculum("train", "c", [shard])
    with pytest.raises(ConfigError, match="was not saved or recovered in split 'valid'"):
        restarted.register_curriculum("valid", "c", [shard])


def test_a_curriculum_cannot_replace_a_stage_inferred_from_saves(saver) -> None:
    easy = saver.save("train", "easy", records("train", "easy", 4), shard_id="4")
    other = saver.save("train", "hard", records("train", "hard", 5), shard_id="5")
    saver.register_curriculum("train", "easy", [easy])
    with pytest.raises(ConfigError, match="already the curriculum stage"):
        saver.register_curriculum("train", "hard", [easy, other])


def test_split_order_must_be_complete_and_stable(saver) -> None:
    a = saver.save("train", None, records("train", None, 6), shard_id="6")
    b = saver.save("train", None, records("train", None, 7), shard_id="7")
    saver.register_split_order("train", [b, a])
    saver.register_split_order("train", [b, a])
    with pytest.raises(ConfigError, match="another order"):
        saver.register_split_order("train", [a, b])
    assert [s.location for s in saver.build_manifest().splits["train"].shards] == [b.location, a.location]
    saver.save("train", None, records("train", None, 8), shard_id="8")
    with pytest.raises(ConfigError, match="does not list every shard"):
        saver.commit_manifest()
    assert not Path(saver.manifest_uri).exists()


def test_conflicting_record_types_name_the_shard_and_field(saver) -> None:
    saver.save("train", None, [{"v": 1}], shard_id="9")
    saver.save("train", None, [{"v": "one"}], shard_id="10")
    with pytest.raises(
        DataError, match=r"shard-(9|10)\.parquet, field 'v': (string|int) conflicts with (int|string)"
    ):
        saver.build_manifest()
    with pytest.raises(DataError, match=r"record 1, field 'v'"):
        saver.save("valid", None, [{"v": 1}, {"v": [1]}], shard_id="11")


def test_shards_over_the_atomic_write_limit_are_refused(saver, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(saver_module, "MAX_SHARD_BYTES", 100)
    with pytest.raises(DataError, match="use more shard ids|split the records over more shard ids"):
        saver.save("train", None, records("train", None, 12, n=200), shard_id="12")
    assert not list(Path(saver.manifest_uri).parent.rglob("shard-12*"))


def test_workers_save_and_the_parent_publishes(saver) -> None:
    jobs = [
        (saver, "train", stage, {"stage": stage}, k) for k, stage in enumerate(["easy", "medium", "hard"] * 2)
    ]
    jobs += [(saver, "valid", None, None, 100)]
    with ProcessPoolExecutor(max_workers=2) as pool:
        assert len(list(pool.map(save_shard, jobs))) == 7
    manifest = saver.commit_manifest()
    assert sum(s.rows for s in manifest.splits["train"].shards) == 120


def test_killed_workers_then_a_restart_publish_every_record_once(saver) -> None:
    jobs = [(saver, "train", None, None, k) for k in range(8)]
    with (
        pytest.raises(BrokenProcessPool),
        ProcessPoolExecutor(max_workers=2, initializer=die_mid_save, initargs=("2,5",)) as pool,
    ):
        list(pool.map(save_shard, jobs))
    root = Path(saver.manifest_uri).parent
    assert (root / "train/_/shard-2.parquet").exists()  # the data object of a crashed save
    assert not (root / "train/_/shard-2.parquet.done.json").exists()
    with ProcessPoolExecutor(max_workers=2) as pool:
        list(pool.map(save_shard, jobs))
    manifest = saver.commit_manifest()
    got = [
        int(v)
        for b in collect(config_for([ManifestSource(saver.manifest_uri, "train")], [V], batch_size=1))
        for v in b["v"]
    ]
    assert sorted(got) == sorted(r["v"] for k in range(8) for r in records("train", None, k))
    assert json.loads(Path(saver.manifest_uri).read_text())["version"] == 1
    assert load_manifest(saver.manifest_uri) == manifest


def test_cli_inspects_and_verifies_a_manifest(saver, capsys: pytest.CaptureFixture[str]) -> None:
    from o41_training_data._cli import main

    for k, stage in enumerate(["easy", "hard", "easy"]):
        saver.save("train", stage, records("train", stage, k), shard_id=str(k))
    saver.register_curriculum("train", "mixed", [saver.recover("train", "hard", shard_id="1")])
    saver.commit_manifest()
    assert main(["manifest", "inspect", saver.manifest_uri]) == 0
    out = capsys.readouterr().out
    assert "stage easy" in out
    assert "curriculum mixed" in out
    assert "60" in out  # rows of the train split
    assert main(["manifest", "verify", saver.manifest_uri]) == 0
    assert "3 of 3 shards verified" in capsys.readouterr().out
    shard = Path(saver.manifest_uri).parent / "train/easy/shard-0.parquet"
    shard.write_bytes(shard.read_bytes()[:-1] + b"x")
    assert main(["manifest", "verify", saver.manifest_uri]) == 1
    assert "checksum differs" in capsys.readouterr().err


def test_ray_tasks_save_and_the_driver_publishes(saver, monkeypatch: pytest.MonkeyPatch) -> None:
    import ray
    from ray._private import ray_constants

    # Under `uv run --no-sync`, Ray would start workers with that same command
    # in a copy of the working directory, where uv finds no environment; the
    # workers must run the driver's own interpreter whatever launched pytest.
    monkeypatch.setattr(ray_constants, "RAY_ENABLE_UV_RUN_RUNTIME_ENV", False)
    ray.init(
        num_cpus=2,
        include_dashboard=False,
        log_to_driver=False,
        configure_logging=False,
        _node_ip_address="127.0.0.1",  # a local cluster on loopback only
        runtime_env={
            "py_executable": sys.executable,
            "env_vars": {"PYTHONPATH": str(Path(__file__).parent)},
        },
    )
    try:
        remote_save = ray.remote(save_shard)
        jobs = [(saver, "train", stage, None, k) for k, stage in enumerate(["easy", "hard"] * 3)]
        locations = ray.get([remote_save.remote(job) for job in jobs])
    finally:
        ray.shutdown()
    assert len(set(locations)) == 6
    manifest = saver.commit_manifest()
    assert sum(s.rows for s in manifest.splits["train"].shards) == 120
    assert {s.curriculum_stage for s in manifest.splits["train"].shards} == {"easy", "hard"}


@pytest.mark.parametrize("data_format", ["parquet", "msgpack", "jsonl.gz"])
def test_iter_shard_yields_the_saved_records(tmp_path: Path, data_format: str) -> None:
    from o41_training_data import iter_shard

    saver = TrainingData().dataset_saver(tmp_path / "data-manifest-v1.json", data_format=data_format)
    expected = records("train", None, 3, n=1500)  # more than one decode chunk
    saver.save("train", None, expected, shard_id="3")
    manifest = saver.commit_manifest()
    (shard,) = manifest.splits["train"].shards
    assert list(iter_shard(manifest.data_format, shard)) == expected
    with pytest.raises(ObjectNotFoundError):
        next(iter_shard(data_format, tmp_path / "missing"))
