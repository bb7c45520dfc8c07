"""Every config survives ``to_dict``/``from_dict``, ``to_json`` and a JSON or YAML file exactly.

The configs are drawn over every option of the API (packing, windows, ramps, stacks, skip ranges,
column mappings, ...); :func:`test_the_strategies_draw_every_option` fails when a class gains an
option the strategies below do not draw, so a new option cannot miss the round trip.
"""

from __future__ import annotations

import dataclasses
import json
import os
import pickle
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import given
from hypothesis import strategies as st
from o41_training_data import (
    BatchStreamConfig,
    ConfigError,
    FileSource,
    ManifestSource,
    Packing,
    ProjectedField,
    Ramp,
    Shuffle,
    Stage,
    TokenWindows,
)
from o41_training_data._config import _SOURCE_ENCODINGS, DTYPES
from o41_training_data._limits import LIMITS

U64 = 2**64 - 1

# Names as people write them, with a few that YAML would read as something else unquoted.
names = st.one_of(
    st.text(
        alphabet=st.characters(
            categories=("L", "N", "Pd", "Pc", "Zs"), exclude_characters="\x85\u2028\u2029"
        ),
        min_size=1,
        max_size=8,
    ),
    st.sampled_from(["null", "true", "no", "1.5", "~", "0x10", "a: b", "- x", "#c", "'q'", '"d"']),
)
# A record field a config reads: not a reserved `@` name.
record_names = names.filter(lambda name: not name.startswith("@"))
columns = st.none() | st.dictionaries(record_names, record_names, max_size=3)


def location(relative: bool) -> st.SearchStrategy[str]:
    """A shard or manifest location: relative local paths, or absolute ones and s3:// URIs."""
    part = st.text(alphabet="abcxyz019-_.", min_size=1, max_size=6).filter(lambda p: p not in (".", ".."))
    path = st.lists(part, min_size=1, max_size=3).map("/".join)
    if relative:
        return path
    return st.one_of(path.map(lambda p: f"/data/{p}"), path.map(lambda p: f"s3://bucket/{p}"))


weights = st.integers(1, 1000) | st.floats(min_value=0, exclude_min=True, allow_infinity=False)
pads = st.booleans() | st.integers(-(2**63), U64) | st.floats(allow_nan=False, allow_infinity=False)


@st.composite
def projected_fields(draw: st.DrawFn) -> ProjectedField:
    stack = draw(st.booleans())
    source: str | tuple[str, ...] = (
        tuple(draw(st.lists(names, min_size=1, max_size=3))) if stack else draw(names)
    )
    size = st.integers(1, 4096)
    sizes: dict[str, Any] = draw(
        st.one_of(
            st.just({}),
            size.map(lambda n: {"length": n}),
            st.lists(size, min_size=1, max_size=3).map(lambda s: {"shape": tuple(s)}),
        )
    )
    return ProjectedField(
        name=draw(names.filter(lambda n: "\0" not in n)),
        source=source,
        dtype=draw(st.sampled_from(DTYPES)),
        pad=draw(pads),
        overflow=draw(st.sampled_from(["truncate", "error", "drop"])),
        pad_side=draw(st.sampled_from(["right", "left"])),
        **sizes,
    )


def sources(relative: bool) -> st.SearchStrategy[FileSource | ManifestSource]:
    files = st.builds(
        FileSource,
        files=st.lists(location(relative), min_size=1, max_size=3),
        encoding=st.none() | st.sampled_from(_SOURCE_ENCODINGS),
        weight=weights,
        columns=columns,
    )
    manifests = st.builds(
        ManifestSource,
        manifest_uri=location(relative),
        split=names,
        curriculum_stages=st.none() | st.lists(names, max_size=3),
        weight=weights,
        columns=columns,
    )
    return files | manifests


positive = st.integers(1, U64)
shuffles = st.builds(
    Shuffle, buffer_rows=positive, unit_rows=st.none() | positive, block_rows=st.none() | positive
)
ramps = st.builds(Ramp, start=positive, increment=positive, rows=positive)
seq_lens = st.integers(1, LIMITS["max_seq_len"])
eos_ids = st.none() | st.integers(0, U64)
packings = st.builds(
    Packing,
    field=record_names,
    seq_len=seq_lens,
    bins=st.integers(1, LIMITS["max_bins"]),
    eos_id=eos_ids,
    overflow=st.sampled_from(["split", "drop", "error"]),
)
windows = st.builds(TokenWindows, field=record_names, seq_len=seq_lens, eos_id=eos_ids)


@st.composite
def stages(draw: st.DrawFn, relative: bool = False) -> Stage:
    tokens: dict[str, Any] = draw(
        st.one_of(st.just({}), packings.map(lambda p: {"packing": p}), windows.map(lambda w: {"windows": w}))
    )
    return Stage(
        sources=draw(st.lists(sources(relative), min_size=1, max_size=3)),
        batch_size=draw(positive),
        shuffle=draw(st.none() | shuffles),
        infinite=draw(st.booleans()),
        ramp=draw(st.none() | ramps),
        **tokens,
    )


