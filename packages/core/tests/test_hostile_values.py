"""Options whose values cannot be delivered are refused naming them: a float pad beyond f32's
range, and an eos id that the shard's token dtype cannot hold (no document would ever end)."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
from o41_testkit import ShardWriter
from o41_training_data import (
    BatchStreamConfig,
    ConfigError,
    FileSource,
    Packing,
    ProjectedField,
    Stage,
    open_batch_stream,
)


def test_a_float_pad_beyond_f32s_range_is_refused(shard: ShardWriter) -> None:
    path = shard("jsonl", [{"v": [1.0]}])
    for pad in (1e40, -1e39):
        config = BatchStreamConfig(
            fields=[ProjectedField("v", "v", "f32", length=4, pad=pad)],
            stages=[Stage(sources=[FileSource([path])], batch_size=1)],
        )
        with pytest.raises(ConfigError, match=r"fields\[0\]\.pad"):
            open_batch_stream(config)
    # In range, it pads as given.
    config = BatchStreamConfig(
        fields=[ProjectedField("v", "v", "f32", length=2, pad=3e38)],
        stages=[Stage(sources=[FileSource([path])], batch_size=1)],
    )
    with open_batch_stream(config) as stream:
        assert next(stream).arrays()["v"].tolist() == [[1.0, np.float32(3e38)]]


def test_an_eos_id_beyond_the_token_dtype_is_refused_naming_it(tmp_path: Path) -> None:
    path = tmp_path / "tokens.bin"
    np.asarray([1, 2, 3, 65535, 4, 5], dtype="<u2").tofile(path)
    (tmp_path / "meta.json").write_text(json.dumps({"dtype": "uint16"}))
    config = BatchStreamConfig(
        fields=[ProjectedField("tokens", "tokens", "i32", length=8)],
        stages=[
            Stage(
                sources=[FileSource([str(path)])],
                batch_size=1,
                packing=Packing(field="tokens", seq_len=8, bins=2, eos_id=70000),
            )
        ],
    )
    with pytest.raises(
        ConfigError, match=r"packing\.eos_id.*eos id 70000 cannot occur in a shard of uint16 ids"
    ):
        open_batch_stream(config)
    (tmp_path / "meta.json").write_text(json.dumps({"dtype": "uint16", "eos_id": 70000}))
    stage = replace(config.stages[0], packing=Packing(field="tokens", seq_len=8, bins=2))
    config = replace(config, stages=[stage])
    with pytest.raises(ConfigError, match=r"meta\.json eos_id.*70000"):
        open_batch_stream(config)


def test_a_uint64_token_id_beyond_i64_is_a_projection_error_naming_the_field(tmp_path: Path) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq
    from o41_training_data import ProjectionError

    path = tmp_path / "tokens.parquet"
    ids = pa.array([[1, 2, 3], [4, 2**63 + 1, 5]], type=pa.list_(pa.uint64()))
    pq.write_table(pa.table({"tokens": ids}), path)
    config = BatchStreamConfig(
        fields=[ProjectedField("tokens", "tokens", "i64", length=8)],
        stages=[
            Stage(sources=[FileSource([str(path)])], batch_size=1, packing=Packing(field="tokens", seq_len=8))
        ],
    )
    # It was a MalformedShardError naming no field: the file is fine, the id does not fit.
    with (
        pytest.raises(ProjectionError, match=r"tokens\.parquet, row 1, field .tokens.") as info,
        open_batch_stream(config) as stream,
    ):
        next(stream)
    assert "9223372036854775809 does not fit i64" in str(info.value)
    assert "field 'tokens'" in str(info.value)


def test_a_messagepack_extension_value_is_named_not_reported_in_serdes_words(tmp_path: Path) -> None:
    import struct

    from o41_training_data import MalformedShardError, ProjectionError, iter_shard

    frame = bytes([0x81, 0xA1, ord("v"), 0xD4, 0x01, 0x02])  # {"v": ext(type 1, b"\x02")}
    path = tmp_path / "ext.msgpack"
    path.write_bytes(struct.pack("<I", len(frame)) + frame)
    config = BatchStreamConfig(
        fields=[ProjectedField("v", "v", "i64")],
        stages=[Stage(sources=[FileSource([str(path)])], batch_size=1)],
    )
    with (
        pytest.raises(ProjectionError, match="found a MessagePack extension value") as info,
        open_batch_stream(config) as stream,
    ):
        next(stream)
    assert "newtype struct" not in str(info.value)
    with pytest.raises(MalformedShardError, match="row 0.*a MessagePack extension value") as shard_info:
        list(iter_shard("msgpack", str(path)))
    assert "newtype struct" not in str(shard_info.value)
