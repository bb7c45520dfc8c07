"""Hostile files, arguments and settings met on the Python side (issue 32, round 3): symbolic
link loops, the CLI's exit statuses, and settings, arguments and config parts of the wrong type.

Each case gives an error of the package's hierarchy naming the file, option or argument at
fault, at once: no hang on a FIFO, no endless read of a device, no ``RecursionError``,
``UnicodeDecodeError``, ``OverflowError`` or ``TypeError`` from a bad input.
"""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from o41_training_data import (
    BatchStream,
    BatchStreamConfig,
    Checkpoint,
    ConfigError,
    DataManifest,
    FileSource,
    MalformedShardError,
    ManifestSource,
    O41Error,
    ObjectConflictError,
    ProjectedField,
    RetryPolicy,
    Stage,
    StorageConfig,
    StorageError,
    TrainingData,
    _core,
    iter_shard,
    load_manifest,
    open_batch_stream,
    resolve_batch_stream_config,
    resume_batch_stream,
    save_manifest,
)
from o41_training_data._cli import main

O41 = str(Path(sys.executable).parent / "o41")


KEYS = {"access_key_id": "KEYID0SECRET", "secret_access_key": "SK0SECRET", "session_token": "TOKEN0SECRET"}


@pytest.fixture
def opened(tmp_path: Path) -> Iterator[BatchStream]:
    pq.write_table(pa.table({"v": list(range(20))}), tmp_path / "a.parquet")
    config = BatchStreamConfig(
        fields=[ProjectedField("v", "v", "i64")],
        stages=[Stage(sources=[FileSource([str(tmp_path / "a.parquet")])], batch_size=2, infinite=True)],
    )
    with open_batch_stream(config) as stream:
        next(stream)
        yield stream


