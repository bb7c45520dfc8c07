"""The split checkpoint form, version 2 (docs/checkpoint.md): a rank's file holds its position
and names the run's resolved document, written once beside it."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
from o41_testkit import write_shard
from o41_training_data import (
    BatchStreamConfig,
    Checkpoint,
    CheckpointError,
    FileSource,
    ManifestSource,
    ProjectedField,
    Shuffle,
    Stage,
    open_batch_stream,
    rank_file_name,
    read_checkpoint,
    resume_batch_stream,
    write_checkpoint,
)
from o41_training_data._cli import main

V = ProjectedField("v", "v", "i64")


def config_of(tmp_path: Path, world_size: int = 2, shards: int = 40) -> BatchStreamConfig:
    tmp_path.mkdir(parents=True, exist_ok=True)
    files = [
        str(write_shard(tmp_path / f"part-{k:03d}.jsonl", "jsonl", [{"v": 100 * k + i} for i in range(20)]))
        for k in range(shards)
    ]
    return BatchStreamConfig(
        fields=[V],
        stages=[Stage(sources=[FileSource(files)], batch_size=4, shuffle=Shuffle(32), infinite=True)],
        seed=3,
        threads=1,
        world_size=world_size,
    )


def checkpoints_after(config: BatchStreamConfig, batches: int) -> list[tuple[Checkpoint, list[list[int]]]]:
    out = []
    for rank in range(config.world_size):
        with open_batch_stream(dataclasses.replace(config, rank=rank)) as stream:
            for _ in range(batches):
                next(stream)
            checkpoint = stream.checkpoint()
            out.append((checkpoint, [next(stream).arrays()["v"].tolist() for _ in range(3)]))
    return out


def test_every_rank_writes_a_small_file_and_the_document_is_written_once(tmp_path: Path) -> None:
    config = config_of(tmp_path / "data")
    directory = tmp_path / "ckpt"
    taken = checkpoints_after(config, 5)
    for rank, (checkpoint, _) in enumerate(taken):
        write_checkpoint(checkpoint, directory / rank_file_name(rank, 2))
    (shared,) = directory.glob("resolved-*.json")
    first = shared.stat()
    # Every rank would have written the same bytes: the document says nothing rank-specific.
    assert taken[0][0].shared_json() == taken[1][0].shared_json() == shared.read_text()
    # A later checkpoint of the same run finds the document and writes its own file only.
    write_checkpoint(taken[0][0], directory / "again.json")
    assert (shared.stat().st_ino, shared.stat().st_mtime_ns) == (first.st_ino, first.st_mtime_ns)
    self_contained = len(taken[0][0].to_json())
    for rank, (checkpoint, rest) in enumerate(taken):
        path = directory / rank_file_name(rank, 2)
        assert path.stat().st_size < 1024 < self_contained
        document = json.loads(path.read_text())
        assert (document["version"], document["resolved"], document["rank"]) == (2, shared.name, rank)
        loaded = read_checkpoint(path)
        assert loaded == checkpoint
        with resume_batch_stream(loaded) as resumed:
            assert [next(resumed).arrays()["v"].tolist() for _ in range(3)] == rest
    # The self-contained form is still written on request and read.
    write_checkpoint(taken[1][0], tmp_path / "one.json", split=False)
    assert read_checkpoint(tmp_path / "one.json") == taken[1][0]
    assert json.loads((tmp_path / "one.json").read_text())["version"] == 1


def test_a_rank_file_without_its_document_or_with_another_is_refused_by_name(tmp_path: Path) -> None:
    config = config_of(tmp_path / "data", shards=3)
    (checkpoint, _), (other, _) = checkpoints_after(config, 2)
    path = write_checkpoint(checkpoint, tmp_path / "ckpt" / "rank0.json")
    (shared,) = path.parent.glob("resolved-*.json")
    with pytest.raises(CheckpointError, match="a rank file of the split form"):
        Checkpoint.from_json(path.read_text())
    text = shared.read_text()
    document = json.loads(text)
    document["stages"][0]["sources"][0]["shards"][0]["rows"] += 1
    shared.write_text(json.dumps(document))
    with pytest.raises(CheckpointError, match=rf"rank0\.json: .*{shared.name} holds stream fnv1a64:\w+, but"):
        read_checkpoint(path)
    shared.unlink()
    with pytest.raises(CheckpointError, match=rf"rank0\.json: it names its resolved document {shared.name}"):
        read_checkpoint(path)
    shared.write_text(text)
    assert read_checkpoint(path) == checkpoint
    for forged in ("../resolved-x.json", "/etc/passwd", 7):
        rank = json.loads(path.read_text())
        rank["resolved"] = forged
        path.write_text(json.dumps(rank))
        with pytest.raises(CheckpointError, match="not the name of a resolved document"):
            read_checkpoint(path)
    assert other.fingerprint == checkpoint.fingerprint


def test_a_manifest_republished_after_the_checkpoint_changes_nothing(tmp_path: Path) -> None:
    data = tmp_path / "data"
    data.mkdir()
    entries = []
    for k in range(3):
        path = write_shard(data / f"m-{k}.jsonl", "jsonl", [{"v": 100 * k + i} for i in range(30)])
        entries.append(
            {"location": path.name, "rows": 30, "bytes": path.stat().st_size, "checksum": "none:0"}
        )
    manifest = data / "data-manifest-v1.json"

    def publish(shards: list[dict[str, object]]) -> None:
        document = {"format": "o41-data-manifest", "version": 1, "data_format": "jsonl"}
        manifest.write_text(json.dumps({**document, "splits": {"train": {"shards": shards}}}))

    publish(entries)
    config = BatchStreamConfig(
        fields=[V],
        stages=[Stage(sources=[ManifestSource(str(manifest), "train")], batch_size=4, infinite=True)],
    )
    with open_batch_stream(config) as stream:
        next(stream)
        path = write_checkpoint(stream.checkpoint(), tmp_path / "ckpt" / "rank0.json")
        rest = [next(stream).arrays()["v"].tolist() for _ in range(30)]
    publish(entries[:1])  # the next version of the dataset lists one shard
    with resume_batch_stream(read_checkpoint(path)) as resumed:
        assert [next(resumed).arrays()["v"].tolist() for _ in range(30)] == rest


def test_reshard_writes_the_split_form_and_show_reads_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = config_of(tmp_path / "data", shards=3)
    taken = checkpoints_after(config, 4)
    inputs = [write_checkpoint(c, tmp_path / "in" / rank_file_name(r, 2)) for r, (c, _) in enumerate(taken)]
    out = tmp_path / "out"
    assert (
        main(["checkpoint", "reshard", *map(str, inputs), "--world-size", "4", "--output-dir", str(out)]) == 0
    )
    assert len(list(out.glob("resolved-*.json"))) == 1
    moved = [read_checkpoint(out / rank_file_name(r, 4)) for r in range(4)]
    assert [(c.rank, c.world_size, c.next_batch) for c in moved] == [(r, 4, 8) for r in range(4)]
    capsys.readouterr()
    assert main(["checkpoint", "show", str(out / rank_file_name(2, 4))]) == 0
    assert "2 / 4" in capsys.readouterr().out
