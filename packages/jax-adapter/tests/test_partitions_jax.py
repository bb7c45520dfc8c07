"""Partitions through the JAX iterator (docs/order.md, "Partitions"): the globally sharded
batches are the core's partitioned stream, a stage switch lands where the core's does, and
``set_state`` resumes exactly."""

from __future__ import annotations

from collections.abc import Iterator

import jax
import numpy as np
import pytest
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P
from o41_testkit import ShardWriter
from o41_training_data import BatchStreamConfig, FileSource, ProjectedField, Shuffle, Stage, open_batch_stream
from o41_training_data_jax import O41JaxIterator

jax.config.update("jax_num_cpu_devices", 2)


@pytest.fixture
def config(shard: ShardWriter) -> BatchStreamConfig:
    a = shard("parquet", [{"v": i} for i in range(120)])
    b = shard("jsonl", [{"v": 1000 + i} for i in range(60)])
    c = shard("jsonl", [{"v": 5000 + i} for i in range(80)])
    shuffle = Shuffle(buffer_rows=12, unit_rows=2, block_rows=6)
    return BatchStreamConfig(
        fields=[ProjectedField("v", "v", "i32")],
        stages=[
            Stage(
                sources=[FileSource(files=[a], weight=2.0), FileSource(files=[b])],
                batch_size=4,
                shuffle=shuffle,
                infinite=True,
            ),
            Stage(sources=[FileSource(files=[c])], batch_size=4, shuffle=shuffle, infinite=True),
        ],
        seed=5,
        threads=1,
        partitions=4,
    )


@pytest.fixture
def sharding() -> NamedSharding:
    return NamedSharding(jax.make_mesh((2,), ("data",)), P("data"))


def values(iterator: Iterator[dict[str, jax.Array]], count: int) -> list[list[int]]:
    out = []
    for batch in iterator:
        out.append(np.asarray(batch["v"]).tolist())
        if len(out) == count:
            break
    return out


def core_batches(config: BatchStreamConfig, count: int, advance_after: int) -> list[list[int]]:
    out = []
    with open_batch_stream(config) as stream:
        for batch in stream:
            out.append(batch.arrays()["v"].tolist())
            if len(out) == advance_after:
                stream.advance(1)
            if len(out) == count:
                break
    return out


def test_the_iterator_switches_and_resumes_a_partitioned_stream_exactly(
    config: BatchStreamConfig, sharding: NamedSharding
) -> None:
    expected = core_batches(config, 20, advance_after=5)
    with O41JaxIterator(config, sharding) as iterator:
        first = values(iterator, 5)
        iterator.advance(1)
        middle = values(iterator, 4)
        state = iterator.get_state()
        assert first + middle + values(iterator, 11) == expected
    with O41JaxIterator(config, sharding) as resumed:
        resumed.set_state(state)
        assert values(resumed, 11) == expected[9:]
    # The switch asked after batch 5 lands on global batch 8, a multiple of the partitions; each
    # partition has read two of its 3-batch windows' batches there and drains the third first.
    assert all(v < 5000 for row in expected[:12] for v in row)
    assert all(v >= 5000 for row in expected[12:] for v in row)
