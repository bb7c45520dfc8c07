"""Encodings and their suffixes are the engine's table, read by every Python layer (issue 50)."""

from __future__ import annotations

import typing
from pathlib import Path

import pytest
from o41_testkit import SUFFIX, write_shard
from o41_training_data import (
    BatchStreamConfig,
    FileSource,
    ProjectedField,
    Stage,
    _core,
    resolve_batch_stream_config,
)
from o41_training_data._config import Encoding
from o41_training_data._manifest_build import encoding_of

# Encodings a manifest does not list: `.bin` token streams (and a Megatron dataset's `.bin`,
# which its `.idx` names).
NOT_IN_MANIFESTS = {"bin"}


def test_the_config_types_every_encoding_the_engine_reads() -> None:
    assert typing.get_args(Encoding) == tuple(_core.encodings())


@pytest.mark.parametrize(("suffix", "encoding"), _core.encoding_suffixes())
def test_the_manifest_builder_infers_each_suffix_as_the_engine_does(suffix: str, encoding: str) -> None:
    expected = None if encoding in NOT_IN_MANIFESTS else encoding
    assert encoding_of(f"data/shard-00001{suffix}") == expected


@pytest.mark.parametrize("encoding", sorted(SUFFIX))
def test_the_testkit_names_shards_the_engine_infers_back(tmp_path: Path, encoding: str) -> None:
    path = write_shard(tmp_path / f"shard{SUFFIX[encoding]}", encoding, [{"v": 1}])
    config = BatchStreamConfig(
        fields=[ProjectedField("v", "v", "i64")],
        stages=[Stage(sources=[FileSource([str(path)])], batch_size=1)],
    )
    resolved = resolve_batch_stream_config(config)
    assert resolved["stages"][0]["sources"][0]["shards"][0]["encoding"] == encoding
