"""Partitions (docs/order.md, "Partitions"): elastic moves, stage switches, memory and errors."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from o41_training_data import (
    BatchStreamConfig,
    Checkpoint,
    CheckpointError,
    ConfigError,
    Ramp,
    Shuffle,
    open_batch_stream,
    plan_reads,
    resume_batch_stream,
)
from o41_training_data._cli import main

from order_cases import Case, SourceCase, StageCase, materialise, record, run

Record = tuple[int, int, dict[str, list[int]]]


def infinite_case(seed: int, partitions: int, world: int = 1, stages: int = 1) -> Case:
    stage = StageCase(
        sources=[SourceCase([23, 17], "parquet", 3.0), SourceCase([11], "jsonl", 1.0)],
        batch_size=3,
        shuffle=(10, 2),
        infinite=True,
    )
    return Case(
        stages=[dataclasses.replace(stage) for _ in range(stages)],
        seed=seed,
        world_size=world,
        partitions=partitions,
    )


def move(checkpoints: list[Checkpoint], world: int, local: int) -> tuple[list[Checkpoint], list[Record]]:
    """Resumes every rank of a new world from ``checkpoints`` (one per old rank), reads ``local``
    batches on each, and returns their checkpoints and batches."""
    out, batches = [], []
    for rank in range(world):
        moved = checkpoints[rank % len(checkpoints)].for_world(rank=rank, world_size=world)
        with resume_batch_stream(moved, rank=rank, world_size=world) as stream:
            for _ in range(local):
                batch = next(stream)
                batches.append(record(batch.batch_index, batch.stage, batch.arrays()))
            out.append(stream.checkpoint())
    return out, batches


@settings(max_examples=25, deadline=None)
@given(
    seed=st.integers(0, 2**32),
    partitions=st.sampled_from([4, 8, 6]),
    steps=st.lists(st.integers(0, 5), min_size=4, max_size=4),
)
def test_moves_between_worlds_continue_the_single_rank_sequence_exactly(
    seed: int, partitions: int, steps: list[int]
) -> None:
    # 2 -> 3 -> 8 -> 1 ranks, each world reading a random number of rounds: the batches of every
    # world together are exactly the single-rank sequence, whether or not it divides partitions.
    case = infinite_case(seed, partitions, world=2)
    with materialise(case):
        worlds = [2, 3, 8, 1]
        checkpoints: list[Checkpoint] = []
        got: list[Record] = []
        for world, local in zip(worlds, steps, strict=True):
            if not checkpoints:
                for rank in range(world):
                    with open_batch_stream(case.config(rank=rank, world_size=world)) as stream:
                        for _ in range(local):
                            batch = next(stream)
                            got.append(record(batch.batch_index, batch.stage, batch.arrays()))
                        checkpoints.append(stream.checkpoint())
            else:
                checkpoints, batches = move(checkpoints, world, local)
                got.extend(batches)
        got.sort(key=lambda b: b[0])
        assert [b[0] for b in got] == list(range(len(got))), "no batch is skipped or repeated"
        assert got == run(case.config(rank=0, world_size=1), len(got))


def test_a_switch_lands_where_every_partition_has_read_the_same_rows() -> None:
    case = infinite_case(7, partitions=4, world=2, stages=2)
    with materialise(case):
        positions = []
        for rank in range(2):
            with open_batch_stream(case.config(rank=rank)) as stream:
                next(stream)
                stream.advance(1)
                batches = [next(stream) for _ in range(4)]
                positions.append(stream.checkpoint())
            # Asked after the first round (global batch 2), the switch waits for global batch 4.
            assert [b.stage for b in batches] == [0, 1, 1, 1]
            assert [b.batch_index for b in batches] == [2 + rank, 4 + rank, 6 + rank, 8 + rank]
        assert {json.loads(p.to_json())["cursor"]["segment"]["start_batch"] for p in positions} == {4}


def test_a_switch_no_round_of_the_world_can_reach_is_refused() -> None:
    # Two ranks stop after one batch each (next global batch 2); on four ranks, rounds begin at
    # 2, 6, 10, ...: none is a multiple of four batches after the stage began at 0.
    case = infinite_case(3, partitions=4, world=2, stages=2)
    with materialise(case):
        checkpoints = []
        for rank in range(2):
            with open_batch_stream(case.config(rank=rank)) as stream:
                next(stream)
                checkpoints.append(stream.checkpoint())
        moved = checkpoints[0].for_world(rank=0, world_size=4)
        with resume_batch_stream(moved, rank=0, world_size=4) as stream:
            with pytest.raises(ConfigError, match="partitions=4") as error:
                stream.advance(1)
            assert error.value.option == "advance"
            assert next(stream).stage == 0, "the stream goes on in its stage"


def test_a_rank_plans_the_windows_of_its_partitions_together() -> None:
    # Windows larger than the smallest group the engine plans (4,096 rows), so that the group
    # is the windows a rank reads: all eight on one rank, one on each of eight.
    case = infinite_case(1, partitions=8)
    case.stages[0].shuffle = (6144, 2)
    with materialise(case):
        held = {}
        for partitions, world in ((8, 1), (8, 2), (8, 8), (1, 1), (1, 8)):
            config = dataclasses.replace(case.config(rank=0, world_size=world), partitions=partitions)
            with open_batch_stream(config) as stream:
                held[partitions, world] = stream.memory_bound.batches
        assert held[8, 1] > held[8, 2] > held[8, 8] == held[1, 8] == held[1, 1]


@pytest.mark.parametrize(
    ("edit", "option", "words"),
    [
        (lambda c: dataclasses.replace(c, partitions=0), "partitions", "between 1"),
        (lambda c: dataclasses.replace(c, partitions=True), "partitions", "integer"),
        (
            lambda c: dataclasses.replace(
                c, stages=[dataclasses.replace(c.stages[0], shuffle=None), *c.stages[1:]]
            ),
            "stages[0].shuffle",
            "shuffle this stage",
        ),
        (
            lambda c: dataclasses.replace(
                c, stages=[dataclasses.replace(c.stages[0], ramp=Ramp(start=3, increment=3, rows=30))]
            ),
            "stages[0].ramp",
            "ramp",
        ),
    ],
)
def test_partitions_are_checked_naming_the_option(edit, option: str, words: str) -> None:  # type: ignore[no-untyped-def]
    case = infinite_case(1, partitions=4)
    with materialise(case):
        with pytest.raises(ConfigError, match=words) as error:
            open_batch_stream(edit(case.config()))
        assert error.value.option == option


def test_a_validation_pass_keeps_one_partition() -> None:
    case = infinite_case(1, partitions=1)
    case.stages[0].infinite = False
    case.stages[0].shuffle = None
    with materialise(case):
        config = dataclasses.replace(case.config(), validation_pass=True)
        with pytest.raises(ConfigError, match="validation pass") as error:
            open_batch_stream(dataclasses.replace(config, partitions=2))
        assert error.value.option == "partitions"


def test_partitions_are_part_of_the_order_and_of_the_same_stream_check() -> None:
    case = infinite_case(5, partitions=4)
    with materialise(case):
        config = case.config()
        with open_batch_stream(config) as stream:
            partitioned = [next(stream).arrays()["id"].tolist() for _ in range(8)]
            checkpoint = stream.checkpoint()
        with open_batch_stream(dataclasses.replace(config, partitions=1)) as stream:
            plain = [next(stream).arrays()["id"].tolist() for _ in range(8)]
        assert partitioned != plain
        assert json.loads(checkpoint.to_json())["resolved"]["partitions"] == 4
        with pytest.raises(Exception, match="partitions is 4 in the checkpoint, 1 in the config"):
            resume_batch_stream(checkpoint, config=dataclasses.replace(config, partitions=1))
        with resume_batch_stream(checkpoint, config=config) as resumed:
            assert next(resumed).batch_index == 8


def test_shuffle_with_partitions_round_trips_through_json() -> None:
    case = infinite_case(5, partitions=4)
    with materialise(case):
        config = case.config()
        assert BatchStreamConfig.from_dict(config.to_dict()) == config
        assert "partitions" not in dataclasses.replace(config, partitions=1).to_dict()
        assert Shuffle(buffer_rows=10, unit_rows=2) == config.stages[0].shuffle


@pytest.mark.parametrize("partitions", [0, 2**40, "4"])
def test_a_checkpoint_with_a_hostile_partition_count_is_refused(partitions: object) -> None:
    case = infinite_case(5, partitions=4)
    with materialise(case):
        with open_batch_stream(case.config()) as stream:
            next(stream)
            document = json.loads(stream.checkpoint().to_json())
        document["resolved"]["partitions"] = partitions
        with pytest.raises((ConfigError, CheckpointError)):
            resume_batch_stream(Checkpoint.from_json(json.dumps(document)))


def test_a_partitioned_document_pins_its_layout_and_unknown_layouts_are_refused() -> None:
    case = infinite_case(5, partitions=4)
    with materialise(case):
        with open_batch_stream(case.config()) as stream:
            next(stream)
            document = json.loads(stream.checkpoint().to_json())
        with open_batch_stream(dataclasses.replace(case.config(), partitions=1)) as stream:
            plain = json.loads(stream.checkpoint().to_json())
        assert document["resolved"]["partition_layout"] == 2
        assert "partition_layout" not in plain["resolved"], "one partition reads the same either way"
        # A layout is part of the fingerprint, so an edited one is refused as an altered
        # document (an unknown layout is named by the document's own check, config/tests.rs).
        document["resolved"]["partition_layout"] = 9
        with pytest.raises(CheckpointError, match="altered"):
            resume_batch_stream(Checkpoint.from_json(json.dumps(document)))


def test_a_partitioned_stage_moves_single_rows_unless_told_otherwise() -> None:
    # A window belongs to one partition, whose rank reads all of it whatever the unit: the
    # default unit is 1 there (docs/order.md, "Units"), and stays 8 without partitions.
    case = infinite_case(5, partitions=4)
    with materialise(case):
        config = case.config()

        def first_batches(partitions: int, unit: int | None) -> list[list[int]]:
            stage = dataclasses.replace(config.stages[0], shuffle=Shuffle(buffer_rows=24, unit_rows=unit))
            edited = dataclasses.replace(config, stages=[stage], partitions=partitions)
            with open_batch_stream(edited) as stream:
                return [next(stream).arrays()["id"].tolist() for _ in range(16)]

        assert first_batches(4, None) == first_batches(4, 1) != first_batches(4, 8)
        assert first_batches(1, None) == first_batches(1, 8) != first_batches(1, 1)


def test_an_infinite_stage_refuses_a_source_too_small_to_share() -> None:
    # The second source holds 11 rows: twelve partitions would leave one of them without any.
    case = infinite_case(5, partitions=12)
    with materialise(case):
        with pytest.raises(ConfigError, match="11 rows cannot be shared by partitions=12") as error:
            open_batch_stream(case.config())
        assert error.value.option == "stages[0].sources[1]"


def test_a_finite_source_smaller_than_the_partitions_is_counted_dropped_and_checkpoints() -> None:
    # One row and two partitions: each partition's share is no row. A checkpoint of such a stream
    # panicked (its epochs listed no source); the row is left out and counted, never silently.
    stage = StageCase([SourceCase([1], "parquet", 1.0)], batch_size=1, shuffle=(1, 1), infinite=False)
    case = Case(stages=[stage], seed=0, world_size=1, partitions=2)
    with materialise(case):
        with open_batch_stream(case.config()) as stream:
            checkpoint = stream.checkpoint()
            assert list(stream) == []
            assert stream.stats.dropped_rows == 1
        assert checkpoint.epochs == [0]
        with resume_batch_stream(Checkpoint.from_json(checkpoint.to_json())) as resumed:
            assert list(resumed) == []


def aligned_case() -> Case:
    """One source of 4 x 64 rows in windows of 16 rows: read units of 8 rows never cross one."""
    stage = StageCase([SourceCase([64] * 4, "parquet", 1.0)], batch_size=4, shuffle=(16, 1), infinite=False)
    return Case(stages=[stage], seed=2, world_size=4, partitions=4)


def test_a_read_plan_shows_what_partitions_save() -> None:
    # Four ranks: with four partitions each 8-row read unit holds rows of one rank; with one
    # partition, of several.
    case = aligned_case()
    with materialise(case):
        config = case.config()
        local = plan_reads(config, read_unit_rows=8, block_rows=8)
        assert local.world_size == 4
        assert local.partitions == 4
        assert local.amplification == 1.0
        assert local.sampled_batches == 64, "the whole finite stage"
        assert local.bytes_per_rank * 4 == pytest.approx(local.corpus_bytes, rel=0.01)
        spread = plan_reads(dataclasses.replace(config, partitions=1), read_unit_rows=8, block_rows=8)
        assert spread.amplification > 2.0
        assert local.planned_rows >= 16
        assert local.decoded_bytes_per_rank > 0
        # One batch of four rows holds four records of one window: at most four blocks.
        assert 1.0 <= local.distinct_blocks_per_batch <= 4.0
        assert 0.0 <= local.consecutive_neighbours <= 1.0
        with pytest.raises(ConfigError, match="world_size"):
            plan_reads(config, world_size=0)


def test_o41_plan_prints_the_figures(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    case = aligned_case()
    with materialise(case):
        file = tmp_path / "stream.json"
        file.write_text(case.config().to_json())
        assert main(["plan", str(file), "--world-size", "4", "--read-unit-rows", "8"]) == 0
        out = capsys.readouterr().out
        for words in (
            "cluster amplification",
            "bytes per rank per pass",
            "decoded-row memory per rank",
            "1.00x",
        ):
            assert words in out
