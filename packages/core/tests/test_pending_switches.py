"""Pending curriculum switches live in the position: a checkpoint taken before a requested switch
is reached resumes with it, on any rank, worker share or world size (docs/checkpoint.md)."""

from __future__ import annotations

import dataclasses
import json

import pytest
from o41_testkit import ShardWriter
from o41_training_data import (
    BatchStreamConfig,
    Checkpoint,
    CheckpointError,
    FileSource,
    Stage,
    check_same_place,
    open_batch_stream,
    resolve_batch_stream_config,
    resume_batch_stream,
)
from test_position import curriculum as two_stages


def curriculum(shard: ShardWriter, **kwargs) -> BatchStreamConfig:
    """test_position's two stages, and a third to switch to after the second."""
    two = two_stages(shard, **kwargs)
    harder = shard("parquet", [{"v": 20_000 + i} for i in range(400)], name="harder")
    third = Stage(sources=[FileSource(files=[harder])], batch_size=4, infinite=True)
    return dataclasses.replace(two, stages=[*two.stages, third])


def seen(batches) -> list[tuple[int, int, list[int]]]:
    return [(b.batch_index, b.stage, b.arrays()["v"].tolist()) for b in batches]


def reference(config: BatchStreamConfig, switches: list[tuple[int, int]], n: int):
    """The first ``n`` batches of one uninterrupted stream that places ``switches`` up front."""
    with open_batch_stream(config) as stream:
        for stage, at in switches:
            stream.advance(stage, at=at)
        return seen(next(stream) for _ in range(n))


def test_a_batch_delivered_after_a_request_carries_it_and_resumes_with_it(shard: ShardWriter) -> None:
    config = curriculum(shard)
    expected = reference(config, [(1, 6), (2, 9)], 14)
    assert [stage for _, stage, _ in expected] == [0] * 6 + [1] * 3 + [2] * 5
    with open_batch_stream(config) as stream:
        stream.advance(1, at=6)
        stream.advance(2, at=9)
        batches = [next(stream) for _ in range(10)]
    assert batches[2].position.switches == [(1, 6), (2, 9)]
    assert batches[6].position.switches == [(2, 9)]  # stage 1 is in effect there
    assert batches[9].position.switches == []  # both reached
    for stop in (2, 5, 6, 9):
        with resume_batch_stream(batches[stop].checkpoint()) as resumed:
            assert seen(next(resumed) for _ in range(13 - stop)) == expected[stop + 1 :]


def test_a_switch_requested_after_a_batch_went_out_is_in_that_batchs_checkpoint(
    shard: ShardWriter,
) -> None:
    # A trainer holds the batch it consumes while the loader fetched the next one: the switch
    # is requested after both went out, and the checkpoint of the consumed batch must hold it.
    config = curriculum(shard)
    with open_batch_stream(config) as stream:
        consumed, fetched = next(stream), next(stream)
        assert consumed.position.switches == []
        stream.advance(1)  # at the next batch boundary: global batch 2
        rest = seen(next(stream) for _ in range(4))
        checkpoint = stream.checkpoint(consumed.position)
    assert checkpoint.position.switches == [(1, 2)]
    assert [stage for _, stage, _ in rest] == [1] * 4
    with resume_batch_stream(checkpoint) as resumed:
        assert seen(next(resumed) for _ in range(5)) == seen([fetched]) + rest


def test_checkpoint_documents_hold_switches_in_the_lowest_version_that_can(shard: ShardWriter) -> None:
    config = curriculum(shard)
    with open_batch_stream(config) as stream:
        plain = next(stream).checkpoint()
        stream.advance(1, at=6)
        pending = next(stream).checkpoint()
    assert json.loads(plain.to_json())["version"] == 1
    assert "switches" not in json.loads(plain.to_json())
    document = json.loads(pending.to_json())
    assert (document["version"], document["switches"]) == (3, [{"stage": 1, "at": 6}])
    assert json.loads(plain.to_split()[0])["version"] == 2
    assert json.loads(pending.to_split()[0])["version"] == 4
    assert Checkpoint.from_json(pending.to_json()) == pending
    assert Checkpoint.from_split(pending.to_split()[0], pending.shared_json()) == pending


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (lambda d: d.update(version=1), "version 1 but holds pending switches"),
        (lambda d: d.update(switches=[{"stage": 1, "at": 0}]), "not after the position"),
        (lambda d: d.update(switches=[{"stage": 1, "at": 9}, {"stage": 2, "at": 9}]), "switches\\[1\\]"),
        (lambda d: d.update(switches=[{"stage": 7, "at": 9}]), "names no stage"),
        (lambda d: d.update(switches=[{"stage": 1, "at": 2**62 + 1}]), "beyond any"),
        (lambda d: d.update(switches=[{"stage": 1}]), "malformed"),
    ],
)
def test_a_forged_switch_is_refused_naming_it(shard: ShardWriter, edit, message: str) -> None:
    with open_batch_stream(curriculum(shard)) as stream:
        stream.advance(1, at=6)
        document = json.loads(next(stream).checkpoint().to_json())
    edit(document)
    with pytest.raises(CheckpointError, match=message):
        Checkpoint.from_json(json.dumps(document))


