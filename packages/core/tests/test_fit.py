"""How a list field fits its first axis: ``overflow="error"`` and ``pad_side="left"``, in every format."""

from __future__ import annotations

from typing import Any

import pytest
from o41_testkit import ShardWriter, collect, config_for
from o41_training_data import (
    BatchStreamConfig,
    ConfigError,
    FileSource,
    Packing,
    ProjectedField,
    ProjectionError,
    Stage,
    open_batch_stream,
    resume_batch_stream,
)
from o41_training_data.testing import assert_resumable

PROMPTS = [[1, 2], [3, 4, 5, 6], [], [7], [8, 9, 10]]


def records() -> list[dict[str, Any]]:
    return [{"id": k, "prompt": p, "same": p, "pairs": [[v, -v] for v in p]} for k, p in enumerate(PROMPTS)]


def rows(config: BatchStreamConfig, name: str) -> list[list[Any]]:
    return [row.tolist() for batch in collect(config) for row in batch[name]]


def test_left_padding_ends_each_row_with_its_last_value(shard: ShardWriter, encoding: str) -> None:
    path = shard(encoding, records())
    fields = [
        ProjectedField("prompt", "prompt", "i32", length=4, pad=-1, pad_side="left"),
        ProjectedField("right", "same", "i32", length=4, pad=-1),
        # A nested field pads its first axis on the left; the inner axis stays as it is.
        ProjectedField("pairs", "pairs", "i64", shape=(3, 2), pad=0, pad_side="left"),
    ]
    config = config_for([FileSource([path])], fields, batch_size=5)
    assert rows(config, "prompt") == [
        [-1, -1, 1, 2],
        [3, 4, 5, 6],
        [-1, -1, -1, -1],
        [-1, -1, -1, 7],
        [-1, 8, 9, 10],
    ]
    assert rows(config, "right") == [
        [1, 2, -1, -1],
        [3, 4, 5, 6],
        [-1, -1, -1, -1],
        [7, -1, -1, -1],
        [8, 9, 10, -1],
    ]
    assert rows(config, "pairs")[0] == [[0, 0], [1, -1], [2, -2]]
    assert rows(config, "pairs")[1] == [[3, -3], [4, -4], [5, -5]]  # the first three kept


def test_overflow_error_names_the_shard_row_and_field(shard: ShardWriter, encoding: str) -> None:
    path = shard(encoding, records())
    fitting = ProjectedField("prompt", "prompt", "i32", length=4, overflow="error")
    assert len(rows(config_for([FileSource([path])], [fitting], batch_size=5), "prompt")) == 5
    strict = ProjectedField("prompt", "prompt", "i32", length=3, overflow="error")
    with pytest.raises(ProjectionError, match=r"a list of 4 values, longer than the field's 3") as info:
        rows(config_for([FileSource([path])], [strict], batch_size=5), "prompt")
    assert info.value.row == 1
    assert info.value.field == "prompt"
    assert info.value.path == path


def test_the_options_travel_in_checkpoints_and_keep_old_fingerprints(shard: ShardWriter) -> None:
    path = shard("jsonl", records() * 4)
    plain = config_for(
        [FileSource([path])], [ProjectedField("prompt", "prompt", "i32", length=4)], batch_size=2
    )
    left = config_for(
        [FileSource([path])],
        [ProjectedField("prompt", "prompt", "i32", length=4, pad_side="left", overflow="error")],
        batch_size=2,
    )
    with open_batch_stream(plain) as a, open_batch_stream(left) as b:
        assert a.checkpoint().fingerprint != b.checkpoint().fingerprint
        resolved = a.resolved_config()
    assert "pad_side" not in resolved["fields"][0]
    assert "overflow" not in resolved["fields"][0]
    assert_resumable(left, batches=6)
    with open_batch_stream(left) as stream:
        next(stream)
        checkpoint = stream.checkpoint()
    with resume_batch_stream(checkpoint) as resumed:
        # Records 2 (empty) and 3 ([7]), as the uninterrupted stream has them.
        assert next(resumed).arrays()["prompt"].tolist() == [[0, 0, 0, 0], [0, 0, 0, 7]]
    # From a config file too.
    document = left.to_dict()
    assert BatchStreamConfig.from_dict(document).fields[0].pad_side == "left"


def test_the_options_are_checked(shard: ShardWriter) -> None:
    with pytest.raises(ConfigError, match="pad_side"):
        ProjectedField("p", "p", "i32", length=2, pad_side="middle")  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="overflow"):
        ProjectedField("p", "p", "i32", length=2, overflow="drop")  # type: ignore[arg-type]
    path = shard("jsonl", records())
    scalar = ProjectedField("id", "id", "i64", overflow="error")
    with pytest.raises(ConfigError, match=r"overflow applies to a list field"):
        open_batch_stream(config_for([FileSource([path])], [scalar]))
    tokens = shard("parquet", [{"tokens": [1, 2, 3]}])
    packed = BatchStreamConfig(
        fields=[ProjectedField("tokens", "tokens", "i32", length=8, pad_side="left")],
        stages=[Stage(sources=[FileSource([tokens])], batch_size=1, packing=Packing("tokens", 8))],
    )
    with pytest.raises(ConfigError, match="token windows, which place and pad it themselves"):
        open_batch_stream(packed)
