"""Property tests of the order function over random small configs and real shard files."""

from __future__ import annotations

import dataclasses
import itertools
import math
from collections import Counter

import numpy as np
from hypothesis import assume, given
from hypothesis import strategies as st
from o41_training_data import Checkpoint, open_batch_stream, resume_batch_stream

from order_cases import Case, cases, materialise, record, run, run_with_stop

LIMIT = 24


def advance_schedule(data: st.DataObject, case: Case, limit: int) -> dict[int, int]:
    """Random advances to later stages at random local batch counts."""
    schedule: dict[int, int] = {}
    stage = 0
    for at in sorted(data.draw(st.lists(st.integers(0, limit), max_size=len(case.stages) - 1, unique=True))):
        stage = data.draw(st.integers(stage, len(case.stages) - 1))
        schedule[at] = stage
    return schedule


@given(case=cases(), data=st.data())
def test_stop_and_resume_gives_the_identical_continuation(case: Case, data: st.DataObject) -> None:
    with materialise(case):
        rank = data.draw(st.integers(0, case.world_size - 1))
        config = case.config(rank=rank)
        advances = advance_schedule(data, case, LIMIT)
        reference = run(config, LIMIT, advances)
        stop = data.draw(st.integers(0, len(reference)))
        assert run_with_stop(config, LIMIT, stop, advances) == reference


@given(case=cases(), data=st.data())
def test_ranks_together_are_exactly_the_single_rank_sequence(case: Case, data: st.DataObject) -> None:
    with materialise(case):
        world = case.world_size
        rounds = LIMIT // world + 1
        schedule = advance_schedule(data, case, rounds)
        per_rank = [run(case.config(rank=r), rounds, schedule) for r in range(world)]
        assert len({len(batches) for batches in per_rank}) == 1, (
            "every rank yields the same number of batches"
        )
        merged = sorted((b for batches in per_rank for b in batches), key=lambda b: b[0])
        single = run(
            case.config(rank=0, world_size=1), len(merged), {at * world: s for at, s in schedule.items()}
        )
        assert merged == single
        for r, batches in enumerate(per_rank):
            assert all(index % world == r for index, _, _ in batches)


@given(case=cases(max_stages=1), partitions=st.integers(2, 7), data=st.data())
def test_ranks_of_a_world_not_dividing_the_partitions_are_still_exactly_the_sequence(
    case: Case, partitions: int, data: st.DataObject
) -> None:
    for stage in case.stages:
        stage.shuffle = stage.shuffle or (data.draw(st.integers(1, 40)), data.draw(st.integers(1, 4)))
    case.partitions = partitions
    # Every partition of an infinite stage reads each source, which needs a row per partition.
    assume(
        all(
            sum(source.shards) >= partitions
            for stage in case.stages
            if stage.infinite
            for source in stage.sources
        )
    )
    with materialise(case):
        world = case.world_size
        rounds = LIMIT // world + 1
        per_rank = [run(case.config(rank=r), rounds) for r in range(world)]
        merged = sorted((b for batches in per_rank for b in batches), key=lambda b: b[0])
        assert merged == run(case.config(rank=0, world_size=1), len(merged))


@given(case=cases(max_stages=1, infinite=False))
def test_a_finite_stage_delivers_every_row_once_apart_from_the_dropped_round(case: Case) -> None:
    with materialise(case):
        delivered: list[int] = []
        dropped = set()
        for rank in range(case.world_size):
            with open_batch_stream(case.config(rank=rank)) as stream:
                for batch in stream:
                    delivered.extend(batch.arrays()["v"].tolist())
                dropped.add(stream.stats.dropped_rows)
        total = case.rows(0)
        assert len(dropped) == 1
        assert len(delivered) + dropped.pop() == total
        assert len(set(delivered)) == len(delivered), "no row is delivered twice"
        bs = case.stages[0].batch_size
        if case.partitions == 1:
            assert total - len(delivered) < bs * case.world_size + bs
        else:
            # Each partition leaves out less than a batch, and fewer rows of each source than
            # there are partitions go to no partition.
            unheld = case.partitions * len(case.stages[0].sources)
            assert total - len(delivered) < bs * (case.partitions + case.world_size) + unheld


@given(case=cases(max_stages=1, infinite=True))
def test_mix_proportions_hold_within_one_row_on_every_prefix(case: Case) -> None:
    case.stages[0].shuffle = None
    case.partitions = 1
    with materialise(case):
        batches = run(case.config(rank=0, world_size=1), 12)
        sources = np.array([s for _, _, arrays in batches for s in arrays["src"]])
        weights = np.array([s.weight for s in case.stages[0].sources])
        share = weights / weights.sum()
        positions = np.arange(1, len(sources) + 1)[:, None]
        counts = np.cumsum(sources[:, None] == np.arange(len(weights))[None, :], axis=0)
        assert np.all(np.abs(counts - positions * share) <= 1.0 + 1e-9)