def test_with_switch_keeps_only_requests_the_position_has_not_reached(shard: ShardWriter) -> None:
    with open_batch_stream(curriculum(shard)) as stream:
        position = [next(stream) for _ in range(3)][-1].position  # next_batch 3, stage 0
    assert position.with_switch(1, 2).switches == []  # already passed
    assert position.with_switch(0, 5).switches == []  # the stage in effect there
    twice = position.with_switch(1, 5).with_switch(2, 8)
    assert twice.switches == [(1, 5), (2, 8)]
    assert twice.with_switch(2, 4).switches == [(2, 4)]  # the latest request wins from its batch on
    assert twice.with_switch(1, 8).switches == [(1, 5)]  # stage 1 is in effect at 8 already
    assert position.with_switch(1, 3).switches == [(1, 3)]  # the very next batch


def test_a_moved_checkpoint_switches_at_the_first_new_round_at_or_after_the_request(
    shard: ShardWriter,
) -> None:
    config = curriculum(shard)
    # Rounds of 3 from global batch 4 begin at 4, 7, 10: a switch requested at 9 lands on 10.
    expected = dict((index, (stage, rows)) for index, stage, rows in reference(config, [(1, 10)], 22))
    stops = {}
    for rank in range(2):
        ranked = dataclasses.replace(config, rank=rank, world_size=2)
        with open_batch_stream(ranked) as stream:
            stream.advance(1, at=9)
            stops[f"rank {rank}"] = [next(stream) for _ in range(2)][-1].checkpoint()
    assert {c.next_batch for c in stops.values()} == {4}
    assert all(c.position.switches == [(1, 10)] for c in stops.values())  # rounds of 2: 10
    check_same_place(stops, world_size=3)
    for rank in range(3):
        moved = stops["rank 0"].for_world(rank, 3)
        assert moved.position.switches == [(1, 10)]
        with resume_batch_stream(moved) as resumed:
            for batch in (next(resumed) for _ in range(5)):
                assert (batch.stage, batch.arrays()["v"].tolist()) == expected[batch.batch_index]


def test_ranks_with_different_pending_switches_are_not_moved(shard: ShardWriter) -> None:
    config = curriculum(shard)
    stops = {}
    for rank, at in ((0, 8), (1, 10)):
        with open_batch_stream(dataclasses.replace(config, rank=rank, world_size=2)) as stream:
            stream.advance(1, at=at)
            stops[f"rank {rank}"] = [next(stream) for _ in range(2)][-1].checkpoint()
    with pytest.raises(CheckpointError, match="switching to stage 1 at 10"):
        check_same_place(stops, world_size=4)


def test_the_checkpoint_at_the_start_is_where_a_stream_opens(shard: ShardWriter) -> None:
    config = curriculum(shard, rank=1, world_size=2)
    with open_batch_stream(config) as stream:
        opened = stream.checkpoint()
        expected = seen(next(stream) for _ in range(6))
    start = Checkpoint.at_start(resolve_batch_stream_config(config))
    assert start == opened
    assert (start.next_batch, start.batches_yielded, start.position.switches) == (0, 0, [])
    with resume_batch_stream(start) as resumed:
        assert seen(next(resumed) for _ in range(6)) == expected
    # A switch placed before the first batch: what a stream opened and advanced at once does.
    placed = Checkpoint.from_position(start.position.with_switch(1, 0), start)
    with open_batch_stream(config) as stream:
        stream.advance(1, at=0)
        switched = seen(next(stream) for _ in range(6))
    assert [stage for _, stage, _ in switched] == [1] * 6
    with resume_batch_stream(placed) as resumed:
        assert seen(next(resumed) for _ in range(6)) == switched
    with pytest.raises(CheckpointError, match="malformed resolved config"):
        Checkpoint.at_start("{}")
