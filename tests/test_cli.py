"""The demo and the adapter skeletons, as a user meets them."""

from __future__ import annotations

import importlib
import subprocess
import sys
from pathlib import Path

import o41_training_data
import pytest
from o41_training_data._cli import main


def test_demo_writes_two_formats_and_streams_them(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["demo", "--dir", str(tmp_path), "--rows-per-shard", "200", "--seq-len", "64"]) == 0
    out = capsys.readouterr().out
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "part-000.parquet",
        "part-001.jsonl.gz",
        "part-002.parquet",
        "part-003.jsonl.gz",
    ]
    assert "tokens: int32 (32, 64)" in out
    assert "loss_mask: uint8 (32, 64)" in out
    assert "25 batches, 800 rows" in out
    assert "rows/s" in out


def test_demo_streams_from_a_seaweedfs_server_it_starts_and_stops(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["demo", "--s3", "--dir", str(tmp_path), "--rows-per-shard", "200", "--seq-len", "64"]
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "started a SeaweedFS S3 server at http://127.0.0.1:" in out
    assert out.count("uploaded s3://o41-demo/corpus/part-") == 4
    assert "25 batches, 800 rows" in out
    # Nothing the demo started is still running.
    server_dir = str(tmp_path / "s3-server")
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            assert server_dir not in cmdline.read_text(errors="replace")
        except (FileNotFoundError, ProcessLookupError, PermissionError):
            continue


def test_console_script_is_installed() -> None:
    result = subprocess.run(
        [str(Path(sys.executable).parent / "o41"), "--help"], capture_output=True, text=True, check=True
    )
    assert "demo" in result.stdout


@pytest.mark.parametrize("module", ["o41_training_data_jax", "o41_training_data_lightning"])
def test_adapter_skeletons_import_the_core(module: str) -> None:
    adapter = importlib.import_module(module)
    assert adapter.core_version == o41_training_data.__version__
