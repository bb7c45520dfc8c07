"""A batch Python still holds is never written again: a delivered batch's pooled buffers go back
to the pool only when Python drops its arrays (docs/architecture.md, the memory bound)."""

from __future__ import annotations

import gc

import numpy as np
from o41_testkit import ShardWriter
from o41_training_data import BatchStreamConfig, FileSource, ProjectedField, Shuffle, Stage, open_batch_stream


def test_every_batch_of_an_epoch_held_to_the_end_keeps_its_contents(shard: ShardWriter) -> None:
    rows = [{"ids": list(range(i, i + 1 + i % 13)), "m": [i % 2 == 0] * (i % 5)} for i in range(2_000)]
    files = [shard("parquet", rows[k : k + 500]) for k in range(0, 2_000, 500)]
    config = BatchStreamConfig(
        fields=[
            ProjectedField("ids", "ids", "i32", length=16),
            ProjectedField("m", "m", "bool", length=4),
        ],
        stages=[Stage(sources=[FileSource(files)], batch_size=16, shuffle=Shuffle(buffer_rows=256))],
        threads=2,
        prefetch_batches=4,
        seed=3,
    )
    held, copies, delivered = [], [], 0
    with open_batch_stream(config) as stream:
        for batch in stream:
            delivered += 1
            arrays = batch.arrays()  # views of the engine's buffers, no copy
            if delivered % 2:
                # Every other batch is dropped at once: its buffers go back to the pool and are
                # filled again while the held ones stay lent.
                del arrays, batch
                gc.collect()
                continue
            held.append((arrays, batch.columns))
            copies.append({name: array.copy() for name, array in arrays.items()})
    assert delivered == 2_000 // 16
    assert len(held) == delivered // 2
    for (arrays, columns), expected in zip(held, copies, strict=True):
        for name, array in arrays.items():
            np.testing.assert_array_equal(array, expected[name])
        assert columns.column(0).values.to_numpy().reshape(-1, 16).tolist() == expected["ids"].tolist()
