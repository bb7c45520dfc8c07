"""Every naming form ``docs/corpora.md`` recommends resumes with its config: the same-stream
check compares what each entry named (a Megatron ``.idx`` or prefix, a dataset directory), not
the shards it resolved to. The adapters run the same matrix through their own front doors."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from o41_testkit.naming import NAMING_FORMS, named_corpus, naming_config
from o41_training_data import (
    BatchStreamConfig,
    Checkpoint,
    CheckpointError,
    FileSource,
    open_batch_stream,
    resume_batch_stream,
)


def rows(batches: list) -> list[list[int]]:
    return [b.arrays()["row_id"].tolist() for b in batches]


@pytest.mark.parametrize("form", NAMING_FORMS)
def test_a_stream_resumes_with_its_config_whatever_the_naming_form(tmp_path: Path, form: str) -> None:
    config = naming_config(named_corpus(form, tmp_path))
    with open_batch_stream(config) as stream:
        everything = [b.arrays()["row_id"].tolist() for b in stream]
    with open_batch_stream(config) as stream:
        head = [next(stream).arrays()["row_id"].tolist() for _ in range(3)]
        checkpoint = Checkpoint.from_json(stream.checkpoint().to_json())
    checkpoint.check(config=config)
    with resume_batch_stream(checkpoint, config=config) as resumed:
        rest = [b.arrays()["row_id"].tolist() for b in resumed]
    assert head + rest == everything
    assert len(everything) > 3


@pytest.mark.parametrize("form", NAMING_FORMS)
def test_another_name_is_still_refused_naming_both(tmp_path: Path, form: str) -> None:
    config = naming_config(named_corpus(form, tmp_path / "a"))
    other = naming_config(named_corpus(form, tmp_path / "b"))
    with open_batch_stream(config) as stream:
        next(stream)
        checkpoint = stream.checkpoint()
    with pytest.raises(CheckpointError, match=r"stages\[0\]\.sources\[0\]: the file list changed") as refused:
        resume_batch_stream(checkpoint, config=other)
    named = other.stages[0].sources[0]
    assert isinstance(named, FileSource)
    assert str(tmp_path / "b") in str(refused.value)


def test_a_directory_rewritten_after_the_checkpoint_resumes_what_it_read(tmp_path: Path) -> None:
    # As a manifest republished after a checkpoint: the names are compared, the pinned shards read.
    source = named_corpus("save-to-disk", tmp_path)
    config = naming_config(source)
    with open_batch_stream(config) as stream:
        everything = rows(list(stream))
    with open_batch_stream(config) as stream:
        head = [next(stream).arrays()["row_id"].tolist() for _ in range(2)]
        checkpoint = stream.checkpoint()
    state = Path(source.files[0]) / "state.json"
    document = json.loads(state.read_text())
    document["_data_files"] = document["_data_files"][:1]
    state.write_text(json.dumps(document))
    with resume_batch_stream(checkpoint, config=config) as resumed:
        assert head + rows(list(resumed)) == everything


def test_a_document_from_before_names_were_recorded_still_checks_them(tmp_path: Path) -> None:
    # Documents written before this change hold no names: a Megatron entry is matched by the
    # file it is known by, a directory by the shards under it.
    for form in ("megatron-idx", "megatron-prefix", "save-to-disk", "mds-directory"):
        config = naming_config(named_corpus(form, tmp_path / form))
        with open_batch_stream(config) as stream:
            next(stream)
            document = json.loads(stream.checkpoint().to_json())
        for stage in document["resolved"]["stages"]:
            for source in stage["sources"]:
                assert source.pop("named", None) is not None, form
        old = Checkpoint.from_json(json.dumps(document))
        old.check(config=config)
        moved = BatchStreamConfig(
            fields=config.fields,
            stages=[naming_config(named_corpus(form, tmp_path / f"{form}-other")).stages[0]],
            seed=config.seed,
            threads=1,
        )
        with pytest.raises(CheckpointError, match="the file list changed"):
            old.check(config=moved)


def test_a_missing_dataset_is_reported_by_the_name_the_config_gives(tmp_path: Path) -> None:
    from o41_training_data import ObjectNotFoundError, ProjectedField, Stage

    fields = [ProjectedField(name="ids", source="tokens", dtype="i64", length=4)]
    for name, encoding, missing in [
        ("nope.idx", None, "nope.idx"),
        ("nope", "megatron", "nope.bin"),
        ("nope.bin", "megatron", "nope.bin"),
    ]:
        config = BatchStreamConfig(
            fields=fields,
            stages=[Stage(sources=[FileSource([str(tmp_path / name)], encoding=encoding)], batch_size=1)],  # type: ignore[arg-type]
        )
        with pytest.raises(ObjectNotFoundError, match=rf"{tmp_path / missing}: not found"):
            open_batch_stream(config)
