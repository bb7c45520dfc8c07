"""Partitions through the torch adapter (docs/order.md, "Partitions"): a partitioned stream read
by ``DataLoader`` workers is the core's, switches stages where the core does, and resumes from a
``StatefulDataLoader`` state exactly."""

from __future__ import annotations

import pytest
from o41_testkit import ShardWriter
from o41_training_data import BatchStreamConfig, FileSource, ProjectedField, Shuffle, Stage, open_batch_stream
from o41_training_data_torch import O41IterableDataset
from torch.utils.data import DataLoader
from torchdata.stateful_dataloader import StatefulDataLoader


@pytest.fixture
def config(shard: ShardWriter) -> BatchStreamConfig:
    a = [shard("parquet", [{"v": i} for i in range(k, k + 60)]) for k in (0, 60)]
    b = shard("jsonl.gz", [{"v": 1000 + i} for i in range(50)])
    shuffle = Shuffle(buffer_rows=16, unit_rows=2, block_rows=4)
    return BatchStreamConfig(
        fields=[ProjectedField("v", "v", "i64")],
        stages=[
            Stage(
                sources=[FileSource(files=a, weight=2.0), FileSource(files=[b])],
                batch_size=4,
                shuffle=shuffle,
            ),
            Stage(sources=[FileSource(files=[b])], batch_size=4, shuffle=shuffle, infinite=True),
        ],
        threads=1,
        partitions=4,
    )


def core_sequence(config: BatchStreamConfig, advance_at: int, limit: int) -> list[tuple[int, int, list[int]]]:
    out = []
    with open_batch_stream(config) as stream:
        while len(out) < limit:
            if len(out) == advance_at:
                stream.advance(1)
            batch = next(stream)
            out.append((batch.batch_index, batch.stage, batch.arrays()["v"].tolist()))
    return out


@pytest.mark.parametrize("workers", [0, 2])
def test_workers_deliver_the_partitioned_stream_and_switch_where_the_core_does(
    config: BatchStreamConfig, workers: int
) -> None:
    dataset = O41IterableDataset(config)
    got = []
    for batch in DataLoader(dataset, batch_size=None, num_workers=workers):
        got.append((batch["batch_index"], int(batch["stage"]), batch["v"].tolist()))
        if len(got) == 5:
            dataset.advance(1, after=batch)
        if len(got) == 30:
            break
    asked = 5 if workers == 0 else 5 + workers * 2
    expected = core_sequence(config, advance_at=asked, limit=30)
    assert got == expected
    # The switch waits for a multiple of four global batches: every partition has then read
    # the same rows.
    first_new = next(index for index, stage, _ in got if stage == 1)
    assert first_new % 4 == 0
    assert first_new >= asked


def test_a_stateful_loader_resumes_a_partitioned_stream_exactly(config: BatchStreamConfig) -> None:
    def run(loader: StatefulDataLoader, limit: int) -> list[list[int]]:
        out = []
        for batch in loader:
            out.append(batch["v"].tolist())
            if len(out) == limit:
                break
        return out

    everything = run(StatefulDataLoader(O41IterableDataset(config), batch_size=None), 40)
    loader = StatefulDataLoader(O41IterableDataset(config), batch_size=None)
    head = run(loader, 7)
    state = loader.state_dict()
    resumed = StatefulDataLoader(O41IterableDataset(config), batch_size=None)
    resumed.load_state_dict(state)
    assert head + run(resumed, 33) == everything