def o41(*args: str, cwd: Path | None = None, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run([O41, *args], capture_output=True, text=True, timeout=timeout, cwd=cwd, check=False)


# --- symlink loops ------------------------------------------------------------------------------


def test_symlink_loops_are_storage_errors_naming_the_path(tmp_path: Path) -> None:
    loop = tmp_path / "loop.json"
    os.symlink(loop, loop)
    calls = {
        "from_file": lambda: BatchStreamConfig.from_file(loop),
        "iter_shard": lambda: list(iter_shard("jsonl", loop)),
        "load_manifest": lambda: load_manifest(loop),
        "save_manifest": lambda: save_manifest(loop, DataManifest(data_format="jsonl", splits={})),
    }
    for name, call in calls.items():
        with pytest.raises(StorageError, match="loop of symbolic links") as caught:
            call()
        assert caught.value.path == str(loop), name
        assert isinstance(caught.value, O41Error)


@pytest.mark.parametrize("where", ["a loop of two links", "a loop in a parent directory"])
def test_symlink_loops_anywhere_on_the_path_are_storage_errors(tmp_path: Path, where: str) -> None:
    # Not only a link to itself: a -> b -> a, and a directory on the way that loops.
    if where == "a loop of two links":
        os.symlink(tmp_path / "b.json", tmp_path / "a.json")
        os.symlink(tmp_path / "a.json", tmp_path / "b.json")
        path = tmp_path / "a.json"
    else:
        os.symlink(tmp_path / "d", tmp_path / "d")
        path = tmp_path / "d" / "x.json"
    calls = {
        "from_file": lambda: BatchStreamConfig.from_file(path),
        "iter_shard": lambda: list(iter_shard("jsonl", path)),
        "load_manifest": lambda: load_manifest(path),
    }
    for name, call in calls.items():
        with pytest.raises(StorageError, match="loop of symbolic links") as caught:
            call()
        assert caught.value.path == str(path), name


# --- CLI exit status, one case per documented path (docs/cli.md) -------------------------------------


@pytest.fixture(scope="module")
def cli_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    tmp_path = tmp_path_factory.mktemp("cli")
    data = tmp_path / "data"
    data.mkdir()
    pq.write_table(pa.table({"v": list(range(10))}), data / "a.parquet")
    (data / "bad.parquet").write_bytes(b"PAR1 not a parquet file PAR1")
    config = {
        "fields": [{"name": "v", "source": "v", "dtype": "i64"}],
        "stages": [{"sources": [{"files": ["data/a.parquet"]}], "batch_size": 2}],
    }
    (tmp_path / "stream.json").write_text(json.dumps(config))
    config["stages"][0]["sources"][0]["files"] = ["data/gone.parquet"]  # type: ignore[index]
    (tmp_path / "missing-shard.json").write_text(json.dumps(config))
    (tmp_path / "bad-key.json").write_text(json.dumps({**config, "sed": 1}))
    (tmp_path / "not-a-checkpoint.json").write_text('{"version": 1}')
    assert o41("manifest", "build", "data/a.parquet", "--output", "m.json", cwd=tmp_path).returncode == 0
    data.joinpath("a.parquet").rename(data / "a.bak")
    pq.write_table(pa.table({"v": list(range(11))}), data / "a.parquet")  # now differs from m.json
    assert o41("manifest", "build", "data/a.parquet", "--output", "m2.json", cwd=tmp_path).returncode == 0
    return tmp_path


@pytest.mark.parametrize(
    ("args", "status", "stderr"),
    [
        (["manifest", "inspect", "m2.json"], 0, ""),
        (["config", "resolve", "stream.json"], 0, ""),
        (["manifest", "verify", "m.json"], 1, "a.parquet"),
        (["manifest", "diff", "m.json", "m2.json"], 1, ""),
        (["manifest", "frobnicate"], 2, "No such command"),
        (["manifest", "inspect", "--frob", "m.json"], 2, "No such option"),
        (["manifest", "inspect"], 2, "Missing argument"),
        (["manifest", "inspect", "absent.json"], 2, "absent.json does not exist"),
        (["manifest", "verify", "absent.json"], 2, "absent.json does not exist"),
        (["manifest", "diff", "m.json", "absent.json"], 2, "absent.json does not exist"),
        (["config", "resolve", "absent.json"], 2, "does not exist"),
        (["checkpoint", "show", "absent.json"], 2, "does not exist"),
        (
            ["tokenize", "data/a.parquet", "--output", "t/m.json", "--tokenizer", "absent.json"],
            2,
            "absent.json",
        ),
        (["manifest", "build", "data/a.parquet", "--output", "x.json", "--data-format", "csv"], 2, "csv"),
        (["config", "resolve", "bad-key.json"], 3, "bad-key.json: invalid sed"),
        (["config", "resolve", "missing-shard.json"], 3, "gone.parquet"),
        (["checkpoint", "show", "not-a-checkpoint.json"], 3, "not-a-checkpoint.json"),
        (["config", "resolve", "/dev/zero"], 3, "/dev/zero: is not a regular file"),
        (["manifest", "build", "data/gone.parquet", "--output", "x.json"], 3, "gone.parquet"),
        (["manifest", "build", "data/bad.parquet", "--output", "x.json"], 3, "bad.parquet"),
        (["manifest", "inspect", "data/a.parquet"], 3, "a.parquet"),
    ],
)
def test_cli_exit_status_is_the_documented_one(
    cli_dir: Path, args: list[str], status: int, stderr: str
) -> None:
    result = o41(*args, cwd=cli_dir)
    assert result.returncode == status, result.stderr
    assert stderr in result.stderr
    assert "Traceback" not in result.stderr


def test_cli_reports_an_unexpected_error_in_one_line_with_status_3(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # Stands for a bug: an exception outside the hierarchy used to exit 1 with a traceback.
    def broken(*args: object, **kwargs: object) -> None:
        raise KeyError("stages")

    monkeypatch.setattr("o41_training_data._checkpoint_files.read_checkpoint", broken)
    (tmp_path / "c.json").write_text("{}")
    assert main(["checkpoint", "show", str(tmp_path / "c.json")]) == 3
    assert capsys.readouterr().err == "o41: error: KeyError: 'stages'\n"


# --- settings and arguments of the Python API that escaped the hierarchy -------------------------------


def _storage(**kwargs: object) -> object:
    return TrainingData(**{"s3_base_url": "http://127.0.0.1:9", **KEYS, **kwargs})  # type: ignore[arg-type]


def test_a_retry_policy_takes_the_engine_defaults_and_reaches_it_at_its_bounds() -> None:
    # The defaults and bounds are the engine's (`_core.retry_defaults()`, `LIMITS`), and the
    # largest policy the face accepts is one the engine builds storage with.
    assert dataclasses.asdict(RetryPolicy()) == _core.retry_defaults()
    largest = RetryPolicy(max_consecutive_failures=2**32 - 1, no_progress_timeout_s=1e9)
    config = StorageConfig(s3_base_url="http://127.0.0.1:9", **KEYS, retry=largest)
    assert isinstance(config.core(), _core.Storage)


@pytest.mark.parametrize(
    ("call", "option"),
    [
        (lambda: RetryPolicy(max_consecutive_failures="8"), "retry.max_consecutive_failures"),
        (lambda: RetryPolicy(max_consecutive_failures=2**70), "retry.max_consecutive_failures"),
        # The engine counts failures in 32 bits: 2**32 reached the binding and overflowed there.
        (lambda: RetryPolicy(max_consecutive_failures=2**32), "retry.max_consecutive_failures"),
        (lambda: RetryPolicy(no_progress_timeout_s=2e9), "retry.no_progress_timeout_s"),
        (lambda: RetryPolicy(read_timeout_s=float("inf")), "retry.read_timeout_s"),
        (lambda: RetryPolicy(connect_timeout_s=1e300), "retry.connect_timeout_s"),  # a Duration panic
        (lambda: RetryPolicy(max_backoff_s="1"), "retry.max_backoff_s"),
        (lambda: TrainingData(retry="fast"), "retry"),
        (lambda: _storage(region=5), "region"),
        (lambda: _storage(region="us\r\nX-Injected: 1"), "region"),
        (lambda: _storage(access_key_id="KEY\r\nX-Injected: 1"), "access_key_id"),
        (lambda: _storage(secret_access_key="SECRET\n"), "secret_access_key"),
        (lambda: _storage(session_token=5), "session_token"),
        (lambda: load_manifest(5), "uri"),  # type: ignore[arg-type]
        (lambda: list(iter_shard("parquet", None)), "shard"),  # type: ignore[arg-type]
        (lambda: list(iter_shard("csv", "a.csv")), "data_format"),
        (lambda: TrainingData().dataset_saver("out\x00/m.json"), "manifest_uri"),
        (lambda: TrainingData().dataset_saver("out/m.json").save("t", None, 5, shard_id="0"), "records"),  # type: ignore[arg-type]
        (
            lambda: (
                TrainingData()
                .dataset_saver("out/m.json")
                .save("t", None, [{"a": 1}], {"x": {1, 2}}, shard_id="0")
            ),
            "curriculum_metadata",
        ),
        (lambda: BatchStreamConfig.from_file(5), "path"),  # type: ignore[arg-type]
        (lambda: BatchStreamConfig.from_file("a\x00.json"), "path"),
        (lambda: open_batch_stream("stream.yaml"), "config"),  # type: ignore[arg-type]
        (lambda: resolve_batch_stream_config({"fields": []}), "config"),  # type: ignore[arg-type]
    ],
)
def test_bad_settings_and_arguments_are_config_errors(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, call: Callable[[], object], option: str
) -> None:
    # These were TypeError, ValueError, OverflowError or AttributeError, or were accepted.
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ConfigError) as caught:
        call()
    assert caught.value.option == option
    assert "SECRET" not in str(caught.value)
    assert not (tmp_path / "out").exists() or not list((tmp_path / "out").rglob("*.done.json"))


MAX_MANIFEST_BYTES = 1 << 30  # the engine's manifest::MAX_MANIFEST_BYTES (docs/manifest.md)


def test_load_manifest_refuses_a_file_over_its_limit_before_reading_it(tmp_path: Path) -> None:
    big = tmp_path / "data-manifest-v1.json"
    with big.open("wb") as out:
        out.truncate(MAX_MANIFEST_BYTES + 1)  # sparse: read whole, it would take 1 GiB
    with pytest.raises(MalformedShardError, match="limit of a data manifest") as caught:
        load_manifest(big)
    assert caught.value.path == str(big)
    os.mkfifo(tmp_path / "fifo.json")
    with pytest.raises(StorageError, match="not a regular file"):
        load_manifest(tmp_path / "fifo.json")


@pytest.mark.parametrize(
    ("call", "option"),
    [
        (lambda s: s.checkpoint().check(config="stream.yaml"), "config"),
        (lambda s: resume_batch_stream(s.checkpoint(), config={"seed": 1}), "config"),
        (lambda s: Checkpoint.from_position("position", s.checkpoint()), "position"),
    ],
)
def test_objects_of_the_wrong_kind_are_config_errors(
    opened: BatchStream, call: Callable[[BatchStream], object], option: str
) -> None:
    # Were AttributeError ('str' object has no attribute 'to_json') and TypeError.
    with pytest.raises(ConfigError, match="expected a") as caught:
        call(opened)
    assert caught.value.option == option


@pytest.mark.parametrize("content", [b"\xff\xfe not text", b'{"a": 1}'])
def test_save_manifest_over_another_file_is_a_conflict(tmp_path: Path, content: bytes) -> None:
    # Was UnicodeDecodeError (or MalformedShardError about a file it was only asked to write).
    target = tmp_path / "data-manifest-v1.json"
    target.write_bytes(content)
    manifest = DataManifest(data_format="parquet", splits={})
    with pytest.raises(ObjectConflictError, match="pass overwrite=True") as caught:
        save_manifest(target, manifest)
    assert caught.value.path == str(target)
    assert target.read_bytes() == content
    save_manifest(target, manifest, overwrite=True)
    assert load_manifest(target).splits == {}


@pytest.mark.parametrize(
    ("build", "option"),
    [
        (lambda: ProjectedField("v", "v", "i64", shape=3), "field 'v'.shape"),  # type: ignore[arg-type]
        (lambda: FileSource([5]), "FileSource.files[0]"),  # type: ignore[list-item]
        (lambda: FileSource(None), "FileSource.files"),  # type: ignore[arg-type]
        (lambda: ManifestSource(5, "train"), "ManifestSource.manifest_uri"),  # type: ignore[arg-type]
        (lambda: ManifestSource("m.json", None), "ManifestSource.split"),  # type: ignore[arg-type]
        (
            lambda: ManifestSource("m.json", "train", curriculum_stages=[1]),
            "ManifestSource.curriculum_stages[0]",
        ),  # type: ignore[list-item]
        (lambda: BatchStreamConfig(fields=None, stages=[]), "fields"),  # type: ignore[arg-type]
        (lambda: BatchStreamConfig(fields=[ProjectedField("v", "v", "i64")], stages={"a": 1}), "stages"),  # type: ignore[arg-type]
    ],
)
def test_config_parts_of_the_wrong_type_are_config_errors(build: Callable[[], object], option: str) -> None:
    # Were TypeError ('int' object is not iterable, expected str, bytes or os.PathLike) or accepted.
    with pytest.raises(ConfigError) as caught:
        build()
    assert caught.value.option == option
