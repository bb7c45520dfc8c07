"""The dataset saver and column names (issue 32, round 3): names that are not names, empty or
forged publications, and NUL characters Arrow's C data interface cannot carry are refused with
the package's errors, naming the option, field or file."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from o41_training_data import (
    BatchStreamConfig,
    ConfigError,
    DataError,
    DataManifest,
    FileSource,
    MalformedShardError,
    ProjectedField,
    Stage,
    TrainingData,
    UnsupportedFormatError,
    iter_shard,
    load_manifest,
    save_manifest,
)

# --- the dataset saver ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("split", "stage", "shard_id", "option"),
    [
        ("train", None, "a\n", "shard_id"),  # "$" let a trailing newline through
        ("train\n", None, "a", "split"),
        ("train", "easy\n", "a", "curriculum_stage"),
        ("train", "_", "a", "curriculum_stage"),  # was taken as no stage
        ("train", "", "a", "curriculum_stage"),
        ("train", None, "a\x00", "shard_id"),
    ],
)
def test_saver_refuses_names_that_are_not_names(
    tmp_path: Path, split: str, stage: str | None, shard_id: str, option: str
) -> None:
    saver = TrainingData().dataset_saver(tmp_path / "data-manifest-v1.json")
    with pytest.raises(ConfigError, match=f"invalid {option}") as caught:
        saver.save(split, stage, [{"a": 1}], shard_id=shard_id)
    assert caught.value.option == option
    assert not list(tmp_path.rglob("*.done.json"))


def test_saver_never_publishes_an_empty_manifest(tmp_path: Path) -> None:
    uri = tmp_path / "data-manifest-v1.json"
    saver = TrainingData().dataset_saver(uri)
    with pytest.raises(ConfigError, match="no completed shard"):
        saver.commit_manifest()
    assert not uri.exists()


def test_an_empty_manifest_does_not_block_a_later_commit(tmp_path: Path) -> None:
    # As an earlier version published it: every later commit then met a "different manifest".
    uri = tmp_path / "data-manifest-v1.json"
    save_manifest(uri, DataManifest(data_format="parquet", splits={}))
    saver = TrainingData().dataset_saver(uri)
    saver.save("train", None, [{"a": 1}], shard_id="0")
    committed = saver.commit_manifest()
    assert [s.rows for s in committed.splits["train"].shards] == [1]
    assert load_manifest(uri) == committed


def test_saver_verifies_a_descriptors_rows_against_the_shard(tmp_path: Path) -> None:
    uri = tmp_path / "data-manifest-v1.json"
    saved = TrainingData().dataset_saver(uri).save("train", None, [{"a": 1}, {"a": 2}], shard_id="0")
    descriptor = tmp_path / (saved.location + ".done.json")
    document = json.loads(descriptor.read_text())
    document["rows"] = 1000  # size and checksum still match the data object
    descriptor.write_text(json.dumps(document))
    saver = TrainingData().dataset_saver(uri)
    with pytest.raises(MalformedShardError, match=r"completion descriptor .*\(rows\)") as caught:
        saver.commit_manifest()
    assert caught.value.path == str(tmp_path / saved.location)
    assert not uri.exists()


def test_saver_refuses_a_deeply_nested_descriptor(tmp_path: Path) -> None:
    uri = tmp_path / "data-manifest-v1.json"
    saved = TrainingData().dataset_saver(uri).save("train", None, [{"a": 1}], shard_id="0")
    descriptor = tmp_path / (saved.location + ".done.json")
    descriptor.write_text("[" * 100_000 + "]" * 100_000)
    with pytest.raises(MalformedShardError, match="nested deeper"):
        TrainingData().dataset_saver(uri).commit_manifest()


@pytest.mark.parametrize("data_format", ["parquet", "msgpack", "jsonl.gz"])
def test_saver_refuses_a_nul_in_a_field_name(tmp_path: Path, data_format: str) -> None:
    # Parquet used to be written with the name cut at the NUL ("a"), silently.
    saver = TrainingData().dataset_saver(tmp_path / "data-manifest-v1.json", data_format)
    with pytest.raises(DataError, match="NUL") as caught:
        saver.save("train", None, [{"m": {"a\x00b": 1}}], shard_id="0")
    assert caught.value.field == "m.a\x00b"


# --- NUL characters in column names -----------------------------------------------------------------


def test_iter_shard_reports_a_column_name_arrow_cannot_carry(tmp_path: Path) -> None:
    # Was pyarrow's ArrowInvalid from the C data interface.
    path = tmp_path / "nul.parquet"
    pq.write_table(pa.table({"a\x00b": [1, 2], "c": [3, 4]}), path)
    with pytest.raises(UnsupportedFormatError, match="Null byte") as caught:
        list(iter_shard("parquet", path))
    assert caught.value.path == str(path)


def test_a_projected_field_name_with_a_nul_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match="NUL") as caught:
        BatchStreamConfig(
            fields=[ProjectedField("a\x00b", "a", "i64")],
            stages=[Stage(sources=[FileSource(["x.parquet"])], batch_size=1)],
        )
    assert caught.value.option == "fields[0].name"
