"""Skipping global batches on restart (docs/order.md, "Skipping batches"): the loss-spike
recovery. Skipped batches reach no rank; every other batch keeps its rows and its place; the
skips are in the checkpoint and its fingerprint, so later resumes keep them."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
from o41_testkit import write_shard
from o41_training_data import (
    BatchStreamConfig,
    CheckpointError,
    ConfigError,
    FileSource,
    ProjectedField,
    Ramp,
    Shuffle,
    Stage,
    open_batch_stream,
    resume_batch_stream,
    trace_batches,
)

V = ProjectedField("v", "v", "i64")


def config_of(tmp_path: Path, world_size: int = 2, **stage: object) -> BatchStreamConfig:
    a = write_shard(tmp_path / "a.jsonl", "jsonl", [{"v": i} for i in range(150)])
    b = write_shard(tmp_path / "b.parquet", "parquet", [{"v": 1000 + i} for i in range(90)])
    return BatchStreamConfig(
        fields=[V],
        stages=[
            Stage(
                sources=[FileSource([str(a)], weight=2.0), FileSource([str(b)])],
                batch_size=4,
                shuffle=Shuffle(buffer_rows=16),
                infinite=True,
                **stage,  # type: ignore[arg-type]
            )
        ],
        seed=5,
        threads=1,
        world_size=world_size,
    )


def straight(config: BatchStreamConfig, batches: int) -> dict[int, list[int]]:
    """Global batch -> rows, from every rank of an uninterrupted run."""
    out: dict[int, list[int]] = {}
    for rank in range(config.world_size):
        with open_batch_stream(dataclasses.replace(config, rank=rank)) as stream:
            for _ in range(batches):
                batch = next(stream)
                out.setdefault(batch.batch_index, []).extend(batch.arrays()["v"].tolist())
    return out


def test_skipped_batches_reach_no_rank_and_nothing_else_moves(tmp_path: Path) -> None:
    config = config_of(tmp_path)
    expected = straight(config, 12)
    delivered: dict[int, list[int]] = {}
    later = []
    for rank in range(2):
        with open_batch_stream(dataclasses.replace(config, rank=rank)) as stream:
            for _ in range(3):
                batch = next(stream)
                delivered.setdefault(batch.batch_index, []).extend(batch.arrays()["v"].tolist())
            checkpoint = stream.checkpoint()
        assert checkpoint.next_batch == 6
        with resume_batch_stream(checkpoint, skip_batches=[(8, 12)]) as resumed:
            for _ in range(7):
                batch = next(resumed)
                delivered.setdefault(batch.batch_index, []).extend(batch.arrays()["v"].tolist())
            stats = resumed.stats
            later.append(resumed.checkpoint())
        # Two of this rank's batches passed by: counted as skipped, not as received.
        assert (stats.skipped_batches, stats.skipped_rows) == (2, 8)
        assert stats.batches_yielded == 3 + 7
        assert stats.rows_yielded == 4 * 10
        assert later[-1].batches_yielded == 10
    assert sorted(delivered) == [g for g in range(24) if not 8 <= g < 12]
    assert delivered == {g: rows for g, rows in expected.items() if g in delivered}
    # A later checkpoint keeps the skips (they are in its document and fingerprint).
    assert json.loads(later[0].resolved_json())["skip_batches"] == [[8, 12]]
    assert later[0].fingerprint != checkpoint.fingerprint
    with resume_batch_stream(later[0]) as again:
        assert next(again).batch_index == 2 * 12  # rank 0's 13th local batch: 10 delivered, 2 skipped
    # The trace says which batches were skipped, and still names their rows.
    traced = trace_batches(later[0], range(6, 14))
    assert {r.global_batch for r in traced if r.skipped} == {8, 9, 10, 11}
    assert len(traced) == 8 * 4


def test_a_config_that_lists_skips_applies_them_from_the_start_and_on_resume(tmp_path: Path) -> None:
    config = config_of(tmp_path, world_size=1)
    skipping = dataclasses.replace(config, skip_batches=[range(2, 5), (9, 10)])
    assert skipping.skip_batches == ((2, 5), (9, 10))
    with open_batch_stream(skipping) as stream:
        got = [next(stream).batch_index for _ in range(6)]
    assert got == [0, 1, 5, 6, 7, 8]
    # A checkpoint without skips, resumed with a config that adds one ahead of it.
    with open_batch_stream(config) as stream:
        next(stream)
        checkpoint = stream.checkpoint()
    with resume_batch_stream(
        checkpoint, config=dataclasses.replace(config, skip_batches=[(3, 6)])
    ) as resumed:
        assert [next(resumed).batch_index for _ in range(3)] == [1, 2, 6]
    checkpoint.check(config=dataclasses.replace(config, skip_batches=[(3, 6)]))


def test_a_ramped_stage_skips_any_range(tmp_path: Path) -> None:
    config = config_of(tmp_path, ramp=Ramp(start=2, increment=2, rows=40))
    with open_batch_stream(dataclasses.replace(config, skip_batches=[(3, 4)])) as stream:
        assert [next(stream).batch_index for _ in range(4)] == [0, 1, 2, 4]


def test_skips_that_cannot_be_exact_are_refused_by_name(tmp_path: Path) -> None:
    config = config_of(tmp_path)
    with open_batch_stream(config) as stream:
        for _ in range(3):
            next(stream)
        checkpoint = stream.checkpoint()
    with pytest.raises(CheckpointError, match=r"adds \[4, 8\), which starts before the checkpoint's next"):
        checkpoint.with_skipped_batches([(4, 8)])
    kept = checkpoint.with_skipped_batches([(8, 10)])
    with pytest.raises(CheckpointError, match=r"skips global batches \[8, 10\), which the new"):
        kept.with_skipped_batches([(12, 14)])
    assert kept.with_skipped_batches([(8, 10), (12, 14)]).next_batch == 6
    with pytest.raises(ConfigError, match=r"skip_batches\[0\].*whole rounds of 2.*skip \[8, 12\) instead"):
        resume_batch_stream(checkpoint, skip_batches=[(9, 12)])
    with pytest.raises(ConfigError, match=r"skip_batches\[1\].*starts before the previous range ends"):
        checkpoint.with_skipped_batches([(8, 12), (10, 14)])
    with pytest.raises(ConfigError, match=r"skip_batches\[0\]"):
        BatchStreamConfig(fields=[V], stages=config.stages, skip_batches=[(1, 2, 3)])  # type: ignore[list-item]
    with pytest.raises(ConfigError, match=r"skip_batches\[0\].*is empty"):
        open_batch_stream(dataclasses.replace(config, skip_batches=[(5, 5)]))
