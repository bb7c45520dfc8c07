"""Batch ramps and validation passes: properties over random small configs and real shards."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st
from o41_testkit import ShardWriter
from o41_training_data import (
    BatchStreamConfig,
    Checkpoint,
    CheckpointError,
    ConfigError,
    FileSource,
    ProjectedField,
    Ramp,
    Shuffle,
    Stage,
    open_batch_stream,
    resume_batch_stream,
)

from order_cases import Case, Record, drive, materialise, record, run, run_with_stop, stage_cases

LIMIT = 24


@st.composite
def ramped_cases(draw: st.DrawFn, max_stages: int = 2, infinite: bool | None = None) -> Case:
    """Cases with one ramped stage (any of them); every ramp size divides by the world size."""
    world = draw(st.integers(1, 3))
    stages = draw(st.lists(stage_cases(infinite), min_size=1, max_size=max_stages))
    start = draw(st.integers(1, 2)) * world
    increment = draw(st.integers(1, 2)) * world
    steps = draw(st.integers(1, 3))
    ramped = stages[draw(st.integers(0, len(stages) - 1))]
    ramped.batch_size = start + steps * increment
    ramped.ramp = (start, increment, draw(st.integers(1, 60)))
    return Case(stages=stages, seed=draw(st.integers(0, 2**32)), world_size=world)


def ramp_of(case: Case) -> tuple[int, tuple[int, int, int]]:
    return next((s, stage.ramp) for s, stage in enumerate(case.stages) if stage.ramp is not None)


def merged_by_batch(per_rank: list[list[Record]]) -> list[Record]:
    """Each global batch once: shares of a batch (equal indices) joined in rank order."""
    joined: dict[int, Record] = {}
    for batches in per_rank:
        for index, stage, arrays in batches:
            if index in joined:
                for name, values in arrays.items():
                    joined[index][2][name].extend(values)
            else:
                joined[index] = (index, stage, {k: list(v) for k, v in arrays.items()})
    return [joined[i] for i in sorted(joined)]


def sizes(batches: list[Record]) -> list[int]:
    return [len(arrays["v"]) for _, _, arrays in batches]


@given(case=ramped_cases(), data=st.data())
def test_resume_mid_ramp_continues_identically(case: Case, data: st.DataObject) -> None:
    with materialise(case):
        rank = data.draw(st.integers(0, case.world_size - 1))
        config = case.config(rank=rank)
        advances = {}
        if len(case.stages) > 1:
            advances[data.draw(st.integers(0, LIMIT))] = 1
        reference = run(config, LIMIT, advances)
        stop = data.draw(st.integers(0, len(reference)))
        assert run_with_stop(config, LIMIT, stop, advances) == reference


@given(case=ramped_cases(), data=st.data())
def test_ranks_share_every_ramp_batch_and_together_are_the_global_sequence(
    case: Case, data: st.DataObject
) -> None:
    with materialise(case):
        world = case.world_size
        ramped, (start, increment, _) = ramp_of(case)
        # A switch to the next stage after the same number of local batches on every rank. A
        # local batch is a global one in a ramped stage, a round of world_size in another: the
        # single-rank run switches at the same global batch.
        at = data.draw(st.integers(0, LIMIT))
        advances = {at: 1} if len(case.stages) > 1 else {}
        single_advances = {at * (1 if ramped == 0 else world): 1} if advances else {}
        per_rank = [run(case.config(rank=r), LIMIT, advances) for r in range(world)]
        assert len({len(batches) for batches in per_rank}) == 1, "every rank yields as many batches"
        # Every rank holds the same share of every ramp batch, so the ranks step together.
        assert len({tuple(sizes(batches)) for batches in per_rank}) == 1
        merged = merged_by_batch(per_rank)
        single = run(case.config(rank=0, world_size=1), len(merged), single_advances)
        assert merged == single
        ramp = [len(arrays["v"]) for _, stage, arrays in single if stage == ramped]
        assert ramp == sorted(ramp), "the batch only grows"
        assert all((size - start) % increment == 0 for size in ramp)
        assert not ramp or ramp[0] == start


@given(case=ramped_cases(max_stages=1, infinite=True), data=st.data())
def test_a_mid_ramp_checkpoint_resumes_on_another_world_size(case: Case, data: st.DataObject) -> None:
    with materialise(case):
        world = case.world_size
        stop = data.draw(st.integers(0, 8))
        checkpoints = []
        for r in range(world):
            with open_batch_stream(case.config(rank=r)) as stream:
                drive(stream, stop, {})
                checkpoints.append(stream.checkpoint())
        # Positions are global batch numbers: every rank's checkpoint marks the same point.
        assert len({c.next_batch for c in checkpoints}) == 1
        _, (start, increment, _) = ramp_of(case)
        new_world = data.draw(
            st.sampled_from([w for w in (1, 2, 3, 4, 6) if start % w == 0 and increment % w == 0])
        )
        continued = []
        for r in range(new_world):
            with resume_batch_stream(checkpoints[0].for_world(r, new_world)) as stream:
                continued.append(drive(stream, 6, {}))
        with open_batch_stream(case.config(rank=0, world_size=1)) as stream:
            single = drive(stream, stop + 6, {})[stop:]
        assert merged_by_batch(continued) == single


def test_a_ramp_step_that_does_not_split_over_the_ranks_is_refused(shard: ShardWriter) -> None:
    path = shard("jsonl", [{"v": i} for i in range(40)])

    def config(world_size: int) -> BatchStreamConfig:
        return BatchStreamConfig(
            fields=[ProjectedField("v", "v", "i64")],
            stages=[
                Stage(
                    sources=[FileSource(files=[path])],
                    batch_size=12,
                    ramp=Ramp(start=4, increment=4, rows=16),
                )
            ],
            world_size=world_size,
        )

    with pytest.raises(ConfigError, match=r"stages\[0\]\.ramp") as caught:
        open_batch_stream(config(8))
    assert "8" in str(caught.value)
    with open_batch_stream(config(2)) as stream:
        assert [b.num_rows for b in stream][:3] == [2, 2, 4]
        checkpoint = stream.checkpoint()
    with pytest.raises(ConfigError, match=r"stages\[0\]\.ramp"):
        checkpoint.for_world(0, 3)
    for bad, option in [
        (Ramp(start=12, increment=4, rows=16), "start"),
        (Ramp(start=4, increment=5, rows=16), "increment"),
        (Ramp(start=4, increment=4, rows=0), "rows"),
    ]:
        stage = Stage(sources=[FileSource(files=[path])], batch_size=12, ramp=bad)
        with pytest.raises(ConfigError, match=rf"stages\[0\]\.ramp\.{option}"):
            open_batch_stream(BatchStreamConfig(fields=[ProjectedField("v", "v", "i64")], stages=[stage]))


def test_a_finite_ramp_drops_only_its_final_partial_batch(shard: ShardWriter) -> None:
    path = shard("parquet", [{"v": i} for i in range(33)])
    config = BatchStreamConfig(
        fields=[ProjectedField("v", "v", "i64")],
        stages=[
            Stage(sources=[FileSource(files=[path])], batch_size=12, ramp=Ramp(start=4, increment=4, rows=30))
        ],
        world_size=2,
        rank=1,
    )
    with open_batch_stream(config) as stream:
        batches = [b.arrays()["v"].tolist() for b in stream]
        stats = stream.stats
    # k = 2 steps: ceil(30 / 8) = 4 batches of 4, ceil(30 / 16) = 2 of 8, then 12 (33 - 32 rows left).
    assert [len(b) for b in batches] == [2, 2, 2, 2, 4, 4]
    assert batches[0] == [2, 3]
    assert batches[4] == [20, 21, 22, 23]
    assert (stats.rows_yielded, stats.dropped_rows) == (16, 1)


# -- Validation passes


@st.composite
def validation_cases(draw: st.DrawFn) -> Case:
    stages = draw(st.lists(stage_cases(infinite=False), min_size=1, max_size=2))
    for stage in stages:
        stage.shuffle = None
    return Case(
        stages=stages,
        seed=draw(st.integers(0, 2**32)),
        world_size=draw(st.integers(1, 5)),
        validation_pass=True,
    )


@given(case=validation_cases())
def test_a_validation_pass_reads_every_row_once_and_masks_exactly_the_padding(case: Case) -> None:
    with materialise(case):
        world = case.world_size
        total = case.rows(0)
        bs = case.stages[0].batch_size
        seen: list[int] = []
        counts = set()
        yielded = 0
        for rank in range(world):
            with open_batch_stream(case.config(rank=rank)) as stream:
                batches = list(stream)
                stats = stream.stats
            counts.add(len(batches))
            assert stats.dropped_rows == 0
            yielded += stats.rows_yielded
            for batch in batches:
                arrays = batch.arrays()
                valid = arrays["valid"]
                assert valid.dtype.name == "uint8"
                assert batch.num_rows == bs
                first = (batch.batch_index) * bs
                expected = [1 if first + i < total else 0 for i in range(bs)]
                assert valid.tolist() == expected, "the mask marks exactly the rows past the end"
                for name, values in arrays.items():
                    assert not values[valid == 0].any(), f"padding rows of {name} are zeros"
                seen.extend(arrays["id"][valid == 1].tolist())
        assert len(counts) == 1, "every rank yields the same number of batches"
        assert sorted(seen) == sorted(set(seen))
        assert len(seen) == total
        assert yielded == total
        # The padded round is the last: no rank yields a batch wholly of padding before it.
        assert counts.pop() == -(-((total + bs - 1) // bs) // world)


@given(case=validation_cases(), data=st.data())
def test_a_validation_pass_resumes_identically(case: Case, data: st.DataObject) -> None:
    with materialise(case):
        config = case.config(rank=data.draw(st.integers(0, case.world_size - 1)))
        reference = run(config, LIMIT)
        stop = data.draw(st.integers(0, len(reference)))
        assert run_with_stop(config, LIMIT, stop) == reference


def test_a_validation_pass_needs_finite_unshuffled_stages(shard: ShardWriter) -> None:
    path = shard("jsonl", [{"v": i} for i in range(10)])
    fields = [ProjectedField("v", "v", "i64")]
    source = FileSource(files=[path])
    refused = [
        (Stage(sources=[source], batch_size=4, infinite=True), fields, r"stages\[0\]\.infinite"),
        (
            Stage(sources=[source], batch_size=4, shuffle=Shuffle(buffer_rows=8)),
            fields,
            r"stages\[0\]\.shuffle",
        ),
        (Stage(sources=[source], batch_size=4, ramp=Ramp(2, 2, 4)), fields, r"stages\[0\]\.ramp"),
        (Stage(sources=[source], batch_size=4), [ProjectedField("valid", "v", "i64")], r"fields\[0\]\.name"),
    ]
    for stage, stage_fields, option in refused:
        with pytest.raises(ConfigError, match=option):
            open_batch_stream(BatchStreamConfig(fields=stage_fields, stages=[stage], validation_pass=True))
    # Without validation_pass the mask column does not exist and the short round is dropped.
    with open_batch_stream(
        BatchStreamConfig(fields=fields, stages=[Stage(sources=[source], batch_size=4)])
    ) as stream:
        batches = list(stream)
        assert all("valid" not in b.arrays() for b in batches)
        assert stream.stats.dropped_rows == 2


def test_a_validation_checkpoint_is_refused_for_a_config_without_it(shard: ShardWriter) -> None:
    path = shard("jsonl", [{"v": i} for i in range(10)])
    config = BatchStreamConfig(
        fields=[ProjectedField("v", "v", "i64")],
        stages=[Stage(sources=[FileSource(files=[path])], batch_size=4)],
        validation_pass=True,
    )
    with open_batch_stream(config) as stream:
        next(stream)
        checkpoint = Checkpoint.from_json(stream.checkpoint().to_json())
    plain = BatchStreamConfig(fields=config.fields, stages=config.stages)
    with pytest.raises(CheckpointError, match="validation_pass"):
        checkpoint.check(config=plain)
    with resume_batch_stream(checkpoint, config=config) as stream:
        rest = [record(b.batch_index, b.stage, b.arrays()) for b in stream]
    assert [r[2]["valid"] for r in rest] == [[1, 1, 1, 1], [1, 1, 0, 0]]
