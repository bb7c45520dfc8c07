"""A rank of a large world reads its rows as many short runs over every row group and page of
its Parquet shards; what it delivers must still be exactly its share of the single-rank stream."""

from __future__ import annotations

import numpy as np
import pyarrow.parquet as pq
import pytest
from o41_training_data import (
    BatchStreamConfig,
    FileSource,
    ProjectedField,
    Shuffle,
    Stage,
    open_batch_stream,
)
from o41_training_data._synthetic import token_table, write_parquet

WORLD = 64
LOCAL_BATCHES = 5
BATCH = 8
FIELDS = [
    ProjectedField("tokens", "input_ids", "i32", length=256, pad=0),
    ProjectedField("loss_mask", "loss_mask", "bool", length=256, pad=False),
    ProjectedField("row", "@row_id", "i64"),
]


@pytest.fixture(scope="module")
def shards(tmp_path_factory: pytest.TempPathFactory) -> list[str]:
    """Four shards laid out as the benchmark corpus is: small row groups of small pages with a
    page index, so a rank's rows fall in many pages of every row group."""
    out = tmp_path_factory.mktemp("rank-reads")
    paths = []
    for i in range(4):
        table = token_table(600, seed=i, mean_length=200, max_length=512, first_id=i * 600)
        path = write_parquet(table, out / f"part-{i}.parquet", row_group_rows=128, page_bytes=4096)
        paths.append(str(path))
    meta = pq.ParquetFile(paths[0]).metadata
    assert meta.num_row_groups >= 4
    assert meta.row_group(0).column(1).total_uncompressed_size > 8 * 4096, "many pages a row group"
    return paths


def config(shards: list[str], rank: int, world: int) -> BatchStreamConfig:
    """A 3:1 two-source mix shuffled with the default unit, as ranks of a training run see it."""
    return BatchStreamConfig(
        fields=FIELDS,
        stages=[
            Stage(
                sources=[FileSource(files=shards[:3], weight=3.0), FileSource(files=shards[3:], weight=1.0)],
                batch_size=BATCH,
                shuffle=Shuffle(buffer_rows=512),
                infinite=True,
            )
        ],
        rank=rank,
        world_size=world,
        seed=7,
    )


def batches(config: BatchStreamConfig, count: int) -> dict[int, dict[str, np.ndarray]]:
    """The first `count` batches of a stream, by global batch index."""
    out: dict[int, dict[str, np.ndarray]] = {}
    with open_batch_stream(config) as stream:
        for batch in stream:
            out[batch.batch_index] = {name: array.copy() for name, array in batch.arrays().items()}
            if len(out) == count:
                break
    return out


@pytest.mark.parametrize("rank", [0, 41])
def test_a_world_64_rank_delivers_its_global_batches_of_the_single_rank_stream(
    shards: list[str], rank: int
) -> None:
    mine = batches(config(shards, rank, WORLD), LOCAL_BATCHES)
    assert sorted(mine) == [rank + WORLD * k for k in range(LOCAL_BATCHES)]
    single = batches(config(shards, 0, 1), rank + WORLD * (LOCAL_BATCHES - 1) + 1)
    for index, batch in mine.items():
        for name in ("tokens", "loss_mask", "row"):
            np.testing.assert_array_equal(batch[name], single[index][name], err_msg=f"{name}, {index}")
