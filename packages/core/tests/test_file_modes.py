"""Files the library writes get the mode a plain ``open()`` gives: ``0o666`` less the umask.

A checkpoint beside a model checkpoint (``0o644`` under the usual umask) that only its owner can
read breaks a job whose readers run as another user (issue 46).
"""

from __future__ import annotations

import os
import stat
from collections.abc import Iterator
from pathlib import Path

import pytest
from o41_testkit import write_shard
from o41_training_data import (
    BatchStreamConfig,
    Checkpoint,
    FileSource,
    ProjectedField,
    Stage,
    open_batch_stream,
    read_checkpoint,
    write_checkpoint,
    write_rank_file,
)
from o41_training_data._checkpoint_files import reshard


@pytest.fixture(params=[0o022, 0o002, 0o077], ids=lambda m: f"umask-{m:03o}")
def umask(request: pytest.FixtureRequest) -> Iterator[int]:
    old = os.umask(request.param)
    try:
        yield request.param
    finally:
        os.umask(old)


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


@pytest.fixture
def checkpoint(tmp_path: Path) -> Checkpoint:
    shard = write_shard(tmp_path / "part.jsonl", "jsonl", [{"v": i} for i in range(40)])
    config = BatchStreamConfig(
        fields=[ProjectedField("v", "v", "i64")],
        stages=[Stage(sources=[FileSource([str(shard)])], batch_size=4)],
        threads=1,
    )
    with open_batch_stream(config) as stream:
        next(stream)
        return stream.checkpoint()


def test_a_rank_file_gets_the_mode_open_gives(tmp_path: Path, umask: int) -> None:
    plain = tmp_path / "plain.txt"
    plain.write_text("x")
    target = tmp_path / "rank.json"
    write_rank_file(target, "{}", overwrite=False)
    assert mode(target) == mode(plain) == 0o666 & ~umask
    write_rank_file(target, "{}", overwrite=True)
    assert mode(target) == 0o666 & ~umask
    with pytest.raises(FileExistsError):
        write_rank_file(target, "{}", overwrite=False)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["plain.txt", "rank.json"]  # no temporaries


@pytest.mark.parametrize("split", [True, False])
def test_written_checkpoints_get_the_mode_open_gives(
    tmp_path: Path, checkpoint: Checkpoint, umask: int, split: bool
) -> None:
    path = write_checkpoint(checkpoint, tmp_path / "ckpt" / "stream-rank0-of-1.json", split=split)
    written = sorted((tmp_path / "ckpt").iterdir())
    assert len(written) == (2 if split else 1)
    assert {p.name: mode(p) for p in written} == {p.name: 0o666 & ~umask for p in written}
    assert read_checkpoint(path) == checkpoint


def test_resharded_checkpoints_get_the_mode_open_gives(
    tmp_path: Path, checkpoint: Checkpoint, umask: int
) -> None:
    source = write_checkpoint(checkpoint, tmp_path / "in" / "stream-rank0-of-1.json")
    outputs = reshard([source], 2, tmp_path / "out")
    written = sorted((tmp_path / "out").iterdir())
    assert set(outputs) < set(written)  # and the resolved document beside them
    assert {p.name: mode(p) for p in written} == {p.name: 0o666 & ~umask for p in written}


def test_a_saved_shard_gets_the_mode_open_gives(tmp_path: Path, umask: int) -> None:
    from o41_training_data import TrainingData

    plain = tmp_path / "plain.txt"
    plain.write_text("x")
    saver = TrainingData().dataset_saver(str(tmp_path / "run" / "data-manifest-v1.json"))
    shard = saver.save("train", None, [{"v": i} for i in range(5)], shard_id="0")
    saver.commit_manifest()
    data = tmp_path / "run" / shard.location
    assert mode(data) == mode(plain) == 0o666 & ~umask
    assert not list(data.parent.glob(".tmp-*")), "no temporary file left behind"
