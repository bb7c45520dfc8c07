"""The stream's rules every adapter uses (docs/rules.md): ranks, the delivered schema, ramp rows,
curriculum switch points, moving checkpoints to another world, and per-rank files named one way
and written all or nothing."""

from __future__ import annotations

import os
import threading
from dataclasses import replace
from pathlib import Path

import pytest
from o41_testkit import ShardWriter
from o41_training_data import (
    LIMITS,
    BatchStreamConfig,
    Checkpoint,
    CheckpointError,
    ConfigError,
    DeliveredField,
    FileSource,
    ProjectedField,
    Ramp,
    Stage,
    StageBatches,
    StreamRules,
    SwitchPoint,
    check_same_place,
    check_same_stream,
    find_rank_files,
    move_to_world,
    open_batch_stream,
    parse_rank_file_name,
    process_ranks,
    rank_file_name,
    rank_files_among,
    switch_point,
    write_rank_file,
)


def two_stages(shard: ShardWriter, **kwargs: object) -> BatchStreamConfig:
    a = shard("jsonl", [{"v": i, "m": [1, 0, 1]} for i in range(64)])
    b = shard("jsonl", [{"v": 1000 + i, "m": [0, 0, 1]} for i in range(64)])
    return BatchStreamConfig(
        fields=[ProjectedField("v", "v", "i64"), ProjectedField("m", "m", "bool", shape=[3])],
        stages=[
            Stage(sources=[FileSource([a])], batch_size=4, infinite=True),
            Stage(sources=[FileSource([b])], batch_size=4, infinite=True),
        ],
        seed=1,
        **kwargs,  # type: ignore[arg-type]
    )


def stop(config: BatchStreamConfig, rank: int, batches: int, switch_after: int | None = None) -> Checkpoint:
    with open_batch_stream(replace(config, rank=rank)) as stream:
        for k in range(batches):
            if k == switch_after:
                stream.advance(1)
            next(stream)
        return stream.checkpoint()


# -- The delivered schema and batch shapes, read by the engine.


def test_the_delivered_schema_of_a_config_and_its_checkpoint_include_the_valid_mask(
    shard: ShardWriter,
) -> None:
    config = two_stages(shard)
    finite = replace(config.stages[0], infinite=False)
    config = replace(config, stages=[finite], validation_pass=True)
    rules = StreamRules.of(config)
    assert rules.fields == (
        DeliveredField("v", "i64", ()),
        DeliveredField("m", "bool", (3,)),
        DeliveredField("valid", "bool", ()),
    )
    with open_batch_stream(config) as stream:
        batch = next(stream)
        checkpoint = stream.checkpoint()
    # What the stream delivers is what the rules said, dtype and shape included (the core hands
    # bool columns over as uint8 bytes; the adapters view them as their framework's bool).
    numpy = {"i64": "int64", "bool": "uint8"}
    assert [(n, a.dtype.name, a.shape[1:]) for n, a in batch.arrays().items()] == [
        (f.name, numpy[f.dtype], f.shape) for f in rules.fields
    ]
    assert StreamRules.of(checkpoint).fields == rules.fields
    assert StreamRules.of(checkpoint).field_names("bool") == {"m", "valid"}
    with pytest.raises(ConfigError, match="expected a BatchStreamConfig or a Checkpoint, got dict"):
        StreamRules.of({})  # type: ignore[arg-type]


def test_a_ramped_stage_gives_each_rank_its_share_of_every_size(shard: ShardWriter) -> None:
    config = two_stages(shard, world_size=2)
    ramped = replace(config.stages[1], batch_size=8, ramp=Ramp(start=2, increment=2, rows=40))
    rules = StreamRules.of(replace(config, stages=[config.stages[0], ramped]))
    assert rules.stages[1].global_sizes() == (2, 4, 6, 8)
    assert rules.stages[1].local_batch_rows(2) == (1, 2, 3, 4)
    assert rules.stages[1].batches_per_round(2) == 1
    assert rules.stages[0].batches_per_round(2) == 2
    assert rules.local_batch_rows() == (1, 2, 3, 4)
    # Four ranks split only the sizes that divide by four; the unramped stage gives whole batches.
    assert rules.local_batch_rows(4) == (1, 2, 4)
    # The rule is the engine's; a ramp no config would hold is refused, never a crash.
    with pytest.raises(ConfigError, match="is not below the stage's batch_size 4"):
        StageBatches(batch_size=4, ramp=(8, 1, 10), sizes=(4,)).local_batch_rows(2)
    # What ranks receive in the ramp, and the sizes the rules list, agree.
    seen = set()
    with open_batch_stream(replace(config, stages=[ramped], rank=1)) as stream:
        for _, batch in zip(range(40), stream, strict=False):
            seen.add(len(batch.arrays()["v"]))
    assert seen == {1, 2, 3, 4}


