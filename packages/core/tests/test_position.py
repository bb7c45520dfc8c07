"""The public position protocol: typed positions on every batch, switch points, and resume checks."""

from __future__ import annotations

import dataclasses
import pickle
from pathlib import Path

import pytest
from o41_testkit import ShardWriter
from o41_training_data import (
    BatchStreamConfig,
    Checkpoint,
    CheckpointError,
    ConfigError,
    FileSource,
    ManifestSource,
    Position,
    ProjectedField,
    Segment,
    Shuffle,
    Stage,
    TrainingData,
    open_batch_stream,
    resolve_batch_stream_config,
    resume_batch_stream,
)

V = ProjectedField("v", "v", "i64")


def curriculum(shard: ShardWriter, **kwargs) -> BatchStreamConfig:
    easy = shard("parquet", [{"v": i} for i in range(400)], name="easy")
    hard = shard("jsonl", [{"v": 10_000 + i} for i in range(400)], name="hard")
    return BatchStreamConfig(
        fields=[V],
        stages=[
            Stage(
                sources=[FileSource(files=[easy])],
                batch_size=4,
                shuffle=Shuffle(buffer_rows=16),
                infinite=True,
            ),
            Stage(sources=[FileSource(files=[hard])], batch_size=4, infinite=True),
        ],
        seed=3,
        **kwargs,
    )


def values(stream, n: int) -> list[list[int]]:
    return [next(stream).arrays()["v"].tolist() for _ in range(n)]


def test_every_batch_carries_its_typed_position(shard: ShardWriter) -> None:
    with open_batch_stream(curriculum(shard, rank=1, world_size=2)) as stream:
        first, second = next(stream), next(stream)
        assert isinstance(first.position, Position)
        assert (first.position.rank, first.position.world_size) == (1, 2)
        assert first.position.next_batch == 2
        assert second.position.next_batch == 4
        assert (first.position.batches_yielded, first.position.rows_yielded) == (1, 4)
        assert second.position == stream.position
        assert isinstance(second.position.segment, Segment)
        assert second.position.segment.stage == 0
        assert second.position.segment.drain is None
        assert first.position.fingerprint == stream.checkpoint().fingerprint
        again = pickle.loads(pickle.dumps(first.position))
        assert again == first.position
        assert Position.from_json(first.position.to_json()) == first.position
        assert len(pickle.dumps(first.position)) < 1024  # small enough to travel with every batch
        assert stream.checkpoint(first.position) == first.checkpoint()


def test_a_checkpoint_from_a_position_resumes_after_that_batch(shard: ShardWriter) -> None:
    config = curriculum(shard)
    with open_batch_stream(config) as stream:
        batches = [next(stream) for _ in range(6)]
        reference = [b.arrays()["v"].tolist() for b in batches]
        from_checkpoint = Checkpoint.from_position(batches[2].position, stream.checkpoint())
        resolved = resolve_batch_stream_config(config)
        from_document = Checkpoint.from_position(batches[2].position, resolved)
    assert from_checkpoint == from_document == batches[2].checkpoint()
    assert from_checkpoint.position == batches[2].position
    with resume_batch_stream(from_document) as resumed:
        assert values(resumed, 3) == reference[3:6]


def test_a_position_of_another_stream_is_refused(shard: ShardWriter) -> None:
    config = curriculum(shard)
    with open_batch_stream(config) as stream:
        position = next(stream).position
    with open_batch_stream(dataclasses.replace(config, seed=4)) as other:
        next(other)
        with pytest.raises(CheckpointError, match="belongs to stream"):
            Checkpoint.from_position(position, other.checkpoint())
        with pytest.raises(CheckpointError, match="belongs to stream"):
            other.checkpoint(position)
    with pytest.raises(CheckpointError, match="malformed"):
        Position.from_json('{"rank": 0}')


