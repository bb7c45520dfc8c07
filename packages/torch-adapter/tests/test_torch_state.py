"""The dataset's load_state_dict refuses what it cannot continue exactly: another stream's state,
a tampered share of the rank's batches, and malformed states, each as a CheckpointError."""

from __future__ import annotations

import json
from typing import Any

import pytest
from o41_testkit import ShardWriter, copy_without_times
from o41_training_data import (
    BatchStreamConfig,
    Checkpoint,
    CheckpointError,
    FileSource,
    ProjectedField,
    Stage,
    open_batch_stream,
)
from o41_training_data_torch import O41IterableDataset


def config_of(shard: ShardWriter, seed: int = 1) -> BatchStreamConfig:
    path = shard("jsonl", [{"v": i} for i in range(64)])
    return BatchStreamConfig(
        fields=[ProjectedField("v", "v", "i64")],
        stages=[Stage(sources=[FileSource([path])], batch_size=4, infinite=True)],
        seed=seed,
    )


def state_after(dataset: O41IterableDataset, batches: int) -> dict[str, Any]:
    iterator = iter(dataset)
    for _ in range(batches):
        next(iterator)
    return dataset.state_dict()


def test_a_state_continues_exactly(shard: ShardWriter) -> None:
    config = config_of(shard)
    state = state_after(O41IterableDataset(config), 3)
    uninterrupted = [
        b["v"].tolist() for _, b in zip(range(6), iter(O41IterableDataset(config)), strict=False)
    ]
    expected = uninterrupted[3:]
    resumed = O41IterableDataset(config)
    resumed.load_state_dict(state)
    assert [b["v"].tolist() for _, b in zip(range(3), iter(resumed), strict=False)] == expected


def test_a_state_resumes_over_shards_copied_without_their_times(shard: ShardWriter) -> None:
    config = config_of(shard)
    state = state_after(O41IterableDataset(config), 3)
    expected = [b["v"].tolist() for _, b in zip(range(6), iter(O41IterableDataset(config)), strict=False)][3:]
    for stage in config.stages:
        for source in stage.sources:
            for path in source.files:
                copy_without_times(path)
    resumed = O41IterableDataset(config)
    resumed.load_state_dict(state)
    assert [b["v"].tolist() for _, b in zip(range(3), iter(resumed), strict=False)] == expected


def test_a_config_that_adds_skipped_batches_resumes_the_state_without_them(shard: ShardWriter) -> None:
    import dataclasses

    config = config_of(shard)
    state = state_after(O41IterableDataset(config), 3)
    straight = [b["v"].tolist() for _, b in zip(range(10), iter(O41IterableDataset(config)), strict=False)]
    skipping = O41IterableDataset(dataclasses.replace(config, skip_batches=[(5, 8)]))
    skipping.load_state_dict(state)
    resumed = [b["v"].tolist() for _, b in zip(range(4), iter(skipping), strict=False)]
    assert resumed == straight[3:5] + straight[8:10]
    # The state it saves now carries the skips, so a later resume keeps them.
    saved = Checkpoint.from_json(skipping.state_dict()["checkpoint"])
    assert json.loads(saved.resolved_json())["skip_batches"] == [[5, 8]]


def test_the_state_of_another_stream_is_refused(shard: ShardWriter) -> None:
    state = state_after(O41IterableDataset(config_of(shard, seed=1)), 2)
    other = O41IterableDataset(config_of(shard, seed=2))
    with pytest.raises(CheckpointError, match="seed is 1 in the checkpoint, 2 in the config"):
        other.load_state_dict(state)
    fresh = O41IterableDataset(config_of(shard, seed=1)).state_dict()
    assert "config" in fresh
    with pytest.raises(CheckpointError, match="start of another stream"):
        other.load_state_dict(fresh)
    # A dataset resumed from a checkpoint compares fingerprints.
    with open_batch_stream(config_of(shard, seed=1)) as stream:
        next(stream)
        resumed_from = O41IterableDataset(stream.checkpoint())
    foreign = state_after(O41IterableDataset(config_of(shard, seed=3)), 1)
    with pytest.raises(CheckpointError, match="it belongs to stream fnv1a64:"):
        resumed_from.load_state_dict(foreign)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"stride": 100, "offset": 50}, "offset 50, stride 100 with 1 workers is not a share"),
        ({"stride": 100, "offset": 50, "workers": 2}, "offset 50, stride 100 with 2 workers"),
        ({"stride": 0}, "stride 0 with 1 workers"),
        ({"offset": 3, "stride": 2, "workers": 2}, "offset 3, stride 2"),
        ({"stride": "1"}, "its stride is '1', not a whole number"),
        ({"offset": -1}, "its offset is -1"),
    ],
)
def test_a_tampered_share_is_refused(shard: ShardWriter, change: dict[str, Any], message: str) -> None:
    config = config_of(shard)
    state = {**state_after(O41IterableDataset(config), 2), **change}
    with pytest.raises(CheckpointError, match=message):
        O41IterableDataset(config).load_state_dict(state)


def test_malformed_states_are_refused_naming_what_is_wrong(shard: ShardWriter) -> None:
    config = config_of(shard)
    dataset = O41IterableDataset(config)
    state = state_after(O41IterableDataset(config), 2)
    with pytest.raises(CheckpointError, match="expected the mapping state_dict"):
        dataset.load_state_dict(None)  # type: ignore[arg-type]
    missing = {k: v for k, v in state.items() if k != "stride"}
    with pytest.raises(CheckpointError, match="it has no 'stride'"):
        dataset.load_state_dict(missing)
    with pytest.raises(CheckpointError, match="neither a 'checkpoint' nor a 'config'"):
        dataset.load_state_dict({k: v for k, v in state.items() if k != "checkpoint"})
    with pytest.raises(CheckpointError, match="version"):
        dataset.load_state_dict({**state, "version": 99})