def test_the_limits_are_the_engines() -> None:
    assert LIMITS["max_world_size"] == 2**32
    assert LIMITS["max_seq_len"] == 2**30
    with pytest.raises(ConfigError, match=f"world_size: must be between 1 and {2**32}"):
        BatchStreamConfig(
            fields=[ProjectedField("v", "v", "i64")], stages=[], world_size=2**32 + 1
        ).validate()


# -- Ranks and world size.


def test_process_ranks_follow_the_configured_pair_then_the_environment(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("RANK", raising=False)
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    assert process_ranks() == (0, 1)
    monkeypatch.setenv("RANK", "2")
    monkeypatch.setenv("WORLD_SIZE", "4")
    assert process_ranks() == (2, 4)
    assert process_ranks((1, 3)) == (1, 3)  # an explicit pair wins over the environment
    assert process_ranks((0, 1)) == (2, 4)  # the default pair is no choice
    monkeypatch.setenv("RANK", "abc")
    with pytest.raises(
        ConfigError, match="invalid RANK environment variable: expected an integer, got 'abc'"
    ):
        process_ranks()
    monkeypatch.setenv("RANK", "4")
    with pytest.raises(ConfigError, match="RANK and WORLD_SIZE environment variables: invalid rank"):
        process_ranks()
    with pytest.raises(ConfigError, match="invalid world_size: must be between 1 and"):
        process_ranks((0, 2**33))


# -- Curriculum switch points.


def switched_at(
    config: BatchStreamConfig, rank: int, point: SwitchPoint, batches: int
) -> list[tuple[int, int]]:
    """``(batch_index, stage)`` of a rank's first ``batches`` batches with ``point`` applied at open."""
    with open_batch_stream(replace(config, rank=rank)) as stream:
        assert point.due(stream.position)
        stream.advance(point.stage, at=point.at)
        return [(batch.batch_index, batch.stage) for batch in (next(stream) for _ in range(batches))]


@pytest.mark.parametrize("ramped", [False, True], ids=["whole-batches", "ramp"])
def test_every_rank_gets_the_same_switch_point_after_the_same_local_batch(
    shard: ShardWriter, ramped: bool
) -> None:
    config = two_stages(shard, world_size=3)
    if ramped:
        first = replace(config.stages[0], batch_size=12, ramp=Ramp(start=3, increment=3, rows=600))
        config = replace(config, stages=[first, config.stages[1]])
    rules = StreamRules.of(config)
    points = set()
    for rank in range(3):
        with open_batch_stream(replace(config, rank=rank)) as stream:
            for _ in range(4):
                batch = next(stream)
            # Asked with the config, a checkpoint or the rules: one answer.
            for source in (config, stream.checkpoint(), rules):
                points.add(switch_point(source, batch.position, 1, batches_ahead=2))
    # 4 local batches are 4 rounds; 2 more in flight are 2 more: 3 global batches a round, or
    # 1 in a ramp, whose global batches the ranks share.
    per_round = 1 if ramped else 3
    assert points == {SwitchPoint(stage=1, at=6 * per_round)}
    # Applied in every rank's stream, the new stage starts at that global batch on all of them.
    (point,) = points
    for rank in range(3):
        seen = switched_at(config, rank, point, 8)
        assert [stage for index, stage in seen if index < point.at] == [0] * 6
        assert {stage for index, stage in seen if index >= point.at} == {1}


def test_a_switch_point_refuses_what_is_not_a_stage_or_a_count(shard: ShardWriter) -> None:
    config = two_stages(shard)
    with open_batch_stream(config) as stream:
        position = next(stream).position
    assert switch_point(config, position, 1) == SwitchPoint(stage=1, at=position.next_batch)
    for stage in (2, -1, True, "1"):
        with pytest.raises(ConfigError, match="invalid stage: there is no stage .*; the stream has 2 stages"):
            switch_point(config, position, stage)  # type: ignore[arg-type]
    for ahead in (-1, 1.5, False):
        with pytest.raises(ConfigError, match="invalid batches_ahead: expected a whole number"):
            switch_point(config, position, 1, batches_ahead=ahead)  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="invalid position: expected a Position, got int"):
        switch_point(config, 3, 1)  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="invalid at: expected a whole number >= 0, got -1"):
        SwitchPoint(stage=1, at=-1)
    with pytest.raises(ConfigError, match="invalid stage: expected a whole number >= 0, got '1'"):
        SwitchPoint(stage="1", at=0)  # type: ignore[arg-type]
    # A stream past the point already reflects it (or never will): it is not due there.
    assert not SwitchPoint(stage=1, at=0).due(position)
    assert SwitchPoint(stage=1, at=position.next_batch).due(position)


# -- Moving checkpoints to another world: one rule.


