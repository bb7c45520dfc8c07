"""Projection of record values onto fixed-shape columns, on every encoding."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest
from o41_testkit import ShardWriter, collect, config_for
from o41_training_data import FileSource, ProjectedField, ProjectionError


def one_batch(shard: ShardWriter, encoding: str, records: list[dict], *fields: ProjectedField, **kw):
    path = shard(encoding, records, **kw)
    batches = collect(config_for([FileSource(files=[path])], fields, batch_size=len(records)))
    assert len(batches) == 1
    return batches[0]


@pytest.mark.parametrize(
    ("dtype", "values", "np_dtype"),
    [
        ("i32", [1, -2, 2**31 - 1], np.int32),
        ("i64", [1, -(2**62), 2**62], np.int64),
        ("f32", [0.5, -1.25, 3.0], np.float32),
        ("f64", [0.1 + 0.2, 1e-300, -2.5], np.float64),
        ("bool", [True, False, True], np.uint8),
    ],
)
def test_scalar_dtypes(shard: ShardWriter, encoding: str, dtype: str, values: list, np_dtype: type) -> None:
    records = [{"v": v} for v in values]
    batch = one_batch(shard, encoding, records, ProjectedField(name="out", source="v", dtype=dtype))
    assert batch["out"].dtype == np_dtype
    assert batch["out"].shape == (3,)
    np.testing.assert_array_equal(batch["out"], np.array(values).astype(np_dtype))


def test_f64_keeps_double_precision(shard: ShardWriter, encoding: str) -> None:
    value = 0.1 + 0.2  # not representable in f32
    batch = one_batch(shard, encoding, [{"v": [value, 1 / 3]}], ProjectedField("x", "v", "f64", length=2))
    assert batch["x"][0, 0] == value
    assert batch["x"][0, 1] == 1 / 3


def test_pad_and_truncate_one_axis(shard: ShardWriter, encoding: str) -> None:
    records = [{"t": [1, 2, 3, 4, 5, 6]}, {"t": [7]}, {"t": []}]
    batch = one_batch(shard, encoding, records, ProjectedField("t", "t", "i32", length=4, pad=-1))
    np.testing.assert_array_equal(batch["t"], [[1, 2, 3, 4], [7, -1, -1, -1], [-1, -1, -1, -1]])


def test_bool_lists_are_uint8_with_bool_pad(shard: ShardWriter, encoding: str) -> None:
    records = [{"m": [True, False]}, {"m": [False, True, True, True]}]
    batch = one_batch(shard, encoding, records, ProjectedField("m", "m", "bool", length=3, pad=True))
    assert batch["m"].dtype == np.uint8
    np.testing.assert_array_equal(batch["m"], [[1, 0, 1], [0, 1, 1]])


def test_nested_shape_pads_and_truncates_every_axis(shard: ShardWriter, encoding: str) -> None:
    records = [
        {"g": [[1, 2, 3], [4]]},  # inner axis truncated, then padded
        {"g": [[5], [6], [7]]},  # outer axis truncated
        {"g": [[8, 9]]},  # outer axis padded
    ]
    batch = one_batch(shard, encoding, records, ProjectedField("g", "g", "i64", shape=(2, 2), pad=0))
    assert batch["g"].shape == (3, 2, 2)
    np.testing.assert_array_equal(batch["g"], [[[1, 2], [4, 0]], [[5, 0], [6, 0]], [[8, 9], [0, 0]]])


def test_three_axes(shard: ShardWriter, encoding: str) -> None:
    records = [{"c": [[[1, 2], [3]], [[4, 5, 6]]]}]
    batch = one_batch(shard, encoding, records, ProjectedField("c", "c", "f32", shape=(2, 2, 2), pad=0.5))
    expected = [[[[1, 2], [3, 0.5]], [[4, 5], [0.5, 0.5]]]]
    np.testing.assert_array_equal(batch["c"], np.array(expected, dtype=np.float32))


def test_unprojected_fields_are_ignored(shard: ShardWriter, encoding: str) -> None:
    records = [{"text": "hello", "meta": {"k": [1, 2]}, "t": [3]}, {"text": "x", "meta": {}, "t": [4]}]
    batch = one_batch(shard, encoding, records, ProjectedField("t", "t", "i32", length=1))
    assert list(batch) == ["t"]
    np.testing.assert_array_equal(batch["t"], [[3], [4]])


def test_integers_widen_into_float_columns(shard: ShardWriter, encoding: str) -> None:
    batch = one_batch(shard, encoding, [{"v": [1, 2]}], ProjectedField("v", "v", "f32", length=2))
    np.testing.assert_array_equal(batch["v"], np.array([[1.0, 2.0]], dtype=np.float32))


@pytest.mark.parametrize(
    ("records", "field", "message"),
    [
        ([{"t": [1]}, {"t": ["a"]}], ProjectedField("t", "t", "i32", length=2), "string"),
        ([{"t": [1]}, {"t": [[1, 2]]}], ProjectedField("t", "t", "i32", length=2), "deeper"),
        ([{"t": [1]}, {"t": [1.5]}], ProjectedField("t", "t", "i32", length=2), "float"),
        ([{"t": 1}, {"t": 2**40}], ProjectedField("t", "t", "i32"), "fit"),
        ([{"t": [True]}, {"t": [2]}], ProjectedField("t", "t", "bool", length=1), "fit"),
        ([{"t": [1]}, {"t": None}], ProjectedField("t", "t", "i32", length=1), "null"),
        ([{"t": 1}, {"u": 1}], ProjectedField("t", "t", "i32"), "no such field"),
    ],
)
def test_wrong_values_name_shard_row_and_field(
    shard: ShardWriter, records: list[dict], field: ProjectedField, message: str
) -> None:
    # Self-describing encodings carry per-record types; the second record is the bad one.
    for encoding in ["jsonl", "jsonl.gz", "msgpack"]:
        path = shard(encoding, records)
        config = config_for([FileSource(files=[path])], [field], batch_size=1)
        with pytest.raises(ProjectionError, match=message) as info:
            collect(config)
        assert info.value.path == path
        assert info.value.row == 1
        assert info.value.field == "t"
        assert "row 1" in str(info.value)
        assert path in str(info.value)


def test_parquet_column_of_the_wrong_type_fails_at_open(shard: ShardWriter) -> None:
    path = shard("parquet", [{"t": "text"}])
    with pytest.raises(ProjectionError, match="Utf8.* i32 is declared") as info:
        collect(config_for([FileSource(files=[path])], [ProjectedField("t", "t", "i32")], batch_size=1))
    assert info.value.path == path


def test_parquet_null_is_an_error_not_a_zero(shard: ShardWriter) -> None:
    schema = pa.schema([("t", pa.list_(pa.int32()))])
    path = shard("parquet", [{"t": [1]}, {"t": None}], schema=schema)
    with pytest.raises(ProjectionError, match="null") as info:
        collect(
            config_for([FileSource(files=[path])], [ProjectedField("t", "t", "i32", length=1)], batch_size=1)
        )
    assert info.value.row == 1


@pytest.mark.parametrize(
    "arrow_type", [pa.int8(), pa.int16(), pa.int64(), pa.uint8(), pa.uint16(), pa.uint32(), pa.uint64()]
)
def test_parquet_integer_widths_project_to_i64(shard: ShardWriter, arrow_type: pa.DataType) -> None:
    schema = pa.schema([("v", pa.large_list(arrow_type))])
    path = shard("parquet", [{"v": [1, 2, 3]}, {"v": [100]}], schema=schema)
    batches = collect(
        config_for([FileSource(files=[path])], [ProjectedField("v", "v", "i64", length=2)], batch_size=2)
    )
    np.testing.assert_array_equal(batches[0]["v"], [[1, 2], [100, 0]])


def test_parquet_fixed_size_list_source(shard: ShardWriter) -> None:
    schema = pa.schema([("v", pa.list_(pa.float64(), 3))])
    path = shard("parquet", [{"v": [1.0, 2.0, 3.0]}], schema=schema)
    batches = collect(
        config_for([FileSource(files=[path])], [ProjectedField("v", "v", "f64", length=4)], batch_size=1)
    )
    np.testing.assert_array_equal(batches[0]["v"], [[1.0, 2.0, 3.0, 0.0]])