@st.composite
def skip_ranges(draw: st.DrawFn) -> list[Any]:
    bounds = sorted(set(draw(st.lists(st.integers(0, 10**12), max_size=6))))
    pairs = list(zip(bounds[::2], bounds[1::2], strict=False))
    return [range(a, b) if draw(st.booleans()) else (a, b) for a, b in pairs]


@st.composite
def configs(draw: st.DrawFn, relative: bool = False) -> BatchStreamConfig:
    world_size = draw(st.integers(1, LIMITS["max_world_size"]))
    return BatchStreamConfig(
        fields=draw(st.lists(projected_fields(), min_size=1, max_size=3)),
        stages=draw(st.lists(stages(relative), min_size=1, max_size=3)),
        seed=draw(st.integers(0, U64)),
        threads=draw(st.integers(1, LIMITS["max_threads"])),
        prefetch_batches=draw(st.integers(0, 2**32)),
        rank=draw(st.integers(0, world_size - 1)),
        world_size=world_size,
        memory_limit_bytes=draw(st.none() | positive),
        validation_pass=draw(st.booleans()),
        skip_batches=draw(skip_ranges()),
        partitions=draw(st.integers(1, LIMITS["max_world_size"])),
    )


# The options each strategy above draws: a class that gains one fails the test below.
DRAWN: dict[type, set[str]] = {
    ProjectedField: {"name", "source", "dtype", "length", "shape", "pad", "overflow", "pad_side"},
    FileSource: {"files", "encoding", "weight", "columns"},
    ManifestSource: {"manifest_uri", "split", "curriculum_stages", "weight", "columns"},
    Shuffle: {"buffer_rows", "unit_rows", "block_rows"},
    Ramp: {"start", "increment", "rows"},
    Packing: {"field", "seq_len", "bins", "eos_id", "overflow"},
    TokenWindows: {"field", "seq_len", "eos_id"},
    Stage: {"sources", "batch_size", "shuffle", "infinite", "ramp", "packing", "windows"},
    BatchStreamConfig: {
        "fields",
        "stages",
        "seed",
        "threads",
        "prefetch_batches",
        "rank",
        "world_size",
        "memory_limit_bytes",
        "validation_pass",
        "skip_batches",
        "partitions",
    },
}


@pytest.mark.parametrize("cls", list(DRAWN), ids=lambda cls: cls.__name__)
def test_the_strategies_draw_every_option(cls: type) -> None:
    assert {f.name for f in dataclasses.fields(cls)} == DRAWN[cls]


def through_file(config: BatchStreamConfig, suffix: str, directory: str) -> BatchStreamConfig:
    path = Path(directory) / f"stream{suffix}"
    if suffix == ".json":
        path.write_text(config.to_json())
    else:
        path.write_text(yaml.safe_dump(config.to_dict(), allow_unicode=True))
    return BatchStreamConfig.from_file(path)


@given(configs())
def test_every_config_round_trips_through_its_dict_its_json_and_its_files(config: BatchStreamConfig) -> None:
    again = BatchStreamConfig.from_dict(config.to_dict())
    assert again == config
    assert hash(again) == hash(config)
    assert again.to_dict() == config.to_dict()
    assert BatchStreamConfig.from_dict(json.loads(config.to_json())) == config
    assert pickle.loads(pickle.dumps(config)) == config  # what DataLoader workers receive
    with tempfile.TemporaryDirectory() as directory:
        for suffix in (".json", ".yaml"):
            assert through_file(config, suffix, directory) == config


def with_locations(config: BatchStreamConfig, move: Callable[[str], str]) -> BatchStreamConfig:
    """``config`` with every source's local paths passed through ``move``."""

    def source(s: FileSource | ManifestSource) -> FileSource | ManifestSource:
        if isinstance(s, FileSource):
            return dataclasses.replace(s, files=[move(f) for f in s.files])
        return dataclasses.replace(s, manifest_uri=move(s.manifest_uri))

    stages = [
        dataclasses.replace(stage, sources=[source(s) for s in stage.sources]) for stage in config.stages
    ]
    return dataclasses.replace(config, stages=stages)


@given(configs(relative=True))
def test_relative_paths_stay_as_written_in_memory_and_follow_a_config_file(config: BatchStreamConfig) -> None:
    # In memory (and through from_dict without a base), a relative path is kept as written: the
    # engine resolves it against the working directory when the stream opens.
    assert BatchStreamConfig.from_dict(config.to_dict()) == config
    with tempfile.TemporaryDirectory() as directory:
        folder = os.path.abspath(directory)
        expected = with_locations(config, lambda p: os.path.join(folder, p))
        for suffix in (".json", ".yaml"):
            assert through_file(config, suffix, directory) == expected
        assert BatchStreamConfig.from_dict(config.to_dict(), base_dir=folder) == expected


