"""Configs and checkpoints are read bounded: special files, huge, binary or deeply nested ones are
refused at once with the package's errors naming the file, never read without end or blocking."""

from __future__ import annotations

import os
import threading
from pathlib import Path

import pytest
from o41_training_data import BatchStreamConfig, CheckpointError, ConfigError, ObjectNotFoundError
from o41_training_data._cli import main


def run_with_timeout(call: object, seconds: float = 10.0) -> object:
    """``call()`` on a thread; fails the test if it does not return within ``seconds`` (a hang)."""
    outcome: dict[str, object] = {}

    def target() -> None:
        try:
            outcome["value"] = call()  # type: ignore[operator]
        except BaseException as error:
            outcome["error"] = error

    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    thread.join(seconds)
    assert not thread.is_alive(), "blocked"
    if "error" in outcome:
        raise outcome["error"]  # type: ignore[misc]
    return outcome.get("value")


def test_a_fifo_config_or_checkpoint_is_refused_without_blocking(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    fifo = tmp_path / "stream.yaml"
    os.mkfifo(fifo)
    with pytest.raises(ConfigError, match=r"stream\.yaml: is not a regular file"):
        run_with_timeout(lambda: BatchStreamConfig.from_file(fifo))
    checkpoint = tmp_path / "ckpt.json"
    os.mkfifo(checkpoint)
    assert run_with_timeout(lambda: main(["checkpoint", "show", str(checkpoint)])) == 3
    assert "ckpt.json: is not a regular file (a checkpoint must be a regular file)" in capsys.readouterr().err


def test_dev_zero_and_directories_are_refused_naming_them(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    with pytest.raises(ConfigError, match="/dev/zero: is not a regular file"):
        run_with_timeout(lambda: BatchStreamConfig.from_file("/dev/zero"))
    for argv in (["config", "resolve", "/dev/zero"], ["checkpoint", "show", "/dev/zero"]):
        assert run_with_timeout(lambda argv=argv: main(argv)) == 3
        err = capsys.readouterr().err
        assert "/dev/zero: is not a regular file" in err
        assert "Traceback" not in err
    with pytest.raises(ConfigError, match="is a directory"):
        BatchStreamConfig.from_file(tmp_path)
    with pytest.raises(ObjectNotFoundError, match="no such config file"):
        BatchStreamConfig.from_file(tmp_path / "missing.yaml")


def test_binary_and_deeply_nested_documents_are_refused(tmp_path: Path) -> None:
    binary = tmp_path / "stream.json"
    binary.write_bytes(b"{\xff\xfe}")
    with pytest.raises(ConfigError, match=r"stream\.json: is not UTF-8 text \(byte 1\)"):
        BatchStreamConfig.from_file(binary)
    for name, text in [("deep.json", "[" * 100_000 + "]" * 100_000), ("deep.yaml", "a: " + "[" * 100_000)]:
        path = tmp_path / name
        path.write_text(text)
        with pytest.raises(ConfigError, match=f"{name}: nests deeper than 64 levels"):
            BatchStreamConfig.from_file(path)
    checkpoint = tmp_path / "deep-checkpoint.json"
    # Deep where a checkpoint holds free JSON (a field's pad value): the engine's parser stops.
    deep = "[" * 10_000 + "]" * 10_000
    checkpoint.write_text(f'{{"version": 1, "resolved": {{"fields": [{{"pad": {deep}}}]}}}}')
    from o41_training_data._checkpoint_files import read_checkpoint

    with pytest.raises(CheckpointError, match=r"deep-checkpoint\.json: .*nests too deep \(recursion limit"):
        read_checkpoint(checkpoint)


def test_an_oversized_config_is_refused_before_it_is_read(tmp_path: Path) -> None:
    from o41_training_data import _files

    huge = tmp_path / "huge.json"
    with huge.open("wb") as out:
        out.truncate(_files.MAX_DOCUMENT_BYTES + 1)  # sparse: no disk space used
    with pytest.raises(ConfigError, match=f"huge.json: is {_files.MAX_DOCUMENT_BYTES + 1} bytes, more than"):
        BatchStreamConfig.from_file(huge)