def test_moving_needs_one_stream_one_segment_and_one_next_batch(shard: ShardWriter) -> None:
    config = two_stages(shard, world_size=2)
    stops = {"rank 0": stop(config, 0, 3), "rank 1": stop(config, 1, 3)}
    moved = move_to_world(stops, 2, 3)
    assert (moved.rank, moved.world_size, moved.next_batch) == (2, 3, 6)
    # One global batch, but rank 1 switched to stage 1 on the way: the segments differ.
    switched = {"rank 0": stops["rank 0"], "rank 1": stop(config, 1, 3, switch_after=1)}
    assert switched["rank 1"].next_batch == stops["rank 0"].next_batch
    with pytest.raises(
        CheckpointError,
        match=r"rank 0 at global batch 6 \(stage 0\), rank 1 at global batch 6 \(stage 1\)",
    ):
        move_to_world(switched, 0, 3)
    with pytest.raises(
        CheckpointError, match=r"rank 0 at global batch 6 \(stage 0\), rank 1 at global batch 8"
    ):
        check_same_place({"rank 0": stops["rank 0"], "rank 1": stop(config, 1, 4)}, world_size=3)
    with pytest.raises(CheckpointError, match="but rank 1 has not started"):
        check_same_place({"rank 0": stops["rank 0"].position, "rank 1": None}, world_size=3)
    other = stop(replace(config, seed=2), 0, 3)
    with pytest.raises(CheckpointError, match="rank 0 and other belong to different streams"):
        check_same_stream({"rank 0": stops["rank 0"], "other": other})
    with pytest.raises(CheckpointError, match="no checkpoint to move"):
        check_same_place({}, world_size=2)
    with pytest.raises(ConfigError, match="invalid rank: must be between 0 and 2, got 3"):
        move_to_world(stops, 3, 3)


def test_positions_move_with_the_document_they_are_in(shard: ShardWriter) -> None:
    config = two_stages(shard, world_size=2)
    stops = {"rank 0": stop(config, 0, 3), "rank 1": stop(config, 1, 3)}
    positions = {name: checkpoint.position for name, checkpoint in stops.items()}
    moved = move_to_world(positions, 1, 3, resolved=stops["rank 0"].resolved_json())
    assert moved == move_to_world(stops, 1, 3)
    with pytest.raises(ConfigError, match="positions need resolved="):
        move_to_world(positions, 1, 3)
    with pytest.raises(CheckpointError, match="no old rank had started"):
        move_to_world({"rank 0": None, "rank 1": None}, 0, 3)


# -- Per-rank files.


def test_a_rank_file_is_written_whole_or_not_at_all(tmp_path: Path) -> None:
    target = tmp_path / "process_0-of-2.json"
    write_rank_file(target, "first", overwrite=False)
    with pytest.raises(FileExistsError):
        write_rank_file(target, "second", overwrite=False)
    assert target.read_text() == "first"
    write_rank_file(target, "second", overwrite=True)
    assert target.read_text() == "second"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["process_0-of-2.json"]  # no temporary left
    # Readers racing a writer see one of the two texts, never a mix or an empty file.
    texts = {"a" * 100_000, "b" * 100_000}
    seen: set[str] = set()
    done = threading.Event()

    def read() -> None:
        while not done.is_set():
            seen.add(target.read_text())

    reader = threading.Thread(target=read)
    reader.start()
    for k in range(50):
        write_rank_file(target, sorted(texts)[k % 2], overwrite=True)
    done.set()
    reader.join()
    assert seen <= texts | {"second"}
    assert os.stat(target).st_size == 100_000


def test_rank_files_have_one_name_and_the_old_ones_are_read(tmp_path: Path) -> None:
    assert rank_file_name(3, 8) == "stream-rank3-of-8.json"
    with pytest.raises(ConfigError, match="invalid rank: must be between 0 and 1, got 2"):
        rank_file_name(2, 2)
    assert parse_rank_file_name("stream-rank3-of-8.json") == (3, 8)
    assert parse_rank_file_name("process_3-of-8.json") == (3, 8)  # an earlier Orbax item's
    others = ("stream-rank3.json", "datamodule.json", "stream-rank3-of-8.json.tmp", "process_x-of-8.json")
    for other in others:
        assert parse_rank_file_name(other) is None
    for name in (rank_file_name(0, 2), "process_1-of-2.json", rank_file_name(0, 1), "datamodule.json"):
        (tmp_path / name).write_text(name)
    found = find_rank_files(tmp_path)
    assert {key: path.name for key, path in found.items()} == {
        (0, 1): "stream-rank0-of-1.json",
        (0, 2): "stream-rank0-of-2.json",
        (1, 2): "process_1-of-2.json",
    }
    assert found[(1, 2)] == tmp_path / "process_1-of-2.json"


def test_two_names_for_one_rank_are_refused(tmp_path: Path) -> None:
    (tmp_path / "stream-rank1-of-2.json").write_text("{}")
    (tmp_path / "process_1-of-2.json").write_text("{}")
    with pytest.raises(
        CheckpointError,
        match=rf"{tmp_path} holds two files for rank 1 of 2, process_1-of-2.json and stream-rank1-of-2.json",
    ):
        find_rank_files(tmp_path)
    with pytest.raises(CheckpointError, match="holds two files for rank 0 of 1, stream-rank0-of-1.json and"):
        rank_files_among(["stream-rank0-of-1.json", "stream-rank00-of-1.json"], "here")
