"""Bad input fails at open, with errors from the documented hierarchy naming what is at fault."""

from __future__ import annotations

import struct
from pathlib import Path

import pytest
from o41_testkit import ShardWriter, config_for
from o41_training_data import (
    BatchStreamConfig,
    ConfigError,
    FileSource,
    MalformedShardError,
    O41Error,
    ObjectNotFoundError,
    Packing,
    ProjectedField,
    ProjectionError,
    Shuffle,
    Stage,
    StreamRules,
    TokenWindows,
    open_batch_stream,
)

ID = ProjectedField("id", "id", "i64")


def test_missing_file(shard: ShardWriter, tmp_path: Path) -> None:
    good = shard("parquet", [{"id": 1}])
    missing = str(tmp_path / "nope.parquet")
    with pytest.raises(ObjectNotFoundError) as info:
        open_batch_stream(config_for([FileSource(files=[good, missing])], [ID]))
    assert isinstance(info.value, FileNotFoundError)
    assert info.value.path == missing
    assert missing in str(info.value)


def test_unknown_encoding(shard: ShardWriter) -> None:
    path = shard("jsonl", [{"id": 1}])
    with pytest.raises(ConfigError, match="unknown encoding 'csv'") as info:
        open_batch_stream(config_for([FileSource(files=[path], encoding="csv")], [ID]))  # type: ignore[arg-type]
    assert info.value.option == "stages[0].sources[0].encoding"


def test_encoding_that_cannot_be_inferred(tmp_path: Path) -> None:
    path = tmp_path / "data.bin"
    path.write_bytes(b"")
    with pytest.raises(ConfigError, match="data.bin") as info:
        open_batch_stream(config_for([FileSource(files=[str(path)])], [ID]))
    assert info.value.option == "stages[0].sources[0].files[0]"


@pytest.mark.parametrize("encoding", ["parquet", "jsonl", "jsonl.gz", "msgpack"])
def test_projected_field_missing_from_a_source(shard: ShardWriter, encoding: str) -> None:
    good = shard("parquet", [{"id": 1, "x": 1}])
    bad = shard(encoding, [{"id": 1}])
    field = ProjectedField("x", "x", "i32")
    with pytest.raises(ProjectionError, match="'x'") as info:
        open_batch_stream(config_for([FileSource(files=[good]), FileSource(files=[bad])], [field]))
    assert info.value.path == bad
    assert info.value.field == "x"


def test_wrong_type_in_the_first_record_fails_at_open(shard: ShardWriter) -> None:
    path = shard("jsonl.gz", [{"id": "one"}])
    with pytest.raises(ProjectionError, match="string"):
        open_batch_stream(config_for([FileSource(files=[path])], [ID]))


def test_empty_source(shard: ShardWriter) -> None:
    path = shard("jsonl", [])
    with pytest.raises(ConfigError, match="no records") as info:
        open_batch_stream(config_for([FileSource(files=[path])], [ID]))
    assert info.value.option == "stages[0].sources[0]"


def test_malformed_shards(tmp_path: Path) -> None:
    bad_json = tmp_path / "bad.jsonl"
    bad_json.write_text('{"id": 1\n')
    with pytest.raises(MalformedShardError, match="bad.jsonl, row 0"):
        open_batch_stream(config_for([FileSource(files=[str(bad_json)])], [ID]))
    truncated = tmp_path / "cut.msgpack"
    truncated.write_bytes(struct.pack("<I", 100) + b"\x81")
    with pytest.raises(MalformedShardError, match="cut.msgpack"):
        open_batch_stream(config_for([FileSource(files=[str(truncated)])], [ID]))
    not_parquet = tmp_path / "junk.parquet"
    not_parquet.write_bytes(b"definitely not parquet")
    with pytest.raises(MalformedShardError, match="junk.parquet"):
        open_batch_stream(config_for([FileSource(files=[str(not_parquet)])], [ID]))


@pytest.mark.parametrize(
    ("kwargs", "option"),
    [
        ({"batch_size": 0}, "stages[0].batch_size"),
        ({"threads": 0}, "threads"),
        ({"rank": 2, "world_size": 2}, "rank"),
        ({"shuffle": Shuffle(buffer_rows=0)}, "stages[0].shuffle.buffer_rows"),
        ({"shuffle": Shuffle(buffer_rows=8, unit_rows=0)}, "stages[0].shuffle.unit_rows"),
    ],
)
def test_config_errors_name_the_option(shard: ShardWriter, kwargs: dict, option: str) -> None:
    path = shard("parquet", [{"id": 1}])
    with pytest.raises(ConfigError) as info:
        open_batch_stream(config_for([FileSource(files=[path])], [ID], **kwargs))
    assert info.value.option == option
    assert option in str(info.value)


def test_a_rule_between_options_is_the_engines_and_names_the_option(shard: ShardWriter) -> None:
    # The config objects check types and ranges; packing with windows is refused by the engine
    # (the one place the rule lives), at open and wherever the engine reads the config.
    tokens = ProjectedField("tokens", "ids", "i32", length=8)
    stage = Stage(
        sources=[FileSource(files=[shard("jsonl", [{"ids": [1, 2, 3]}])])],
        batch_size=2,
        packing=Packing(field="ids", seq_len=8),
        windows=TokenWindows(field="ids", seq_len=8),
    )
    config = BatchStreamConfig(fields=[tokens], stages=[stage])
    for read in (open_batch_stream, StreamRules.of):
        with pytest.raises(ConfigError, match="either packs documents or cuts windows") as info:
            read(config)
        assert info.value.option == "stages[0].windows"


def test_field_config_errors(shard: ShardWriter) -> None:
    with pytest.raises(ConfigError, match="unknown dtype"):
        ProjectedField("x", "x", "u16")  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="not both"):
        ProjectedField("x", "x", "i32", length=2, shape=(3,))
    # Both, where they agree, are one field: what dataclasses.replace passes back.
    assert ProjectedField("x", "x", "i32", length=2, shape=(2,)) == ProjectedField("x", "x", "i32", length=2)
    path = shard("parquet", [{"id": 1}])
    for field, option in [
        (ProjectedField("x", "id", "i32", pad=1.5), "fields[0].pad"),
        (ProjectedField("x", "id", "i32", shape=(2, 0)), "fields[0].shape"),
    ]:
        with pytest.raises(ConfigError) as info:
            open_batch_stream(config_for([FileSource(files=[path])], [field]))
        assert info.value.option == option
    with pytest.raises(ConfigError, match="already projected"):
        open_batch_stream(config_for([FileSource(files=[path])], [ID, ProjectedField("y", "id", "i32")]))


def test_errors_form_one_hierarchy() -> None:
    assert issubclass(ConfigError, O41Error)
    assert issubclass(ConfigError, ValueError)
    assert issubclass(ProjectionError, O41Error)
    assert issubclass(ProjectionError, ValueError)
    assert issubclass(ObjectNotFoundError, FileNotFoundError)
    assert issubclass(ObjectNotFoundError, O41Error)
