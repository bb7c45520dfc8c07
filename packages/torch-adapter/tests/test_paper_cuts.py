"""Small things a new user meets in the first hour with the torch dataset (issue 46)."""

from __future__ import annotations

import gc
import pickle
from pathlib import Path

import torch
from o41_testkit import write_shard
from o41_training_data import BatchStreamConfig, FileSource, ProjectedField, Stage
from o41_training_data_torch import O41IterableDataset


def dataset_of(tmp_path: Path, rows: int = 40) -> O41IterableDataset:
    path = write_shard(tmp_path / "a.jsonl", "jsonl", [{"v": i} for i in range(rows)])
    return O41IterableDataset(
        BatchStreamConfig(
            fields=[ProjectedField("v", "v", "i64")],
            stages=[Stage(sources=[FileSource([str(path)])], batch_size=4)],
            threads=1,
        )
    )


def test_stats_outlive_a_loop_that_breaks(tmp_path: Path) -> None:
    dataset = dataset_of(tmp_path)
    assert dataset.stats is None  # no stream before iteration
    for step, _ in enumerate(torch.utils.data.DataLoader(dataset, batch_size=None), start=1):
        if step == 3:
            break
    gc.collect()  # whatever still held the loader's iterator, its stream is closed now
    stats = dataset.stats
    assert stats is not None
    assert stats.batches_delivered == 3


def test_stats_outlive_a_pass_that_ends_and_a_closed_iterator(tmp_path: Path) -> None:
    dataset = dataset_of(tmp_path)
    assert sum(1 for _ in dataset) == 10
    stats = dataset.stats
    assert stats is not None
    assert stats.batches_delivered == 10
    iterator = iter(dataset)
    next(iterator)
    next(iterator)
    running = dataset.stats
    assert running is not None
    assert running.batches_delivered == 2
    iterator.close()  # type: ignore[attr-defined]
    closed = dataset.stats
    assert closed is not None
    assert closed.batches_delivered == 2


def test_a_copy_for_another_process_carries_no_stats(tmp_path: Path) -> None:
    dataset = dataset_of(tmp_path)
    assert sum(1 for _ in dataset) == 10
    assert pickle.loads(pickle.dumps(dataset)).stats is None
