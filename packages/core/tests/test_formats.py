"""Shard formats from other writers, every Parquet codec and page format, iter_shard and the writers.

Shards come from anywhere: each standard Parquet codec and page layout written by pyarrow, and
Parquet and JSON Lines written by polars and Parquet written by DuckDB (independent
implementations, each with its own page layouts), must stream.
``iter_shard`` reads through the same engine readers as a stream, so its records and row numbers
agree with the stream's; the saver writes through the engine's writers.
"""

from __future__ import annotations

import gzip
import json
import math
import struct
from pathlib import Path
from typing import Any

import duckdb
import msgpack
import numpy as np
import polars as pl
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import given
from hypothesis import strategies as st
from o41_testkit import SUFFIX, ShardWriter, collect, config_for, rows_of, write_shard
from o41_training_data import (
    DataError,
    FileSource,
    MalformedShardError,
    ProjectedField,
    TrainingData,
    UnsupportedFormatError,
    iter_shard,
    open_batch_stream,
)

ROWS = 300
FIELDS = [
    ProjectedField("x", "x", "i64"),
    ProjectedField("f", "f", "f64"),
    ProjectedField("ids", "ids", "i32", length=4, pad=-1),
]


def table() -> pa.Table:
    return pa.table(
        {
            "x": pa.array(range(ROWS), pa.int64()),
            "f": pa.array([i / 7 for i in range(ROWS)], pa.float64()),
            "ids": pa.array([[i, i + 1, i + 2][: i % 4] for i in range(ROWS)], pa.list_(pa.int32())),
            "name": pa.array([f"row-{i}" for i in range(ROWS)]),
        }
    )


def expected_columns() -> dict[str, np.ndarray]:
    ids = np.full((ROWS, 4), -1, dtype=np.int32)
    for i in range(ROWS):
        row = [i, i + 1, i + 2][: i % 4]
        ids[i, : len(row)] = row
    return {
        "x": np.arange(ROWS, dtype=np.int64),
        "f": np.array([i / 7 for i in range(ROWS)]),
        "ids": ids,
    }


