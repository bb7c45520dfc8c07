"""``o41 manifest build``: indexing shards other tools wrote, so streams over them open cheaply."""

from __future__ import annotations

import gzip
import hashlib
import json
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from o41_testkit import collect, config_for
from o41_training_data import (
    ConfigError,
    MalformedShardError,
    ManifestSource,
    ProjectedField,
    load_manifest,
    manifest_from_files,
)
from o41_training_data._cli import main

V = ProjectedField("v", "v", "i64")


def parquet_files(root: Path, count: int = 3, rows: int = 50) -> list[str]:
    """Shards written by pyarrow itself, with another codec than ours, as another tool would."""
    root.mkdir(parents=True, exist_ok=True)
    paths = []
    for k in range(count):
        path = root / f"part-{k:05d}.parquet"
        table = pa.table({"v": pa.array([1000 * k + i for i in range(rows)], pa.int64())})
        pq.write_table(table, path, compression="gzip", row_group_size=20)
        paths.append(str(path))
    return paths


def test_the_cli_indexes_files_into_a_manifest_streams_open(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    files = parquet_files(tmp_path / "data")
    output = tmp_path / "data" / "data-manifest-v1.json"
    assert main(["manifest", "build", *files, "--output", str(output)]) == 0
    assert "3 shards, 150 rows" in capsys.readouterr().out
    document = json.loads(output.read_text())
    assert document["data_format"] == "parquet"
    listed = document["splits"]["train"]["shards"]
    # Locations are relative to the manifest, so the dataset directory can be moved whole.
    assert [s["location"] for s in listed] == [Path(f).name for f in files]
    for shard, path in zip(listed, files, strict=True):
        data = Path(path).read_bytes()
        assert (shard["rows"], shard["bytes"]) == (50, len(data))
        assert shard["checksum"] == "sha256:" + hashlib.sha256(data).hexdigest()
    assert main(["manifest", "verify", str(output)]) == 0
    batches = collect(config_for([ManifestSource(str(output), "train")], [V], batch_size=10))
    assert [int(v) for b in batches for v in b["v"]] == [1000 * k + i for k in range(3) for i in range(50)]


def test_json_lines_are_counted_as_a_stream_counts_them(tmp_path: Path) -> None:
    path = tmp_path / "a.jsonl.gz"
    # Blank lines are not records; the file comes from Python's gzip, not from o41.
    lines = [json.dumps({"v": i}) if i % 4 else "" for i in range(40)]
    path.write_bytes(gzip.compress(("\n".join(lines) + "\n").encode()))
    manifest = manifest_from_files([path], tmp_path / "m.json", split="valid")
    (shard,) = manifest.splits["valid"].shards
    assert (shard.rows, manifest.data_format) == (30, "jsonl.gz")


def test_bad_file_lists_are_refused_before_anything_is_written(tmp_path: Path) -> None:
    files = parquet_files(tmp_path)
    other = tmp_path / "x.jsonl"
    other.write_text('{"v": 1}\n')
    output = tmp_path / "m.json"
    with pytest.raises(ConfigError, match="one encoding, these files have jsonl, parquet") as info:
        manifest_from_files([*files, other], output)
    assert info.value.option == "files"
    with pytest.raises(ConfigError, match="listed twice"):
        manifest_from_files([files[0], files[0]], output)
    with pytest.raises(ConfigError, match="no known suffix") as info:
        manifest_from_files([tmp_path / "x.bin"], output)
    assert info.value.option == "data_format"
    broken = Path(files[1])
    broken.write_bytes(broken.read_bytes()[:100])
    with pytest.raises(MalformedShardError, match=r"part-00001\.parquet") as error:
        manifest_from_files(files, output)
    assert error.value.path == str(broken)
    assert not output.exists()


def test_ray_tasks_describe_the_shards(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import ray
    from ray._private import ray_constants

    files = parquet_files(tmp_path / "data", count=5, rows=30)
    local = manifest_from_files(files, tmp_path / "local.json")
    # As in the saver's Ray test: workers run the driver's interpreter, on loopback only.
    monkeypatch.setattr(ray_constants, "RAY_ENABLE_UV_RUN_RUNTIME_ENV", False)
    monkeypatch.setattr("o41_training_data._manifest_build._TASK_SHARDS", 2)
    ray.init(
        num_cpus=2,
        include_dashboard=False,
        log_to_driver=False,
        configure_logging=False,
        _node_ip_address="127.0.0.1",
        runtime_env={"py_executable": sys.executable},
    )
    try:
        spread = manifest_from_files(files, tmp_path / "ray.json", ray_address="auto")
    finally:
        ray.shutdown()
    assert spread.splits == local.splits
    assert load_manifest(tmp_path / "ray.json").splits == local.splits
