"""``RankStream``: the stream one rank of an adapter reads, under the core's rules (docs/rules.md)."""

from __future__ import annotations

import pickle
from dataclasses import replace

import pytest
from o41_testkit import ShardWriter
from o41_training_data import (
    BatchStreamConfig,
    CheckpointError,
    ConfigError,
    FileSource,
    ProjectedField,
    RankStream,
    Stage,
    open_batch_stream,
)


def config_of(shard: ShardWriter, **kwargs: object) -> BatchStreamConfig:
    rows = shard("jsonl", [{"v": i} for i in range(64)])
    stage = Stage(sources=[FileSource([rows])], batch_size=4, infinite=False)
    return BatchStreamConfig(fields=[ProjectedField("v", "v", "i64")], stages=[stage], seed=5, **kwargs)  # type: ignore[arg-type]


def test_a_config_is_placed_at_the_decided_rank_and_a_conflict_is_refused(shard: ShardWriter) -> None:
    config = config_of(shard)
    source = RankStream(config, ranks=(1, 2), decided_by="the trainer")
    assert (source.rank, source.world_size, source.start) == (1, 2, None)
    assert [f.name for f in source.rules.fields] == ["v"]
    with pytest.raises(ConfigError, match="the config says rank 0 of 3, the trainer says rank 1 of 2"):
        RankStream(replace(config, world_size=3), ranks=(1, 2), decided_by="the trainer")
    with pytest.raises(ConfigError, match="source: expected a BatchStreamConfig or a Checkpoint, got str"):
        RankStream("config.json")  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="invalid training_data: expected a TrainingData, got str"):
        RankStream(config, "s3://bucket")  # type: ignore[arg-type]


def test_without_a_framework_the_environment_decides(
    shard: ShardWriter, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("RANK", "2")
    monkeypatch.setenv("WORLD_SIZE", "4")
    assert (RankStream(config_of(shard)).rank, RankStream(config_of(shard)).world_size) == (2, 4)


def test_a_checkpoint_is_accepted_for_its_own_stream_and_rank_only(shard: ShardWriter) -> None:
    config = config_of(shard)
    with open_batch_stream(replace(config, rank=1, world_size=2)) as stream:
        next(stream)
        checkpoint = stream.checkpoint()
    source = RankStream(config, ranks=(1, 2))
    accepted = source.accept(checkpoint, "dataset")
    with source.open(accepted) as resumed, open_batch_stream(replace(config, rank=1, world_size=2)) as fresh:
        next(fresh)
        assert [b.arrays()["v"].tolist() for b in resumed] == [b.arrays()["v"].tolist() for b in fresh]
    with pytest.raises(CheckpointError, match="seed is 5 in the checkpoint, 6 in the config"):
        RankStream(replace(config, seed=6), ranks=(1, 2)).accept(checkpoint, "dataset")
    with pytest.raises(CheckpointError):
        RankStream(config, ranks=(0, 2)).accept(checkpoint, "dataset")
    # Resuming a checkpoint: the stream is the checkpoint's, checked against the decided ranks.
    resuming = RankStream(checkpoint, ranks=(1, 2))
    assert resuming.start is checkpoint
    assert resuming.document() is checkpoint
    with pytest.raises(CheckpointError):
        RankStream(checkpoint, ranks=(0, 2))
    with open_batch_stream(replace(config, seed=9, rank=1, world_size=2)) as stream:
        other = stream.checkpoint()
    with pytest.raises(CheckpointError, match="another stream than this iterator reads"):
        resuming.accept(other, "iterator")


def test_the_document_is_resolved_once_and_the_source_pickles(shard: ShardWriter) -> None:
    source = RankStream(config_of(shard), ranks=(0, 1))
    document = source.document()
    assert source.document() is document
    start = source.at_start()
    assert (start.next_batch, start.rank) == (0, 0)
    with source.open() as stream:
        first = next(stream)
        assert source.checkpoint_at(first.position) == stream.checkpoint()
    copied = pickle.loads(pickle.dumps(source))
    assert (copied.rank, copied.world_size, copied.config) == (0, 1, source.config)
