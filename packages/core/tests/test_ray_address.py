"""An unreachable or malformed Ray address fails at once, naming it, instead of hanging."""

from __future__ import annotations

import socket
import threading
from pathlib import Path

import pytest
from o41_testkit import write_shard
from o41_training_data._cli import main


def test_manifest_build_with_an_unreachable_ray_address_fails_at_once(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    shard = write_shard(tmp_path / "a.jsonl", "jsonl", [{"v": 1}])
    with socket.socket() as closed:
        closed.bind(("127.0.0.1", 0))
        port = closed.getsockname()[1]  # nothing listens once it is closed
    outcome: list[int] = []
    argv = ["manifest", "build", str(shard), "--data-format", "jsonl", "--output", str(tmp_path / "m.json")]
    worker = threading.Thread(target=lambda: outcome.append(main([*argv, "--ray", f"127.0.0.1:{port}"])))
    worker.start()
    worker.join(60)
    assert not worker.is_alive(), "o41 manifest build --ray hung on an unreachable address"
    assert outcome == [3]
    assert f"no Ray cluster answers at 127.0.0.1:{port}" in capsys.readouterr().err
    assert main([*argv, "--ray", "not-an-address"]) == 3
    assert "invalid ray_address: 'not-an-address'" in capsys.readouterr().err
    assert not (tmp_path / "m.json").exists()
