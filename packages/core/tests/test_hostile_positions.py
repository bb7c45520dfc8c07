"""Positions and arguments that would replay or skip batches are refused, naming the field or
argument: rank and world size beyond 2^32, checkpoints whose fields contradict each other, and
negative or mistyped arguments to the position API."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest
from o41_testkit import ShardWriter
from o41_training_data import (
    BatchStreamConfig,
    Checkpoint,
    CheckpointError,
    ConfigError,
    FileSource,
    Position,
    ProjectedField,
    Stage,
    open_batch_stream,
    resume_batch_stream,
)
from o41_training_data._cli import main


@pytest.fixture
def checkpoint(shard: ShardWriter) -> Checkpoint:
    path = shard("jsonl", [{"v": i} for i in range(64)])
    config = BatchStreamConfig(
        fields=[ProjectedField("v", "v", "i64")],
        stages=[
            Stage(sources=[FileSource([path])], batch_size=4),
            Stage(sources=[FileSource([path])], batch_size=4),
        ],
        world_size=2,
    )
    with open_batch_stream(replace(config, rank=1)) as stream:
        next(stream)
        next(stream)
        return stream.checkpoint()


def altered(checkpoint: Checkpoint, change: dict[str, object]) -> str:
    document = json.loads(checkpoint.to_json())
    for key, value in change.items():
        target = document
        *parents, last = key.split(".")
        for parent in parents:
            target = target[parent]
        target[last] = value
    return json.dumps(document)


def test_rank_and_world_size_are_bounded_everywhere(checkpoint: Checkpoint) -> None:
    with pytest.raises(ConfigError, match=f"invalid world_size: must be between 1 and {2**32}"):
        checkpoint.for_world(2**64 - 2, 2**64 - 1)
    for change in ({"resolved.world_size": 2**64 - 1}, {"resolved.rank": 2**64 - 2}):
        with pytest.raises(CheckpointError, match="its resolved config is invalid"):
            Checkpoint.from_json(altered(checkpoint, change))


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"stage": 5}, "its stage is 5 but its cursor is in stage 0"),
        ({"stage": 5, "cursor.segment.stage": 5}, "its stage 5 is not one of the stream's 2 stages"),
        ({"epochs": [2**64 - 1]}, "its epochs is 18446744073709551615, beyond what a stream reaches"),
        ({"epochs": [0, 0]}, "its epochs list 2 sources, but stage 0 has 1"),
        ({"batches_yielded": 2**40}, "its batches_yielded 1099511627776 exceeds the global batches"),
        ({"cursor.segment.start_batch": 100}, "before its segment's start_batch 100"),
        ({"resolved.version": 2}, "its resolved config is version 2; this release reads version 1"),
    ],
)
def test_a_checkpoint_whose_fields_contradict_each_other_is_refused_naming_them(
    checkpoint: Checkpoint,
    change: dict[str, object],
    message: str,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    text = altered(checkpoint, change)
    with pytest.raises(CheckpointError, match=message):
        Checkpoint.from_json(text)
    (tmp_path / "ckpt.json").write_text(text)
    assert main(["checkpoint", "show", str(tmp_path / "ckpt.json")]) == 3
    assert message.split(" ")[1] in capsys.readouterr().err


def test_a_position_whose_fields_contradict_each_other_is_refused(checkpoint: Checkpoint) -> None:
    document = json.loads(checkpoint.position.to_json())
    document["stage"] = 1
    with pytest.raises(CheckpointError, match="its stage is 1 but its cursor is in stage 0"):
        Position.from_json(json.dumps(document))


def test_mistyped_or_negative_arguments_are_config_errors_naming_them(checkpoint: Checkpoint) -> None:
    for rank, world, name in [
        (-1, 2, "rank"),
        (0, "2", "world_size"),
        (True, 2, "rank"),
        (0, 2.0, "world_size"),
    ]:
        with pytest.raises(ConfigError, match=f"invalid {name}: expected a whole number >= 0"):
            checkpoint.for_world(rank, world)  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="invalid rank: expected a whole number >= 0, got -1"):
        checkpoint.check(rank=-1)
    for share in [(0, 0), (5, 2), (-1, 2), (0,), "0,1"]:
        with pytest.raises(ConfigError, match="invalid share"):
            resume_batch_stream(checkpoint, share=share)  # type: ignore[arg-type]
    with resume_batch_stream(checkpoint) as stream:
        for stage, at, name in [(-1, None, "stage"), ("1", None, "stage"), (1, -5, "at"), (1, 2**64, "at")]:
            with pytest.raises(ConfigError, match=f"invalid {name}: expected a whole number >= 0"):
                stream.advance(stage, at=at)  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="invalid rank: expected a whole number >= 0"):
        resume_batch_stream(checkpoint, rank=-1, world_size=2)
