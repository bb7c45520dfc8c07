"""Issue 48, case 11: ``trace_batches`` arguments past what the engine counts are refused with a
:class:`ConfigError` naming them, never an ``OverflowError``."""

from __future__ import annotations

from pathlib import Path

import pytest
from o41_testkit import write_shard
from o41_training_data import (
    LIMITS,
    BatchStreamConfig,
    ConfigError,
    FileSource,
    ProjectedField,
    Stage,
    trace_batches,
)


@pytest.fixture
def config(tmp_path: Path) -> BatchStreamConfig:
    shard = write_shard(tmp_path / "a.jsonl", "jsonl", [{"v": i} for i in range(10)])
    return BatchStreamConfig(
        fields=[ProjectedField("v", "v", "i64")],
        stages=[Stage(sources=[FileSource([str(shard)])], batch_size=1, infinite=True)],
    )


@pytest.mark.parametrize("batches", [2**64, 2**64 - 1, 2**70, range(2**63, 2**64), range(0, 2**64 + 5)])
def test_a_batch_no_stream_reaches_is_a_config_error(config: BatchStreamConfig, batches: int | range) -> None:
    with pytest.raises(ConfigError, match="invalid global_batches.*no stream reaches"):
        trace_batches(config, batches)


@pytest.mark.parametrize("world_size", [-1, 0, 2**64, LIMITS["max_world_size"] + 1, 2.0, True])
def test_a_world_size_out_of_range_is_a_config_error(config: BatchStreamConfig, world_size: object) -> None:
    with pytest.raises(ConfigError, match="invalid world_size"):
        trace_batches(config, 1, world_size=world_size)  # type: ignore[arg-type]


def test_the_last_reachable_batch_traces(config: BatchStreamConfig) -> None:
    [row] = trace_batches(config, LIMITS["max_position"] - 1)
    assert row.global_batch == LIMITS["max_position"] - 1
