"""A local shard is pinned by its content, not its timestamps (docs/checkpoint.md, "Local shards").

The spec's scenario: a job copies its shards to local disk before each run. A plain copy (new
inode, new times, same bytes) resumes exactly; changed bytes are refused naming the file, even
when the rewrite keeps the size, the modification time and the inode.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest
from o41_testkit import SUFFIX, copy_without_times, write_shard
from o41_testkit.corpora import token_config, token_corpus, write_megatron_plain
from o41_training_data import (
    BatchStreamConfig,
    Checkpoint,
    CheckpointError,
    FileSource,
    Packing,
    ProjectedField,
    Stage,
    open_batch_stream,
    resume_batch_stream,
)

V = ProjectedField("v", "v", "i64")


@pytest.fixture(autouse=True)
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    directory = tmp_path / "inspect-cache"
    monkeypatch.setenv("O41_INSPECT_CACHE", str(directory))
    return directory


def records(base: int, rows: int = 400) -> list[dict[str, int]]:
    # Values of one width, so a rewrite with other values keeps the size of a JSON Lines shard.
    return [{"v": base + i} for i in range(rows)]


def config_of(path: Path | str, encoding: str) -> BatchStreamConfig:
    return BatchStreamConfig(
        fields=[V],
        stages=[
            Stage(sources=[FileSource(files=[str(path)], encoding=encoding)], batch_size=10, infinite=True)
        ],
        seed=3,
        threads=1,
    )


def values(stream, count: int) -> list[list[int]]:
    return [next(stream).arrays()["v"].tolist() for _ in range(count)]


def checkpoint_and_rest(config: BatchStreamConfig) -> tuple[Checkpoint, list[list[int]]]:
    with open_batch_stream(config) as stream:
        values(stream, 3)
        checkpoint = stream.checkpoint()
        return checkpoint, values(stream, 4)


def pinned_versions(checkpoint: Checkpoint) -> list[str]:
    document = json.loads(checkpoint.to_json())
    stages = document["resolved"]["stages"]
    return [shard["version"] for stage in stages for source in stage["sources"] for shard in source["shards"]]


@pytest.mark.parametrize("encoding", ["parquet", "jsonl", "jsonl.gz", "msgpack"])
def test_a_plain_copy_of_a_local_shard_resumes_exactly(tmp_path: Path, encoding: str) -> None:
    path = write_shard(tmp_path / f"data{SUFFIX[encoding]}", encoding, records(100_000))
    checkpoint, rest = checkpoint_and_rest(config_of(path, encoding))
    kind = "parquet-footer" if encoding == "parquet" else "highway128"
    assert [v.split(":")[:2] for v in pinned_versions(checkpoint)] == [["content", kind]]
    copy_without_times(path)
    with resume_batch_stream(checkpoint) as resumed:
        assert values(resumed, 4) == rest


@pytest.mark.parametrize("encoding", ["parquet", "jsonl", "jsonl.gz", "msgpack"])
def test_a_copy_with_other_bytes_is_refused_naming_the_file(tmp_path: Path, encoding: str) -> None:
    path = write_shard(tmp_path / f"data{SUFFIX[encoding]}", encoding, records(100_000))
    checkpoint, _ = checkpoint_and_rest(config_of(path, encoding))
    # Other values of the same width: the same size where the format allows it.
    other = write_shard(tmp_path / f"other{SUFFIX[encoding]}", encoding, records(200_000))
    same_size = other.stat().st_size == path.stat().st_size
    other.replace(path)
    message = "changed since the checkpoint was taken" if same_size else r"is \d+ bytes, but the checkpoint"
    with pytest.raises(CheckpointError, match=rf"{path.name} {message}") as info:
        resume_batch_stream(checkpoint)
    assert ("content:" in str(info.value)) == same_size
    assert "cp -p" not in str(info.value)
    assert "modification time" not in str(info.value)


@pytest.mark.parametrize("rows", [400, 8_000], ids=["hashed-each-open", "kept-in-the-cache"])
def test_a_rewrite_keeping_size_times_and_inode_is_refused(tmp_path: Path, cache: Path, rows: int) -> None:
    path = write_shard(tmp_path / "data.jsonl", "jsonl", records(100_000, rows))
    before = path.stat()
    checkpoint, _ = checkpoint_and_rest(config_of(path, "jsonl"))
    # A file of more than 64 KiB keeps its identity in the inspection cache; a smaller one is
    # hashed at each open, which costs less than a cache file.
    assert any(cache.glob("*/*.content")) == (before.st_size > 64 << 10)
    with path.open("r+") as out:  # in place: the same inode
        out.write("".join(json.dumps(r) + "\n" for r in records(500_000, rows)))
    os.utime(path, ns=(before.st_atime_ns, before.st_mtime_ns))
    after = path.stat()
    kept = (before.st_size, before.st_mtime_ns, before.st_ino)
    assert (after.st_size, after.st_mtime_ns, after.st_ino) == kept
    with pytest.raises(CheckpointError, match=r"data\.jsonl changed since the checkpoint was taken"):
        resume_batch_stream(checkpoint)


def test_identities_agree_across_copies_and_without_the_cache(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    first = write_shard(tmp_path / "a.parquet", "parquet", records(7))
    second = tmp_path / "b" / "a.parquet"
    second.parent.mkdir()
    shutil.copyfile(first, second)
    cached, _ = checkpoint_and_rest(config_of(first, "parquet"))
    monkeypatch.setenv("O41_INSPECT_CACHE", "off")
    uncached, _ = checkpoint_and_rest(config_of(second, "parquet"))
    assert pinned_versions(cached) == pinned_versions(uncached)
    # Another footer (other values) is another identity.
    write_shard(second, "parquet", records(8))
    assert pinned_versions(checkpoint_and_rest(config_of(second, "parquet"))[0]) != pinned_versions(cached)


def test_a_token_stage_over_a_copied_megatron_dataset_resumes(tmp_path: Path) -> None:
    docs = token_corpus([5, 9, 3, 12, 7, 4, 8, 6] * 8)
    (tmp_path / "corpus").mkdir()
    idx = write_megatron_plain(tmp_path / "corpus" / "data", docs)
    packing = Packing(field="tokens", seq_len=8)
    config = token_config(FileSource(files=[str(idx)]), packing=packing, infinite=True)
    with open_batch_stream(config) as stream:
        next(stream)
        checkpoint = stream.checkpoint()
        rest = [next(stream).arrays()["tokens"].tolist() for _ in range(3)]
    assert [v.split(":")[1] for v in pinned_versions(checkpoint)] == ["megatron-idx"]
    for path in (idx, idx.with_suffix(".bin")):
        copy_without_times(path)
    with resume_batch_stream(checkpoint) as resumed:
        assert [next(resumed).arrays()["tokens"].tolist() for _ in range(3)] == rest


SAMPLED_BYTES = 2 * (64 << 10) + 64 * (4 << 10)


def test_a_large_shard_is_identified_by_samples_not_a_whole_read(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A file of a format without a footer of its own, over 1 MiB, is pinned by its size, its
    # ends and 64 runs between them (384 KiB whatever its size), so a cold node does not read
    # the whole corpus once more before its first batch.
    monkeypatch.setenv("O41_INSPECT_CACHE", "off")
    path = write_shard(tmp_path / "data.jsonl", "jsonl", records(100_000, 80_000))
    size = path.stat().st_size
    assert size > 1 << 20
    with open_batch_stream(config_of(path, "jsonl")) as stream:
        next(stream)
        checkpoint = stream.checkpoint()
        # Open counts the file's lines (every byte once) and samples it for its identity.
        assert stream.stats.open.bytes_read == size + SAMPLED_BYTES
    assert [v.split(":")[1] for v in pinned_versions(checkpoint)] == ["highway128-sampled"]
    copy_without_times(path)
    resume_batch_stream(checkpoint).close()


def test_a_same_size_rewrite_of_a_sampled_shard_is_refused(tmp_path: Path) -> None:
    path = write_shard(tmp_path / "data.jsonl", "jsonl", records(100_000, 80_000))
    checkpoint, _ = checkpoint_and_rest(config_of(path, "jsonl"))
    before = path.stat()
    # Every record rewritten with values of the same width: every sampled run differs.
    with path.open("r+") as out:
        out.write("".join(json.dumps(r) + "\n" for r in records(500_000, 80_000)))
    assert path.stat().st_size == before.st_size
    with pytest.raises(CheckpointError, match=r"data\.jsonl changed since the checkpoint was taken"):
        resume_batch_stream(checkpoint)