def test_advance_at_a_global_batch_switches_every_share_at_the_same_batch(shard: ShardWriter) -> None:
    config = curriculum(shard)
    with open_batch_stream(config) as whole:
        reference = [
            (b.batch_index, b.stage, b.arrays()["v"].tolist()) for b in (next(whole) for _ in range(4))
        ]
        whole.advance(1, at=6)  # batches 4 and 5 are still stage 0; 6 on is stage 1
        reference += [
            (b.batch_index, b.stage, b.arrays()["v"].tolist()) for b in (next(whole) for _ in range(8))
        ]
    assert [stage for _, stage, _ in reference] == [0] * 6 + [1] * 6
    shares = []
    for offset in range(2):
        with open_batch_stream(config, share=(offset, 2)) as part:
            got = [next(part)]
            part.advance(1, at=6)  # each worker asks at a different moment, with the same switch point
            got += [next(part) for _ in range(5)]
            shares.append([(b.batch_index, b.stage, b.arrays()["v"].tolist()) for b in got])
    merged = sorted(shares[0] + shares[1])
    assert merged == reference


def test_advance_at_refuses_a_switch_point_in_the_past(shard: ShardWriter) -> None:
    with open_batch_stream(curriculum(shard)) as stream:
        values(stream, 5)
        with pytest.raises(ConfigError, match="already delivered"):
            stream.advance(1, at=2)
    with open_batch_stream(curriculum(shard)) as first:
        values(first, 3)
        checkpoint = first.checkpoint()
    with (
        resume_batch_stream(checkpoint) as resumed,
        pytest.raises(ConfigError, match="before this stream's first"),
    ):
        resumed.advance(1, at=1)


def test_a_world_of_ranks_switches_at_the_round_of_at(shard: ShardWriter) -> None:
    config = curriculum(shard)
    with open_batch_stream(config) as whole:
        head = [next(whole) for _ in range(2)]
        whole.advance(1, at=6)
        reference = {
            b.batch_index: (b.stage, b.arrays()["v"].tolist())
            for b in head + [next(whole) for _ in range(12)]
        }
    for rank in range(3):
        with open_batch_stream(dataclasses.replace(config, rank=rank, world_size=3)) as stream:
            stream.advance(1, at=5)  # rounds of 3 start at 0, 3, 6: the first at or after 5 is 6
            for batch in (next(stream) for _ in range(4)):
                assert (batch.stage, batch.arrays()["v"].tolist()) == reference[batch.batch_index]


# -- Checkpoint.check and resume_batch_stream compare a config part by part, without reading shards.


@pytest.fixture
def taken(shard: ShardWriter) -> tuple[BatchStreamConfig, Checkpoint]:
    config = curriculum(shard)
    with open_batch_stream(config) as stream:
        next(stream)
        return config, stream.checkpoint()


def with_stage(config: BatchStreamConfig, index: int, **changes) -> BatchStreamConfig:
    stages = list(config.stages)
    stages[index] = dataclasses.replace(stages[index], **changes)
    return dataclasses.replace(config, stages=stages)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda c: dataclasses.replace(c, seed=9), r"seed is 3 in the checkpoint, 9 in the config"),
        (
            lambda c: dataclasses.replace(c, fields=[ProjectedField("v", "v", "i32")]),
            r"fields\[0\] is .*i64.* in the checkpoint, .*i32.* in the config",
        ),
        (
            lambda c: dataclasses.replace(c, stages=c.stages[:1]),
            r"the number of stages is 2 in the checkpoint, 1 in the config",
        ),
        (lambda c: with_stage(c, 1, batch_size=8), r"stages\[1\]\.batch_size is 4 in the checkpoint, 8"),
        (lambda c: with_stage(c, 0, shuffle=Shuffle(buffer_rows=32)), r"stages\[0\]\.shuffle is"),
        (lambda c: with_stage(c, 1, infinite=False), r"stages\[1\]\.infinite is true in the checkpoint"),
        (
            lambda c: with_stage(c, 0, sources=[dataclasses.replace(c.stages[0].sources[0], weight=2.0)]),
            r"stages\[0\]\.sources\[0\]\.weight is 1\.0 in the checkpoint, 2\.0 in the config",
        ),
        (
            lambda c: with_stage(
                c, 1, sources=[FileSource(files=[*c.stages[1].sources[0].files, "more.jsonl"])]
            ),
            r"stages\[1\]\.sources\[0\]: the file list changed: the checkpoint read 1 files, "
            r"the config lists 2",
        ),
        (
            lambda c: with_stage(c, 1, sources=[FileSource(files=["/elsewhere/hard.jsonl"])]),
            r"files\[0\] is /elsewhere/hard\.jsonl in the config",
        ),
        (
            lambda c: with_stage(
                c, 1, sources=[FileSource(files=c.stages[1].sources[0].files, encoding="msgpack")]
            ),
            r"files\[0\] is read as msgpack in the config, as jsonl in the checkpoint",
        ),
        (
            lambda c: with_stage(c, 1, sources=[ManifestSource(manifest_uri="m.json", split="train")]),
            r"stages\[1\]\.sources\[0\] read a file list in the checkpoint; the config names a manifest",
        ),
    ],
)
def test_a_config_that_differs_is_refused_naming_the_part(taken, change, message: str) -> None:
    config, checkpoint = taken
    checkpoint.check(config=config)  # the config it was taken from passes
    with pytest.raises(CheckpointError, match=message):
        checkpoint.check(config=change(config))
    with pytest.raises(CheckpointError, match=message):
        resume_batch_stream(checkpoint, config=change(config))


