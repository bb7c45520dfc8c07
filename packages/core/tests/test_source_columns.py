"""A source's column mapping (``columns``) on the Python side: its type, checks and documents.

How the engine reads a mapped source is tested with the engine.
"""

from __future__ import annotations

import dataclasses
import pickle
from typing import Any

import pytest
from o41_training_data import (
    BatchStreamConfig,
    ConfigError,
    FileSource,
    ManifestSource,
    ProjectedField,
    Stage,
)

MAKERS = {
    "files": lambda **kw: FileSource(files=["/d/corpus.idx"], **kw),
    "manifest": lambda **kw: ManifestSource(manifest_uri="/d/m.json", split="train", **kw),
}


@pytest.mark.parametrize("kind", MAKERS)
def test_a_mapping_is_kept_sorted_read_only_and_hashable(kind: str) -> None:
    source = MAKERS[kind](columns={"text": "content", "input_ids": "tokens"})
    assert source.columns == {"input_ids": "tokens", "text": "content"}
    assert list(source.columns or {}) == ["input_ids", "text"]
    with pytest.raises(TypeError):
        source.columns["text"] = "body"  # type: ignore[index]
    same = MAKERS[kind](columns={"input_ids": "tokens", "text": "content"})
    assert source == same
    assert hash(source) == hash(same)
    assert source != MAKERS[kind](columns={"input_ids": "ids", "text": "content"})
    assert pickle.loads(pickle.dumps(source)) == source
    assert dataclasses.replace(source, weight=2.0).columns == source.columns
    assert repr(source.columns) == "{'input_ids': 'tokens', 'text': 'content'}"


@pytest.mark.parametrize("kind", MAKERS)
def test_the_document_names_a_mapping_only_when_there_is_one(kind: str) -> None:
    plain = MAKERS[kind]().to_dict()
    assert "columns" not in plain  # the documents (and fingerprints) of every existing config
    assert MAKERS[kind](columns={}).columns is None
    assert MAKERS[kind](columns={}).to_dict() == plain
    mapped = MAKERS[kind](columns={"input_ids": "tokens"}).to_dict()
    assert mapped == {**plain, "columns": {"input_ids": "tokens"}}


def config(source: dict[str, Any]) -> dict[str, Any]:
    return {
        "fields": [{"name": "tokens", "source": "input_ids", "dtype": "i32", "length": 8}],
        "stages": [
            {"sources": [{"files": ["/d/a.parquet"]}, source], "batch_size": 4},
        ],
    }


@pytest.mark.parametrize("kind", MAKERS)
def test_from_dict_reads_a_mapping(kind: str) -> None:
    source = MAKERS[kind](columns={"input_ids": "tokens"})
    loaded = BatchStreamConfig.from_dict(config(source.to_dict()))
    assert loaded.stages[0].sources[1] == source
    assert BatchStreamConfig.from_dict(loaded.to_dict()) == loaded


@pytest.mark.parametrize(
    ("columns", "option", "words"),
    [
        (["input_ids"], "stages[0].sources[1].columns", "expected a mapping"),
        ({"input_ids": ""}, "stages[0].sources[1].columns['input_ids']", "non-empty string"),
        ({"input_ids": 3}, "stages[0].sources[1].columns['input_ids']", "non-empty string"),
        ({"": "tokens"}, "stages[0].sources[1].columns['']", "non-empty string"),
        ({"input_ids": "@row_id"}, "stages[0].sources[1].columns['input_ids']", "reserved"),
        ({"@segment_ids": "seg"}, "stages[0].sources[1].columns['@segment_ids']", "reserved"),
    ],
)
@pytest.mark.parametrize("kind", MAKERS)
def test_a_bad_mapping_is_named_by_its_path(kind: str, columns: object, option: str, words: str) -> None:
    source = {**MAKERS[kind]().to_dict(), "columns": columns}
    with pytest.raises(ConfigError) as caught:
        BatchStreamConfig.from_dict(config(source))
    assert caught.value.option == option
    assert str(caught.value).startswith(f"invalid {option}: ")
    assert words in str(caught.value)
    # Built in Python, the option is named after the class.
    cls = type(MAKERS[kind]())
    with pytest.raises(ConfigError) as built:
        MAKERS[kind](columns=columns)
    assert built.value.option == option.replace("stages[0].sources[1]", cls.__name__)


def test_a_mapped_source_sits_in_a_stage_like_any_other() -> None:
    stage = Stage(
        sources=[
            FileSource(files=["/d/hf.parquet"]),
            FileSource(files=["/d/megatron.idx"], columns={"input_ids": "tokens"}),
        ],
        batch_size=4,
    )
    built = BatchStreamConfig(
        fields=[ProjectedField(name="tokens", source="input_ids", dtype="i32", length=8)], stages=[stage]
    )
    document = built.to_dict()
    assert [s.get("columns") for s in document["stages"][0]["sources"]] == [None, {"input_ids": "tokens"}]
