"""Issue 48, case 13: a foreign ``resolved-<fingerprint>.json`` in the checkpoint directory is
not trusted: ``write_checkpoint`` checks the file byte for byte and replaces what is not its
stream's document, so the resume reads the right one."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from o41_testkit import write_shard
from o41_training_data import (
    BatchStreamConfig,
    CheckpointError,
    FileSource,
    ProjectedField,
    Stage,
    open_batch_stream,
    read_checkpoint,
    resume_batch_stream,
    write_checkpoint,
)


def taken(tmp_path: Path):  # type: ignore[no-untyped-def]
    shard = write_shard(tmp_path / "a.jsonl", "jsonl", [{"v": i} for i in range(20)])
    config = BatchStreamConfig(
        fields=[ProjectedField("v", "v", "i64")],
        stages=[Stage(sources=[FileSource([str(shard)])], batch_size=2)],
    )
    with open_batch_stream(config) as stream:
        next(stream)
        return stream.checkpoint()


@pytest.mark.parametrize("foreign", [b"{}", b"not json", b"", b'{"version": 1, "fields": []}'])
def test_a_foreign_resolved_document_is_replaced(tmp_path: Path, foreign: bytes) -> None:
    checkpoint = taken(tmp_path)
    directory = tmp_path / "ck"
    directory.mkdir()
    _, shared_name = checkpoint.to_split()
    (directory / shared_name).write_bytes(foreign)
    file = write_checkpoint(checkpoint, directory / "rank-0.json")
    assert (directory / shared_name).read_text() == checkpoint.shared_json()
    with resume_batch_stream(read_checkpoint(file)) as resumed:
        assert next(resumed).arrays()["v"].tolist() == [2, 3]


def test_the_same_document_is_left_as_it_is(tmp_path: Path) -> None:
    checkpoint = taken(tmp_path)
    directory = tmp_path / "ck"
    write_checkpoint(checkpoint, directory / "rank-0.json")
    _, shared_name = checkpoint.to_split()
    before = (directory / shared_name).stat()
    write_checkpoint(checkpoint, directory / "rank-1.json")
    after = (directory / shared_name).stat()
    assert (before.st_ino, before.st_mtime_ns) == (after.st_ino, after.st_mtime_ns)


def test_a_fifo_of_the_name_is_refused_not_waited_on(tmp_path: Path) -> None:
    checkpoint = taken(tmp_path)
    directory = tmp_path / "ck"
    directory.mkdir()
    _, shared_name = checkpoint.to_split()
    os.mkfifo(directory / shared_name)
    with pytest.raises(CheckpointError, match="not a regular file"):
        write_checkpoint(checkpoint, directory / "rank-0.json")