def test_a_field_given_its_length_equals_the_one_given_its_shape() -> None:
    by_length = ProjectedField(name="t", source="ids", dtype="i32", length=8)
    by_shape = ProjectedField(name="t", source="ids", dtype="i32", shape=(8,))
    assert by_length == by_shape
    assert hash(by_length) == hash(by_shape)
    assert by_length.length == by_shape.length == 8
    assert ProjectedField(name="g", source="g", dtype="f32", shape=(2, 3)).length is None
    # dataclasses.replace passes a field's length and shape back together.
    assert dataclasses.replace(by_length, name="u").shape == (8,)
    with pytest.raises(ConfigError, match="give length or shape, not both"):
        dataclasses.replace(by_length, length=16)


def test_a_packed_and_windowed_document_is_read() -> None:
    # The document of issue 46: `packing` was an unknown key.
    document = {
        "fields": [
            {"name": "tokens", "source": "tokens", "dtype": "i32", "shape": [9]},
            {"name": "segments", "source": "@segment_ids", "dtype": "i32", "length": 9, "pad_side": "left"},
            {"name": "pair", "source": ["a", "b"], "dtype": "i64", "shape": [2, 4], "overflow": "drop"},
        ],
        "stages": [
            {
                "sources": [{"files": ["/d/a.bin"], "columns": {"tokens": "ids"}}],
                "batch_size": 4,
                "packing": {"field": "tokens", "seq_len": 9, "bins": 2, "eos_id": 0},
                "ramp": {"start": 2, "increment": 2, "rows": 100},
            },
            {
                "sources": [{"manifest_uri": "s3://b/m.json", "split": "train"}],
                "batch_size": 4,
                "windows": {"field": "tokens", "seq_len": 8},
            },
        ],
        "validation_pass": True,
        "skip_batches": [[3, 5]],
        "partitions": 4,
    }
    config = BatchStreamConfig.from_dict(document)
    assert config.stages[0].packing == Packing(field="tokens", seq_len=9, bins=2, eos_id=0)
    assert config.stages[0].ramp == Ramp(start=2, increment=2, rows=100)
    assert config.stages[1].windows == TokenWindows(field="tokens", seq_len=8)
    assert config.fields[2].source == ("a", "b")
    assert config.skip_batches == ((3, 5),)
    assert config.partitions == 4
    assert BatchStreamConfig.from_dict(config.to_dict()) == config


@pytest.mark.parametrize(
    ("edit", "option", "words"),
    [
        ({"packing": {"field": "tokens"}}, "stages[0].packing.seq_len", "missing required key"),
        ({"packing": {"field": "t", "seq_len": 8, "bin": 2}}, "stages[0].packing.bin", "unknown key 'bin'"),
        ({"windows": {"field": "t", "seq_len": "long"}}, "stages[0].windows.seq_len", "expected an integer"),
        ({"ramp": {"start": 1, "increment": 1}}, "stages[0].ramp.rows", "missing required key"),
        ({"ramp": {"start": 0, "increment": 1, "rows": 1}}, "stages[0].ramp.start", "between 1"),
        ({"shuffle": {"buffer_rows": 8, "units": 2}}, "stages[0].shuffle.units", "unknown key"),
        ({"colour": "red"}, "stages[0].colour", "expected one of sources, batch_size"),
    ],
)
def test_a_bad_stage_option_is_named_by_its_path(edit: dict[str, Any], option: str, words: str) -> None:
    document = {
        "fields": [{"name": "t", "source": "t", "dtype": "i32", "length": 8}],
        "stages": [{"sources": [{"files": ["/d/a.bin"]}], "batch_size": 4, **edit}],
    }
    with pytest.raises(ConfigError) as caught:
        BatchStreamConfig.from_dict(document)
    assert caught.value.option == option
    assert words in str(caught.value)


@pytest.mark.parametrize(
    ("source", "option"),
    [
        ({"manifest_uri": "/m.json", "split": 3}, "stages[0].sources[0].split"),
        ({"files": ["/a.parquet"], "encoding": "csv"}, "stages[0].sources[0].encoding"),
        ({"files": ["/a.parquet"], "weight": 0}, "stages[0].sources[0].weight"),
    ],
)
def test_a_bad_source_option_is_named_by_its_path(source: dict[str, Any], option: str) -> None:
    document = {
        "fields": [{"name": "t", "source": "t", "dtype": "i32"}],
        "stages": [{"sources": [source], "batch_size": 4}],
    }
    with pytest.raises(ConfigError) as caught:
        BatchStreamConfig.from_dict(document)
    assert caught.value.option == option
