"""A run's place in one document (``RunState``) and the index beside per-rank files
(``RunIndex``): the engine's rules, as any framework adapter meets them (docs/checkpoint.md)."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest
from o41_testkit import ShardWriter
from o41_training_data import (
    RUN_STATE_FORMAT,
    RUN_STATE_VERSION,
    BatchStreamConfig,
    Checkpoint,
    CheckpointError,
    FileSource,
    ProjectedField,
    RunIndex,
    RunState,
    Stage,
    open_batch_stream,
    rank_file_name,
    resume_batch_stream,
    save_run_files,
)


def config_of(shard: ShardWriter) -> BatchStreamConfig:
    rows = shard("jsonl", [{"v": i} for i in range(96)])
    stage = Stage(sources=[FileSource([rows])], batch_size=4, infinite=False)
    return BatchStreamConfig(fields=[ProjectedField("v", "v", "i64")], stages=[stage], seed=3, world_size=2)


def global_sequence(config: BatchStreamConfig) -> list[list[int]]:
    with open_batch_stream(replace(config, rank=0, world_size=1)) as stream:
        return [batch.arrays()["v"].tolist() for batch in stream]


def stop(config: BatchStreamConfig, rank: int, batches: int) -> Checkpoint:
    with open_batch_stream(replace(config, rank=rank)) as stream:
        for _ in range(batches):
            next(stream)
        return stream.checkpoint()


def remaining(checkpoint: Checkpoint) -> list[list[int]]:
    with resume_batch_stream(checkpoint) as stream:
        return [batch.arrays()["v"].tolist() for batch in stream]


def test_a_state_round_trips_and_every_world_continues_the_global_sequence(shard: ShardWriter) -> None:
    config = config_of(shard)
    stops = [stop(config, rank, 3) for rank in range(2)]
    state = RunState(2, stops[0], [c.position for c in stops])
    document = state.to_dict()
    assert (document["format"], document["version"]) == (RUN_STATE_FORMAT, RUN_STATE_VERSION)
    # Plain JSON data: it survives a JSON round trip (and torch.load(weights_only=True)).
    read = RunState.from_dict(json.loads(json.dumps(document)), "the state")
    assert read.positions == state.positions
    assert read.checkpoint(1) == stops[1]
    expected = global_sequence(config)[6:]
    for world in (1, 2, 3):
        moved = [read.checkpoint_for(rank, world, "the state") for rank in range(world)]
        streams = [remaining(c) for c in moved if c is not None]
        interleaved = [batch for round_ in zip(*streams, strict=False) for batch in round_]
        # The ranks together deliver exactly the rest of the global sequence (whole rounds).
        assert interleaved == expected[: len(interleaved)]
        assert len(expected) - len(interleaved) < world


def test_a_state_before_any_start_resumes_at_the_beginning(shard: ShardWriter) -> None:
    state = RunState(2, None, [None, None])
    assert RunState.from_dict(state.to_dict(), "s").checkpoint_for(0, 3, "s") is None


def test_ranks_at_different_places_are_not_moved_and_bad_states_are_named(shard: ShardWriter) -> None:
    config = config_of(shard)
    uneven = RunState(2, stop(config, 0, 3), [stop(config, 0, 3).position, stop(config, 1, 4).position])
    with pytest.raises(
        CheckpointError, match=r"rank 0 at global batch 6 \(stage 0\), rank 1 at global batch 8"
    ):
        uneven.checkpoint_for(0, 3, "my.ckpt")
    with pytest.raises(CheckpointError, match="my.ckpt: ranks\\[0\\] holds the position of rank 1 of 2"):
        RunState(2, stop(config, 1, 1), [stop(config, 1, 1).position, None], "my.ckpt")
    with pytest.raises(CheckpointError, match="the state is not JSON data"):
        RunState.from_dict({"format": RUN_STATE_FORMAT, "ranks": [object()]}, "the state")
    with pytest.raises(CheckpointError, match="the state holds no o41-training-data-lightning state"):
        RunState.from_dict([1, 2], "the state")


def test_an_index_restores_a_directory_of_rank_files_onto_any_world(
    shard: ShardWriter, tmp_path: Path
) -> None:
    config = config_of(shard)
    stops = [stop(config, rank, 3) for rank in range(2)]
    names = [rank_file_name(rank, 2) for rank in range(2)]
    save_run_files(
        dict(zip(names, stops, strict=True)), lambda name, text: (tmp_path / name).write_text(text)
    )
    index = RunIndex.from_json(RunIndex(names, global_step=12).to_json(), "index.json")
    assert (index.world_size, index.global_step) == (2, 12)
    entries = [p.name for p in tmp_path.iterdir()]
    read = []

    def reader(name: str) -> str:
        read.append(name)
        return (tmp_path / name).read_text()

    assert index.restore(entries, str(tmp_path), reader, 1, 2, "index.json") == stops[1]
    assert names[0] not in read  # on its own world a rank reads its own file only
    moved = index.restore(entries, str(tmp_path), reader, 0, 3, "index.json")
    assert moved is not None
    assert (moved.rank, moved.world_size, moved.next_batch) == (0, 3, 6)
    (tmp_path / names[1]).unlink()
    with pytest.raises(CheckpointError, match="lacks stream-rank1-of-2.json"):
        index.restore([p.name for p in tmp_path.iterdir()], str(tmp_path), reader, 0, 2, "index.json")
