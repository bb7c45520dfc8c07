"""A torch pass over Parquet without a page index reads each projected byte once (issue 47).

The front door the core's ``test_reads_once.py`` checks, as a torch user meets it:
``DataLoader(O41IterableDataset(config), batch_size=None)``, the stream in the trainer's
process, its counters from ``dataset.stats``.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import torch
from o41_training_data import BatchStreamConfig, FileSource, ProjectedField, Shuffle, Stage
from o41_training_data_torch import O41IterableDataset

ROWS, WIDTH, GROUP = 3000, 200, 500


def test_a_shuffled_torch_pass_reads_each_column_chunk_once(tmp_path: Path) -> None:
    values = np.random.default_rng(3).integers(0, 30_000, size=ROWS * WIDTH, dtype=np.int32)
    offsets = pa.array(np.arange(0, ROWS * WIDTH + 1, WIDTH, dtype=np.int32))
    path = tmp_path / "part-0.parquet"
    # pyarrow's defaults but for the row groups: no page index, so every job that reads a row
    # group needs its column chunk whole.
    pq.write_table(
        pa.table({"tokens": pa.ListArray.from_arrays(offsets, values)}), path, row_group_size=GROUP
    )
    metadata = pq.ParquetFile(path).metadata
    chunks = sum(
        metadata.row_group(g).column(0).total_compressed_size for g in range(metadata.num_row_groups)
    )
    config = BatchStreamConfig(
        fields=[ProjectedField("t", "tokens", "i32", length=WIDTH)],
        stages=[
            Stage(
                sources=[FileSource([str(path)])],
                batch_size=16,
                shuffle=Shuffle(buffer_rows=1024),
                infinite=False,
            )
        ],
        threads=2,
        seed=5,
    )
    dataset = O41IterableDataset(config)
    rows = sum(len(batch["t"]) for batch in torch.utils.data.DataLoader(dataset, batch_size=None))
    assert rows == ROWS // 16 * 16
    stats = dataset.stats
    assert stats is not None
    assert sum(s.bytes_read for s in stats.sources) == chunks