def assert_streams_exactly(path: Path | str) -> None:
    batches = collect(config_for([FileSource(files=[str(path)])], FIELDS, batch_size=ROWS // 4))
    expected = expected_columns()
    for name, column in expected.items():
        assert np.array_equal(rows_of(batches, name), column), name


@pytest.mark.parametrize("codec", ["NONE", "SNAPPY", "GZIP", "BROTLI", "LZ4", "LZ4_RAW", "ZSTD"])
def test_every_standard_codec_written_by_pyarrow_streams(tmp_path: Path, codec: str) -> None:
    path = tmp_path / f"{codec}.parquet"
    pq.write_table(table(), path, compression=codec, row_group_size=100, data_page_size=512)
    assert_streams_exactly(path)
    assert list(iter_shard("parquet", path)) == table().to_pylist()


@pytest.mark.parametrize(
    "layout",
    [
        {"data_page_version": "1.0", "use_dictionary": True},
        {"data_page_version": "1.0", "use_dictionary": False},
        {"data_page_version": "2.0", "use_dictionary": True},
        {"data_page_version": "2.0", "use_dictionary": False},
        {"use_dictionary": False, "use_byte_stream_split": ["f", "x"]},
        {
            "use_dictionary": False,
            "column_encoding": {"x": "DELTA_BINARY_PACKED", "ids": "DELTA_BINARY_PACKED"},
        },
        {"data_page_version": "2.0", "use_dictionary": False, "column_encoding": {"f": "BYTE_STREAM_SPLIT"}},
    ],
    ids=["v1-dict", "v1-plain", "v2-dict", "v2-plain", "byte-stream-split", "delta", "v2-byte-stream-split"],
)
def test_every_page_format_streams(tmp_path: Path, layout: dict[str, Any]) -> None:
    path = tmp_path / "layout.parquet"
    pq.write_table(table(), path, compression="SNAPPY", row_group_size=100, data_page_size=512, **layout)
    assert_streams_exactly(path)


@pytest.mark.parametrize("version", ["V1", "V2"])
@pytest.mark.parametrize("codec", ["uncompressed", "snappy", "gzip", "zstd", "brotli", "lz4_raw"])
def test_parquet_written_by_duckdb_streams(tmp_path: Path, version: str, codec: str) -> None:
    path = tmp_path / f"duckdb-{version}-{codec}.parquet"
    with duckdb.connect() as db:
        db.register("source", table())
        db.execute(
            f"COPY source TO '{path}' "
            f"(FORMAT parquet, COMPRESSION '{codec}', ROW_GROUP_SIZE 100, PARQUET_VERSION {version})"
        )
    if version == "V2":
        # Not pyarrow's layout: delta and byte-stream-split encodings, which the tests above
        # write only when asked.
        chunk = pq.ParquetFile(path).metadata.row_group(0)
        assert {chunk.column(i).path_in_schema: chunk.column(i).encodings[-1] for i in range(3)} == {
            "x": "DELTA_BINARY_PACKED",
            "f": "BYTE_STREAM_SPLIT",
            "ids.list.element": "DELTA_BINARY_PACKED",
        }
    assert_streams_exactly(path)
    assert list(iter_shard("parquet", path)) == table().to_pylist()


@pytest.mark.parametrize("codec", ["uncompressed", "snappy", "gzip", "brotli", "lz4", "zstd"])
def test_parquet_written_by_polars_streams(tmp_path: Path, codec: str) -> None:
    path = tmp_path / f"polars-{codec}.parquet"
    # polars writes list columns as large lists and uses its own Parquet writer.
    pl.from_arrow(table()).write_parquet(path, compression=codec, row_group_size=100)
    assert_streams_exactly(path)
    assert [r["x"] for r in iter_shard("parquet", path)] == list(range(ROWS))


def test_json_lines_written_by_polars_stream(tmp_path: Path) -> None:
    path = tmp_path / "polars.jsonl"
    pl.from_arrow(table()).write_ndjson(path)
    assert_streams_exactly(path)
    assert list(iter_shard("jsonl", path)) == table().to_pylist()


def lzo_shard(path: Path) -> Path:
    """A valid shard whose footer says its column is LZO-compressed: a codec no reader here has.

    pyarrow cannot write LZO, so an uncompressed file's footer is patched. In the Thrift compact
    encoding of the column's metadata, the path ``lzo_column`` is followed by field 4, the codec
    (header byte 0x15), whose zigzag-encoded value changes from 0 (UNCOMPRESSED) to 6 (LZO = 3).
    """
    pq.write_table(pa.table({"lzo_column": list(range(10))}), path, compression="NONE", use_dictionary=False)
    data = path.read_bytes()
    needle = b"\x0alzo_column\x15\x00"
    assert data.count(needle) == 1, "the footer layout is not the expected one"
    path.write_bytes(data.replace(needle, b"\x0alzo_column\x15\x06"))
    assert pq.ParquetFile(path).metadata.row_group(0).column(0).compression == "LZO"
    return path


def test_an_unsupported_codec_has_its_own_error_naming_file_column_and_codec(tmp_path: Path) -> None:
    path = lzo_shard(tmp_path / "old.parquet")
    config = config_for([FileSource(files=[str(path)])], [ProjectedField("v", "lzo_column", "i64")])
    with pytest.raises(UnsupportedFormatError, match=r"old\.parquet.*lzo_column.*LZO") as info:
        open_batch_stream(config)
    assert not isinstance(info.value, MalformedShardError)
    assert info.value.path == str(path)
    with pytest.raises(UnsupportedFormatError, match="LZO"):
        next(iter_shard("parquet", path))


def test_an_unsupported_codec_in_a_column_the_stream_does_not_read_is_no_error(tmp_path: Path) -> None:
    path = tmp_path / "mixed.parquet"
    pq.write_table(
        pa.table({"lzo_column": list(range(10)), "v": list(range(10))}),
        path,
        compression="NONE",
        use_dictionary=False,
    )
    data = path.read_bytes()
    path.write_bytes(data.replace(b"\x0alzo_column\x15\x00", b"\x0alzo_column\x15\x06"))
    batches = collect(
        config_for([FileSource(files=[str(path)])], [ProjectedField("v", "v", "i64")], batch_size=5)
    )
    assert rows_of(batches, "v").tolist() == list(range(10))


# -- iter_shard agrees with a stream's rows and row numbers on every encoding.

record_values = st.lists(
    st.fixed_dictionaries(
        {"v": st.integers(-(2**40), 2**40), "tokens": st.lists(st.integers(0, 2**31 - 1), max_size=6)},
        optional={"extra": st.text(max_size=5), "note": st.none()},
    ),
    min_size=1,
    max_size=40,
)


@given(records=record_values, blank_every=st.integers(0, 5), data=st.data())
def test_iter_shard_agrees_with_a_stream_on_every_encoding(
    tmp_path_factory: pytest.TempPathFactory,
    records: list[dict[str, Any]],
    blank_every: int,
    data: st.DataObject,
) -> None:
    directory = tmp_path_factory.mktemp("agree")
    for encoding in ("parquet", "jsonl", "jsonl.gz", "msgpack"):
        path = directory / f"shard{SUFFIX[encoding]}"
        if encoding == "parquet":
            # Parquet needs one schema: every optional field present, null where absent.
            rows = [{"v": r["v"], "tokens": r["tokens"], "extra": r.get("extra")} for r in records]
            write_shard(path, encoding, rows, row_group_rows=data.draw(st.integers(1, 16)))
        elif encoding in ("jsonl", "jsonl.gz"):
            rows = records
            # Blank lines between records are not records: row numbers skip them.
            lines = []
            for i, record in enumerate(records):
                if blank_every and i % blank_every == 0:
                    lines.append("  \n" if i % 2 else "\n")
                lines.append(json.dumps(record) + "\n")
            text = "".join(lines).encode()
            path.write_bytes(gzip.compress(text) if encoding == "jsonl.gz" else text)
        else:
            rows = records
            write_shard(path, encoding, records)
        got = list(iter_shard(encoding, path))
        assert got == rows, encoding
        fields = [
            ProjectedField("v", "v", "i64"),
            ProjectedField("tokens", "tokens", "i64", length=6, pad=-1),
            ProjectedField("row", "@row", "i64"),
        ]
        streamed = collect(
            config_for([FileSource(files=[str(path)], encoding=encoding)], fields, batch_size=1)
        )
        for k, batch in enumerate(streamed):
            assert batch["row"][0] == k
            assert batch["v"][0] == got[k]["v"]
            tokens = [t for t in batch["tokens"][0].tolist() if t != -1]
            assert tokens == got[k]["tokens"]
        assert len(streamed) == len(got)


def test_iter_shard_refuses_a_frame_that_is_not_a_map_naming_its_row(tmp_path: Path) -> None:
    path = tmp_path / "bare.msgpack"
    with path.open("wb") as out:
        for value in ({"v": 1}, [1, 2], {"v": 3}):
            frame = msgpack.packb(value)
            out.write(struct.pack("<I", len(frame)) + frame)
    records = iter_shard("msgpack", path)
    assert next(records) == {"v": 1}
    with pytest.raises(MalformedShardError, match=r"bare\.msgpack, row 1.*must be a map") as info:
        next(records)
    assert info.value.row == 1


@pytest.mark.parametrize("encoding", ["jsonl", "jsonl.gz"])
def test_iter_shard_names_the_row_of_a_malformed_line(tmp_path: Path, encoding: str) -> None:
    text = b'{"v": 1}\n\n{"v": 2}\n{"v": \n{"v": 4}\n'
    path = tmp_path / f"bad{SUFFIX[encoding]}"
    path.write_bytes(gzip.compress(text) if encoding == "jsonl.gz" else text)
    with pytest.raises(MalformedShardError, match="row 2") as info:
        list(iter_shard(encoding, path))
    assert info.value.row == 2


def test_iter_shard_raises_the_hierarchy_for_corrupt_and_truncated_shards(tmp_path: Path) -> None:
    parquet = tmp_path / "cut.parquet"
    pq.write_table(table(), parquet)
    parquet.write_bytes(parquet.read_bytes()[:-100])
    with pytest.raises(MalformedShardError, match=r"cut\.parquet"):
        list(iter_shard("parquet", parquet))
    gz = tmp_path / "cut.jsonl.gz"
    gz.write_bytes(gzip.compress(b'{"v": 1}\n' * 1000)[:-40])
    with pytest.raises(MalformedShardError, match=r"cut\.jsonl\.gz"):
        list(iter_shard("jsonl.gz", gz))


# -- The saver writes through the engine's writers.


def test_the_saver_refuses_nan_in_json_lines_naming_record_and_field(tmp_path: Path) -> None:
    saver = TrainingData().dataset_saver(tmp_path / "data-manifest-v1.json", data_format="jsonl.gz")
    records = [{"v": 1.0, "m": {"score": [0.5, 1.5]}}, {"v": 2.0, "m": {"score": [0.5, math.nan]}}]
    with pytest.raises(DataError, match=r"shard-0\.jsonl\.gz, record 1, field 'm\.score\[1\]': NaN") as info:
        saver.save("train", None, records, shard_id="0")
    assert (info.value.row, info.value.field) == (1, "m.score[1]")
    assert not list(tmp_path.rglob("*.jsonl.gz")), "nothing is published for a refused shard"
    msgpack_saver = TrainingData().dataset_saver(
        tmp_path / "mp" / "data-manifest-v1.json", data_format="msgpack"
    )
    shard = msgpack_saver.save("train", None, records, shard_id="0")
    got = list(iter_shard("msgpack", tmp_path / "mp" / shard.location))
    assert math.isnan(got[1]["m"]["score"][1])  # MessagePack holds NaN as it is


@pytest.mark.parametrize("data_format", ["parquet", "msgpack", "jsonl.gz"])
def test_saved_shards_are_byte_identical_for_the_same_records(tmp_path: Path, data_format: str) -> None:
    records = [{"v": i, "tokens": list(range(i % 5)), "name": f"r{i}"} for i in range(50)]
    first = (
        TrainingData()
        .dataset_saver(tmp_path / "a" / "m.json", data_format)
        .save("t", None, records, shard_id="0")
    )
    second = (
        TrainingData()
        .dataset_saver(tmp_path / "b" / "m.json", data_format)
        .save("t", None, records, shard_id="0")
    )
    assert first.checksum == second.checksum
    assert (tmp_path / "a" / first.location).read_bytes() == (tmp_path / "b" / second.location).read_bytes()
    assert list(iter_shard(data_format, tmp_path / "a" / first.location)) == records


def test_saved_msgpack_keeps_bytes_and_extreme_integers(tmp_path: Path) -> None:
    records = [{"blob": b"\x00\xff", "big": 2**63 - 1, "neg": -(2**63), "nested": {"k": [True, None]}}]
    saver = TrainingData().dataset_saver(tmp_path / "m.json", "msgpack")
    shard = saver.save("t", None, records, shard_id="0")
    path = tmp_path / shard.location
    assert list(iter_shard("msgpack", path)) == records
    frame_length = struct.unpack("<I", path.read_bytes()[:4])[0]
    assert msgpack.unpackb(path.read_bytes()[4 : 4 + frame_length]) == records[0]


def test_records_the_saver_cannot_type_are_refused_naming_them(tmp_path: Path) -> None:
    saver = TrainingData().dataset_saver(tmp_path / "m.json", "msgpack")
    with pytest.raises(DataError, match="record 1"):
        saver.save("t", None, [{"v": 1}, ["not", "a", "record"]], shard_id="0")
    with pytest.raises(DataError, match="field 'v'"):
        saver.save("t", None, [{"v": 1}, {"v": 2**64 - 1}], shard_id="1")


def test_written_shards_stream_like_foreign_ones(shard: ShardWriter, tmp_path: Path) -> None:
    records = [{"x": i, "f": i / 7, "ids": [i, i + 1, i + 2][: i % 4]} for i in range(ROWS)]
    for data_format in ("parquet", "msgpack", "jsonl.gz"):
        saver = TrainingData().dataset_saver(tmp_path / data_format / "m.json", data_format)
        saved = saver.save("t", None, records, shard_id="0")
        assert_streams_exactly(tmp_path / data_format / saved.location)
