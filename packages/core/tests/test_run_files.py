"""A run's checkpoint files (docs/checkpoint.md, "A run's files"): the one layout the CLI, the
Lightning sidecars and the JAX Orbax handler write and restore, driven through names and texts
so that any file system holds it."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
from o41_testkit import write_shard
from o41_training_data import (
    BatchStreamConfig,
    Checkpoint,
    CheckpointError,
    ConfigError,
    FileSource,
    ProjectedField,
    Shuffle,
    Stage,
    open_batch_stream,
    rank_file_name,
    restore_run_checkpoint,
    resume_batch_stream,
    save_run_files,
    stale_run_files,
)


def config_of(tmp_path: Path) -> BatchStreamConfig:
    files = [
        str(write_shard(tmp_path / f"p{k}.jsonl", "jsonl", [{"v": 100 * k + i} for i in range(30)]))
        for k in range(3)
    ]
    return BatchStreamConfig(
        fields=[ProjectedField("v", "v", "i64")],
        stages=[Stage(sources=[FileSource(files)], batch_size=2, shuffle=Shuffle(16), infinite=True)],
        seed=7,
        threads=1,
    )


def stops(config: BatchStreamConfig, world: int, batches: list[int]) -> list[Checkpoint]:
    out = []
    for rank, count in enumerate(batches):
        with open_batch_stream(dataclasses.replace(config, rank=rank, world_size=world)) as stream:
            for _ in range(count):
                next(stream)
            out.append(stream.checkpoint())
    return out


class Folder:
    """A file system of names and texts that counts its reads."""

    def __init__(self) -> None:
        self.files: dict[str, str] = {}
        self.reads: list[str] = []

    def write(self, name: str, text: str) -> None:
        self.files[name] = text

    def read(self, name: str) -> str:
        self.reads.append(name)
        return self.files[name]

    def restore(self, rank: int, world_size: int, own: tuple[int, int] | None = None) -> Checkpoint:
        return restore_run_checkpoint(self.files, self.read, rank, world_size, place="run", own=own)


def continuation(checkpoint: Checkpoint, batches: int = 4) -> list[list[int]]:
    with resume_batch_stream(checkpoint) as stream:
        return [next(stream).arrays()["v"].tolist() for _ in range(batches)]


def test_a_save_restores_on_its_world_and_moves_exactly_to_another(tmp_path: Path) -> None:
    config = config_of(tmp_path)
    folder = Folder()
    saved = stops(config, 3, [4, 4, 4])
    written = save_run_files({rank_file_name(r, 3): c for r, c in enumerate(saved)}, folder.write)
    # The resolved document first, once for the three ranks, then each rank's file.
    assert written[0] == f"resolved-{saved[0].fingerprint.replace(':', '-')}.json"
    assert written[1:] == [rank_file_name(r, 3) for r in range(3)]
    assert sorted(folder.files) == sorted(written)

    assert folder.restore(1, 3) == saved[1]
    assert folder.reads == [rank_file_name(1, 3), written[0]]  # on its world: that rank's file only

    folder.reads.clear()
    moved = folder.restore(1, 2)
    assert (moved.rank, moved.world_size, moved.next_batch) == (1, 2, 12)
    assert folder.reads.count(written[0]) == 1  # each resolved document parsed once
    with open_batch_stream(dataclasses.replace(config, rank=1, world_size=2)) as straight:
        for _ in range(6):
            next(straight)
        expected = [next(straight).arrays()["v"].tolist() for _ in range(4)]
    assert continuation(moved) == expected


def test_a_process_file_may_hold_another_rank_and_its_own_is_read_first(tmp_path: Path) -> None:
    # A JAX process's file is named by its process index, which need not be its rank.
    config = config_of(tmp_path)
    folder = Folder()
    saved = stops(config, 2, [3, 3])
    names = {
        rank_file_name(0, 2, naming="process"): saved[1],
        rank_file_name(1, 2, naming="process"): saved[0],
    }
    save_run_files(names, folder.write)
    restored = folder.restore(0, 2, own=(1, 2))
    assert restored == saved[0]
    assert folder.reads[0] == "process_1-of-2.json"
    folder.reads.clear()
    assert folder.restore(1, 2, own=(1, 2)) == saved[1]  # found by its contents


def test_an_inexact_or_incomplete_save_is_refused_naming_the_file(tmp_path: Path) -> None:
    config = config_of(tmp_path)
    uneven = Folder()
    save_run_files({rank_file_name(r, 2): c for r, c in enumerate(stops(config, 2, [4, 3]))}, uneven.write)
    with pytest.raises(
        CheckpointError, match=r"stream-rank0-of-2.json at global batch 8 \(stage 0\), stream-rank1"
    ):
        uneven.restore(0, 3)
    missing = Folder()
    save_run_files({rank_file_name(0, 2): stops(config, 2, [4, 4])[0]}, missing.write)
    with pytest.raises(CheckpointError, match="run lacks stream-rank1-of-2.json"):
        missing.restore(0, 2)
    with pytest.raises(CheckpointError, match="run lacks stream-rank1-of-3.json"):
        restore_run_checkpoint(
            ["stream-rank0-of-3.json", "stream-rank2-of-3.json"], missing.read, 0, 3, place="run"
        )
    with pytest.raises(CheckpointError, match="run lacks stream-rank0-of-2.json, stream-rank1-of-2.json"):
        restore_run_checkpoint([], missing.read, 0, 2, place="run", written_by=2)  # an index says 2 wrote it
    misnamed = Folder()
    save_run_files({rank_file_name(1, 2): stops(config, 2, [4, 4])[0]}, misnamed.write)
    misnamed.files[rank_file_name(0, 2)] = misnamed.files[rank_file_name(1, 2)]
    with pytest.raises(
        CheckpointError, match=r"run/stream-rank1-of-2.json: it holds rank 0 of 2, not the one"
    ):
        misnamed.restore(1, 2)
    orphan = Folder()
    save_run_files({rank_file_name(0, 1): stops(config, 1, [2])[0]}, orphan.write)
    document = next(name for name in orphan.files if name.startswith("resolved-"))
    del orphan.files[document]
    with pytest.raises(
        CheckpointError, match=rf"stream-rank0-of-1.json: it names its resolved document {document}"
    ):
        orphan.restore(0, 1)
    with pytest.raises(ConfigError, match="invalid rank"):
        orphan.restore(1, 1)


def test_an_error_reading_a_file_propagates_as_it_is(tmp_path: Path) -> None:
    folder = Folder()
    save_run_files({rank_file_name(0, 1): stops(config_of(tmp_path), 1, [2])[0]}, folder.write)

    def unreadable(name: str) -> str:
        raise PermissionError(f"no access to {name}")

    with pytest.raises(PermissionError, match="no access to stream-rank0-of-1.json"):
        restore_run_checkpoint(folder.files, unreadable, 0, 1, place="run")


def test_a_save_skips_a_document_already_there_and_names_what_it_leaves_stale(tmp_path: Path) -> None:
    config = config_of(tmp_path)
    folder = Folder()
    old = stops(config, 2, [2, 2])
    save_run_files({rank_file_name(r, 2): c for r, c in enumerate(old)}, folder.write)
    other = stops(dataclasses.replace(config, seed=8), 1, [2])[0]
    written = save_run_files(
        {rank_file_name(0, 1): other}, folder.write, holds=lambda name, text: folder.files.get(name) == text
    )
    assert len(written) == 2
    stale = stale_run_files(folder.files, 1, other.fingerprint, place="run")
    assert sorted(stale) == sorted(n for n in folder.files if n not in written)
    assert len(stale) == 3  # the old world's two rank files and its resolved document
    assert sorted(stale_run_files(folder.files, None, None, place="run")) == sorted(folder.files)
    again = save_run_files(
        {rank_file_name(0, 1): other}, folder.write, holds=lambda n, t: folder.files.get(n) == t
    )
    assert again == written  # the document is not written twice, but still listed first
