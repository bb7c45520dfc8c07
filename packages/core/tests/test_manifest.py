"""Data manifests on the read side: format rules, ManifestSource selection, load and copy."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import jsonschema
import pytest
from o41_testkit import collect, config_for, write_shard
from o41_training_data import (
    BatchStream,
    ConfigError,
    DataManifest,
    MalformedShardError,
    ManifestShard,
    ManifestSource,
    ManifestSplit,
    ObjectConflictError,
    ObjectNotFoundError,
    ProjectedField,
    TrainingData,
    load_manifest,
    open_batch_stream,
    resolve_batch_stream_config,
    save_manifest,
)

V = ProjectedField("v", "v", "i64")
SUFFIX = {"parquet": ".parquet", "msgpack": ".msgpack", "jsonl.gz": ".jsonl.gz"}


def make_dataset(root: Path, data_format: str = "parquet") -> Path:
    """Writes shards of three stages and a manifest listing them relative to itself."""
    shards = []
    for k, stage in enumerate(["easy", "easy", "medium", "hard"]):
        location = f"train/{stage}-{k}{SUFFIX[data_format]}"
        (root / "train").mkdir(parents=True, exist_ok=True)
        path = write_shard(root / location, data_format, [{"v": k * 100 + i} for i in range(10)])
        shards.append(
            {
                "location": location,
                "rows": 10,
                "bytes": path.stat().st_size,
                "checksum": "none:0",
                "curriculum_stage": stage,
                "metadata": {"k": k},
            }
        )
    document = {
        "format": "o41-data-manifest",
        "version": 1,
        "data_format": data_format,
        "splits": {
            "train": {
                "shards": shards,
                "curricula": [{"name": "late", "shards": [shards[3]["location"], shards[2]["location"]]}],
            },
            "valid": {"shards": [shards[0]]},
        },
    }
    manifest = root / "data-manifest-v1.json"
    manifest.write_text(json.dumps(document))
    return manifest


def values(config) -> list[int]:
    return [int(v) for b in collect(config) for v in b["v"]]


@pytest.mark.parametrize("data_format", ["parquet", "msgpack", "jsonl.gz"])
def test_stream_reads_stages_in_listed_order(tmp_path: Path, data_format: str) -> None:
    manifest = make_dataset(tmp_path, data_format)
    source = ManifestSource(str(manifest), "train", curriculum_stages=["medium", "easy"])
    assert values(config_for([source], [V], batch_size=5)) == [
        *range(200, 210),
        *range(0, 10),
        *range(100, 110),
    ]
    root = ManifestSource(str(manifest), "train")
    assert len(values(config_for([root], [V], batch_size=5))) == 40


def test_named_selections_keep_their_order(tmp_path: Path) -> None:
    manifest = make_dataset(tmp_path)
    source = ManifestSource(str(manifest), "train", curriculum_stages=["late"])
    assert values(config_for([source], [V], batch_size=10)) == [*range(300, 310), *range(200, 210)]


def test_unknown_split_or_stage_lists_what_exists(tmp_path: Path) -> None:
    manifest = make_dataset(tmp_path)
    with pytest.raises(ConfigError, match="splits are: train, valid") as info:
        open_batch_stream(config_for([ManifestSource(str(manifest), "test")], [V]))
    assert info.value.option == "stages[0].sources[0].split"
    with pytest.raises(ConfigError, match="has: late, easy, medium, hard"):
        open_batch_stream(config_for([ManifestSource(str(manifest), "train", ["expert"])], [V]))


def test_resolved_config_pins_the_selected_shards(tmp_path: Path) -> None:
    manifest = make_dataset(tmp_path)
    resolved = resolve_batch_stream_config(
        config_for([ManifestSource(str(manifest), "train", ["hard"])], [V])
    )
    shards = resolved["stages"][0]["sources"][0]["shards"]
    assert [(Path(s["path"]).name, s["rows"]) for s in shards] == [("hard-3.parquet", 10)]


def test_a_shard_that_differs_from_the_manifest_fails_at_its_first_read(tmp_path: Path) -> None:
    manifest = make_dataset(tmp_path)
    write_shard(tmp_path / "train/hard-3.parquet", "parquet", [{"v": 1}])
    # Open reads one shard per source (easy-0), so the rewritten shard is caught where the
    # stream first reads it: after every batch of the shards before it.
    delivered: list[int] = []

    def drain(stream: BatchStream) -> None:
        for batch in stream:
            delivered.extend(int(v) for v in batch.arrays()["v"])

    with (
        open_batch_stream(config_for([ManifestSource(str(manifest), "train")], [V], batch_size=10)) as stream,
        pytest.raises(MalformedShardError, match=r"hard-3\.parquet.*the manifest lists \d+ bytes") as info,
    ):
        drain(stream)
    assert delivered == [*range(0, 10), *range(100, 110), *range(200, 210)]
    assert info.value.path.endswith("hard-3.parquet")


@pytest.mark.parametrize(
    ("mutate", "message"),
    [
        (lambda d: d.update(version=2), "version"),
        (lambda d: d.pop("format"), "not a data manifest"),
        (lambda d: d["splits"]["train"]["shards"].append(d["splits"]["train"]["shards"][0]), "twice"),
        (lambda d: d["splits"]["train"]["curricula"][0]["shards"].append("nope.parquet"), "does not list"),
        (lambda d: d.update(data_format="csv"), "csv"),
    ],
)
def test_malformed_manifests_are_refused(tmp_path: Path, mutate, message: str) -> None:
    manifest = make_dataset(tmp_path)
    document = json.loads(manifest.read_text())
    mutate(document)
    manifest.write_text(json.dumps(document))
    with pytest.raises(MalformedShardError, match=message) as info:
        load_manifest(manifest)
    assert info.value.path == str(manifest)


def test_manifests_follow_the_published_schema(tmp_path: Path) -> None:
    docs = Path(__file__).resolve().parents[3] / "docs"
    schema = json.loads((docs / "data-manifest-v1.schema.json").read_text())
    jsonschema.Draft202012Validator.check_schema(schema)
    original = make_dataset(tmp_path / "data")
    jsonschema.validate(json.loads(original.read_text()), schema)
    copy = tmp_path / "copy.json"
    save_manifest(copy, load_manifest(original))
    jsonschema.validate(json.loads(copy.read_text()), schema)


def test_missing_manifest(tmp_path: Path) -> None:
    with pytest.raises(ObjectNotFoundError):
        load_manifest(tmp_path / "nope.json")


def test_a_copied_dataset_directory_stays_valid(tmp_path: Path) -> None:
    make_dataset(tmp_path / "a")
    shutil.copytree(tmp_path / "a", tmp_path / "b")
    shutil.rmtree(tmp_path / "a")
    source = ManifestSource(str(tmp_path / "b/data-manifest-v1.json"), "valid")
    assert values(config_for([source], [V], batch_size=10)) == list(range(10))


def test_save_manifest_copies_and_refuses_a_different_one(tmp_path: Path) -> None:
    training_data = TrainingData()
    manifest = training_data.load_manifest(make_dataset(tmp_path / "data"))
    assert manifest.data_format == "parquet"
    assert [s.rows for s in manifest.splits["train"].shards] == [10, 10, 10, 10]
    assert manifest.splits["train"].shards[1].metadata == {"k": 1}
    copy = tmp_path / "run/data-manifest-v1.json"
    training_data.save_manifest(copy, manifest)
    training_data.save_manifest(copy, manifest)  # the same publication again: a no-op
    reread = load_manifest(copy)
    assert [s.path for s in reread.splits["train"].shards] == [
        s.path for s in manifest.splits["train"].shards
    ]
    source = ManifestSource(str(copy), "train", ["late"])
    assert values(config_for([source], [V], batch_size=10))[:3] == [300, 301, 302]
    other = load_manifest(make_dataset(tmp_path / "other"))
    with pytest.raises(ObjectConflictError, match="already holds a different manifest"):
        save_manifest(copy, other)
    save_manifest(copy, other, overwrite=True)
    assert load_manifest(copy).splits["train"].shards[0].path.startswith(str(tmp_path / "other"))
    assert not list((tmp_path / "run").glob(".tmp-*"))  # no temporary file left behind


def test_training_data_checks_its_storage_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3"):
        monkeypatch.delenv(name, raising=False)
    with pytest.raises(ConfigError, match="secret_access_key"):
        TrainingData(s3_base_url="http://127.0.0.1:1", access_key_id="k")
    with pytest.raises(ConfigError, match="access_key_id"):
        TrainingData(region="auto", secret_access_key="s")
    with pytest.raises(ConfigError, match="s3_base_url"):
        TrainingData(s3_base_url="ftp://host", access_key_id="k", secret_access_key="s")
    # Without keys the AWS chain is looked at on the first s3:// request, not here.
    assert "AWS chain" in repr(TrainingData(s3_base_url="http://127.0.0.1:1"))


def test_a_republished_manifest_does_not_change_a_resumed_stream(tmp_path: Path) -> None:
    from o41_training_data import Checkpoint, resume_batch_stream

    manifest = make_dataset(tmp_path)
    config = config_for([ManifestSource(str(manifest), "train", ["easy"])], [V], batch_size=5)
    with open_batch_stream(config) as stream:
        reference = [b.arrays()["v"].tolist() for b in stream]
    with open_batch_stream(config) as stream:
        next(stream)
        text = stream.checkpoint().to_json()
    document = json.loads(manifest.read_text())
    for shard in document["splits"]["train"]["shards"]:
        shard["curriculum_stage"] = "hard"  # republished: "easy" now selects nothing
    manifest.write_text(json.dumps(document))
    with resume_batch_stream(Checkpoint.from_json(text)) as resumed:
        assert [b.arrays()["v"].tolist() for b in resumed] == reference[1:]


def test_one_shard_under_several_spellings_is_refused(tmp_path: Path) -> None:
    # Each spelling would deliver every row of the shard once more.
    (tmp_path / "sub").mkdir()
    write_shard(tmp_path / "a.msgpack", "msgpack", [{"v": 1}])
    size = (tmp_path / "a.msgpack").stat().st_size
    for alias in ["./a.msgpack", str(tmp_path / "a.msgpack"), "sub/../a.msgpack"]:
        document = {
            "format": "o41-data-manifest",
            "version": 1,
            "data_format": "msgpack",
            "splits": {
                "train": {
                    "shards": [
                        {"location": location, "rows": 1, "bytes": size, "checksum": "none:0"}
                        for location in ["a.msgpack", alias]
                    ]
                }
            },
        }
        (tmp_path / "m.json").write_text(json.dumps(document))
        with pytest.raises(MalformedShardError, match=f"lists one shard twice, as 'a.msgpack' and '{alias}'"):
            load_manifest(tmp_path / "m.json")


def test_locations_are_spelled_by_the_engines_one_rule_without_following_links(tmp_path: Path) -> None:
    from o41_training_data._storage import normalize

    (tmp_path / "real").mkdir()
    (tmp_path / "link").symlink_to(tmp_path / "real")
    # `..` is resolved in the text; a link is kept as written (Path.resolve() would follow it).
    assert normalize(tmp_path / "link" / "x" / ".." / "a.parquet") == f"{tmp_path}/link/a.parquet"
    assert normalize("s3://bucket/a/../b") == "s3://bucket/a/../b"
    write_shard(tmp_path / "real" / "a.jsonl", "jsonl", [{"v": k} for k in range(4)])
    manifest = DataManifest(
        data_format="jsonl",
        splits={
            "train": ManifestSplit(
                shards=(
                    ManifestShard(
                        location=str(tmp_path / "link" / "a.jsonl"),
                        rows=4,
                        bytes=(tmp_path / "real" / "a.jsonl").stat().st_size,
                        checksum="none:0",
                    ),
                )
            )
        },
    )
    save_manifest(tmp_path / "link" / "m.json", manifest)
    # Saved beside the link, the shard's location is relative to the link's directory.
    [shard] = json.loads((tmp_path / "real" / "m.json").read_text())["splits"]["train"]["shards"]
    assert shard["location"] == "a.jsonl"
    loaded = load_manifest(tmp_path / "link" / "m.json")
    assert loaded.uri == f"{tmp_path}/link/m.json"
    assert loaded.splits["train"].shards[0].path == f"{tmp_path}/link/a.jsonl"