@given(case=cases(), data=st.data())
def test_results_do_not_depend_on_threads_or_prefetch(case: Case, data: st.DataObject) -> None:
    with materialise(case):
        rank = data.draw(st.integers(0, case.world_size - 1))
        advances = advance_schedule(data, case, LIMIT)
        base = run(case.config(rank=rank, threads=1, prefetch=0), LIMIT, advances)
        other = run(case.config(rank=rank, threads=8, prefetch=8), LIMIT, advances)
        assert base == other


@given(case=cases(max_stages=2), data=st.data())
def test_drained_rows_are_neither_lost_nor_repeated(case: Case, data: st.DataObject) -> None:
    case.stages[0].infinite = False
    if len(case.stages) == 1:
        case.stages.append(case.stages[0])
    with materialise(case):
        config = case.config(rank=0, world_size=1)
        at = data.draw(st.integers(1, 12))
        # A partitioned stream switches where every partition has read the same rows.
        parts = case.partitions
        switch = -(-at // parts) * parts
        # Every partition drains a window of at most 40 rows.
        limit = switch + 40 * parts
        batches = run(config, limit, {at: 1})
        stage0 = [
            i for _, _, arrays in batches for i, s in zip(arrays["id"], arrays["stg"], strict=True) if s == 0
        ]
        assert len(stage0) == len(set(stage0)), "a drained row came twice"
        first_stage = case.stages[0]
        total = case.rows(0)
        bs = first_stage.batch_size
        consumed = min(switch * bs, total) // parts
        if first_stage.shuffle and len(batches) >= switch:
            buffer_rows, unit = first_stage.shuffle
            unit = min(unit, buffer_rows)
            window = -(-buffer_rows // unit) * unit
            if parts > 1:
                whole = unit * bs // math.gcd(unit, bs)
                window = -(-window // whole) * whole
            # Partition layout 2: each partition mixes N_j div parts rows of each source.
            per_partition = sum(sum(source.shards) // parts for source in first_stage.sources)
            expected = min(-(-consumed // window) * window, per_partition) * parts
        else:
            expected = consumed * parts
        # Rows of stage 0 after the advance come only from its open windows, and all of them.
        assert len(stage0) == expected or len(batches) < limit
        assert all(stage == 1 for _, stage, _ in batches[switch:])
        assert Counter(stage for _, stage, _ in batches[:switch]) == Counter({0: min(switch, len(batches))})


@given(case=cases(max_stages=1), data=st.data())
def test_skipped_batches_reach_no_rank_and_every_other_batch_stays(case: Case, data: st.DataObject) -> None:
    with materialise(case):
        world = case.world_size
        # Whole rounds where ranks take batches in turn; any range where a ramp shares them.
        unit = 1 if case.stages[0].ramp else world
        first = data.draw(st.integers(0, LIMIT // unit))
        skip = (first * unit, (first + data.draw(st.integers(1, 3))) * unit)
        for rank in range(world):
            config = case.config(rank=rank)
            plain = run(config, LIMIT)
            skipping = run(dataclasses.replace(config, skip_batches=[skip]), LIMIT)
            expected = [b for b in plain if not skip[0] <= b[0] < skip[1]]
            assert all(not skip[0] <= index < skip[1] for index, _, _ in skipping)
            assert len(skipping) >= len(expected)
            assert skipping[: len(expected)] == expected


@given(case=cases(), data=st.data())
def test_switches_placed_ahead_survive_any_stop_without_being_asked_again(
    case: Case, data: st.DataObject
) -> None:
    # Pending switches are the position's (docs/checkpoint.md): a stream resumed from a checkpoint
    # taken anywhere before, between or after them switches at the same global batches.
    with materialise(case):
        rank = data.draw(st.integers(0, case.world_size - 1))
        config = case.config(rank=rank)
        points = sorted(data.draw(st.lists(st.integers(0, LIMIT * case.world_size), max_size=3, unique=True)))
        stages = [data.draw(st.integers(0, len(case.stages) - 1)) for _ in points]
        with open_batch_stream(config) as stream:
            for stage, at in zip(stages, points, strict=True):
                stream.advance(stage, at=at)
            reference = [record(b.batch_index, b.stage, b.arrays()) for b in itertools.islice(stream, LIMIT)]
        stop = data.draw(st.integers(0, len(reference)))
        with open_batch_stream(config) as stream:
            for stage, at in zip(stages, points, strict=True):
                stream.advance(stage, at=at)
            head = [record(b.batch_index, b.stage, b.arrays()) for b in itertools.islice(stream, stop)]
            text = stream.checkpoint().to_json()
        with resume_batch_stream(Checkpoint.from_json(text)) as resumed:
            tail = [
                record(b.batch_index, b.stage, b.arrays()) for b in itertools.islice(resumed, LIMIT - stop)
            ]
        assert head + tail == reference
