"""Forged Parquet schemas that used to kill the process are refused at once: a column nesting
1,000 lists deep (reading), a record nesting 300 deep (saving)."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from o41_testkit import config_for
from o41_training_data import (
    DataError,
    FileSource,
    ProjectedField,
    UnsupportedFormatError,
    iter_shard,
    open_batch_stream,
)


def deep_type(levels: int) -> pa.DataType:
    data_type: pa.DataType = pa.int64()
    for _ in range(levels):
        data_type = pa.list_(data_type)
    return data_type


def deep_value(levels: int) -> object:
    value: object = 1
    for _ in range(levels):
        value = [value]
    return value


def test_a_column_nesting_a_thousand_lists_deep_is_refused_not_a_stack_overflow(tmp_path: Path) -> None:
    path = tmp_path / "deep.parquet"
    table = pa.table(
        {"id": pa.array([1, 2], pa.int64()), "deep": pa.array([deep_value(1000)] * 2, deep_type(1000))}
    )
    pq.write_table(table, path, store_schema=False)
    # Even projecting only the other column: the whole schema is converted at open.
    config = config_for([FileSource([str(path)])], [ProjectedField("id", "id", "i64")], batch_size=1)
    with (
        pytest.raises(
            UnsupportedFormatError,
            match=r"deep\.parquet.*column 'deep\.list' nests \d+ levels deep, more than the 64",
        ),
        open_batch_stream(config) as stream,
    ):
        next(stream)
    with pytest.raises(UnsupportedFormatError, match="more than the 64 supported"):
        list(iter_shard("parquet", str(path)))


def test_the_saver_refuses_a_record_nesting_300_deep(tmp_path: Path) -> None:
    from o41_training_data import DatasetSaver

    saver = DatasetSaver(tmp_path / "out" / "data-manifest-v1.json", data_format="parquet")
    with pytest.raises(DataError, match="nests more than 64 levels deep"):
        saver.save("train", None, [{"deep": deep_value(300)}], shard_id="0")