def test_checks_read_no_shard(taken) -> None:
    config, checkpoint = taken
    for stage in config.stages:
        for path in stage.sources[0].files:
            Path(path).unlink()
    checkpoint.check(config=config, rank=0, world_size=1)  # nothing to open: it reads no file


def test_rank_and_world_size_are_checked_by_the_engine(taken) -> None:
    config, checkpoint = taken
    with pytest.raises(CheckpointError, match="belongs to rank 0 of 1, this process is rank 0 of 2"):
        checkpoint.check(world_size=2)
    with pytest.raises(CheckpointError, match="belongs to rank 0 of 1, this process is rank 1 of 1"):
        resume_batch_stream(checkpoint, rank=1)
    moved = checkpoint.for_world(1, 2)
    moved.check(rank=1, world_size=2)
    resume_batch_stream(moved, rank=1, world_size=2, config=config).close()


def test_a_manifest_selection_is_compared_not_re_read(tmp_path: Path) -> None:
    saver = TrainingData().dataset_saver(tmp_path / "data" / "data-manifest-v1.json")
    for stage in ("easy", "hard"):
        saver.save("train", stage, [{"v": i} for i in range(40)], shard_id=stage)
    saver.commit_manifest()
    manifest = str(tmp_path / "data" / "data-manifest-v1.json")
    source = ManifestSource(manifest_uri=manifest, split="train", curriculum_stages=["easy"])
    config = BatchStreamConfig(fields=[V], stages=[Stage(sources=[source], batch_size=4)])
    with open_batch_stream(config) as stream:
        next(stream)
        checkpoint = stream.checkpoint()
    Path(manifest).unlink()  # a check needs no manifest: the checkpoint pins the selection
    checkpoint.check(config=config)
    other = dataclasses.replace(source, curriculum_stages=["hard"])
    with pytest.raises(CheckpointError, match=r"stages\[0\]\.sources\[0\] selects .*hard.* in the config"):
        checkpoint.check(config=dataclasses.replace(config, stages=[Stage(sources=[other], batch_size=4)]))


def test_a_checkpoint_is_its_position_with_the_resolved_config(shard: ShardWriter) -> None:
    with open_batch_stream(curriculum(shard, rank=1, world_size=2)) as stream:
        values(stream, 3)
        checkpoint = stream.checkpoint()
    assert isinstance(checkpoint, Position)
    # One declaration of each getter: the checkpoint reads them from its Position base.
    for getter in ("fingerprint", "rank", "world_size", "stage", "segment", "next_batch", "epochs"):
        assert getter not in vars(Checkpoint), getter
        assert getattr(checkpoint, getter) == getattr(checkpoint.position, getter)
    assert type(checkpoint.position) is Position
    assert checkpoint.position == Position.from_json(checkpoint.position.to_json())
    moved = checkpoint.for_world(0, 4)
    assert (moved.rank, moved.world_size) == (0, 4)
    assert (moved.position.rank, moved.position.world_size) == (0, 4)
    assert moved.resolved_config()["world_size"] == 4
    again = Checkpoint.from_json(moved.to_json())
    assert again == moved
    assert (again.rank, again.world_size, again.next_batch) == (0, 4, checkpoint.next_batch)
    assert pickle.loads(pickle.dumps(again)) == again
