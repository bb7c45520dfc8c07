"""Corpora as they are named: a source's ``columns`` maps the names the fields read to the
columns its shards hold them under, so a stage mixes a Megatron corpus (``tokens``), a Hugging
Face one (``input_ids``) and a Parquet one (``ids``) onto one field, in record and token stages,
in every format."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import datasets
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from o41_testkit.corpora import token_corpus, write_mds_tokens_plain, write_megatron_plain
from o41_training_data import (
    BatchStreamConfig,
    CheckpointError,
    ConfigError,
    DataManifest,
    FileSource,
    ManifestSource,
    Packing,
    ProjectedField,
    ProjectionError,
    Shuffle,
    Stage,
    manifest_from_files,
    open_batch_stream,
    resume_batch_stream,
)
from o41_training_data.testing import assert_resumable

WIDTH = 8


def corpora(tmp_path: Path) -> dict[str, tuple[FileSource, list[list[int]]]]:
    """One corpus per format, each naming its ids its own way, as sources mapped onto ``ids``."""
    out: dict[str, tuple[FileSource, list[list[int]]]] = {}
    docs = token_corpus([5, 3, 8, 1, 6, 4], first=1)
    idx = write_megatron_plain(tmp_path / "megatron", docs)
    out["megatron"] = (FileSource(files=[str(idx)], columns={"ids": "tokens"}), docs)
    docs = token_corpus([2, 7, 4, 5], first=100)
    datasets.Dataset.from_dict({"input_ids": docs}).save_to_disk(str(tmp_path / "hf"), num_shards=2)
    out["arrow"] = (
        FileSource(files=[str(tmp_path / "hf")], encoding="arrow", columns={"ids": "input_ids"}),
        docs,
    )
    docs = token_corpus([3, 3, 6], first=200)
    mds = write_mds_tokens_plain(tmp_path / "mds", docs, per_shard=2)
    out["mds"] = (FileSource(files=[str(mds)], encoding="mds", columns={"ids": "tokens"}), docs)
    docs = token_corpus([4, 1, 7, 2, 5], first=300)
    pq.write_table(pa.table({"input_ids": pa.array(docs, pa.list_(pa.int32()))}), tmp_path / "p.parquet")
    out["parquet"] = (FileSource(files=[str(tmp_path / "p.parquet")], columns={"ids": "input_ids"}), docs)
    docs = token_corpus([6, 2, 3], first=400)
    (tmp_path / "j.jsonl").write_text("".join(json.dumps({"token_ids": d}) + "\n" for d in docs))
    out["jsonl"] = (FileSource(files=[str(tmp_path / "j.jsonl")], columns={"ids": "token_ids"}), docs)
    return out


def record_config(sources: list[FileSource], **stage: object) -> BatchStreamConfig:
    return BatchStreamConfig(
        fields=[ProjectedField(name="ids", source="ids", dtype="i64", length=WIDTH, pad=-1)],
        stages=[Stage(sources=sources, batch_size=1, **stage)],  # type: ignore[arg-type]
        threads=1,
    )


def delivered(config: BatchStreamConfig) -> list[list[int]]:
    with open_batch_stream(config) as stream:
        return [[int(t) for t in b.arrays()["ids"][0] if t >= 0] for b in stream]


def test_each_format_reads_its_own_column_name_onto_the_field(tmp_path: Path) -> None:
    for name, (source, docs) in corpora(tmp_path).items():
        assert delivered(record_config([source])) == docs, name


def test_a_mixed_stage_of_every_format_delivers_each_corpus_whole(tmp_path: Path) -> None:
    sources = corpora(tmp_path)
    config = record_config([s for s, _ in sources.values()], shuffle=Shuffle(buffer_rows=8, unit_rows=1))
    got = delivered(config)
    assert sorted(got) == sorted(d for _, docs in sources.values() for d in docs)
    assert_resumable(replace(config, stages=[replace(config.stages[0], batch_size=2)]), batches=6)


def test_a_packed_stage_maps_the_token_field_per_source(tmp_path: Path) -> None:
    sources = corpora(tmp_path)
    picked = [sources[k][0] for k in ("megatron", "arrow", "parquet")]
    config = BatchStreamConfig(
        fields=[
            ProjectedField(name="ids", source="ids", dtype="i64", length=WIDTH),
            ProjectedField(name="segment_ids", source="@segment_ids", dtype="i32", length=WIDTH),
        ],
        stages=[Stage(sources=picked, batch_size=1, packing=Packing(field="ids", seq_len=WIDTH))],
        threads=1,
    )
    with open_batch_stream(config) as stream:
        tokens = sorted(
            int(t) for b in stream for t in b.arrays()["ids"][0][b.arrays()["segment_ids"][0] > 0]
        )
    assert tokens == sorted(t for k in ("megatron", "arrow", "parquet") for d in sources[k][1] for t in d)


def test_a_megatron_token_stage_names_its_field_or_maps_it(tmp_path: Path) -> None:
    # The Megatron reader used to take any Packing.field; its ids are 'tokens', as in records.
    idx = write_megatron_plain(tmp_path / "m", token_corpus([3, 4]))
    fields = [ProjectedField(name="ids", source="input_ids", dtype="i64", length=WIDTH)]
    stage = Stage(sources=[FileSource(files=[str(idx)])], batch_size=1, packing=Packing("input_ids", WIDTH))
    with pytest.raises(
        ProjectionError, match=r"holds its ids under 'tokens'.*columns=\{'input_ids': 'tokens'\}"
    ):
        open_batch_stream(BatchStreamConfig(fields=fields, stages=[stage]))
    mapped = replace(stage, sources=[FileSource(files=[str(idx)], columns={"input_ids": "tokens"})])
    with open_batch_stream(BatchStreamConfig(fields=fields, stages=[mapped])) as stream:
        assert sum(1 for _ in stream) == 1


def test_a_manifest_source_maps_its_columns(tmp_path: Path) -> None:
    docs = token_corpus([3, 5, 2])
    pq.write_table(pa.table({"input_ids": pa.array(docs, pa.list_(pa.int64()))}), tmp_path / "a.parquet")
    manifest = manifest_from_files([str(tmp_path / "a.parquet")], tmp_path / "data-manifest-v1.json")
    assert isinstance(manifest, DataManifest)
    source = ManifestSource(str(tmp_path / "data-manifest-v1.json"), "train", columns={"ids": "input_ids"})
    assert delivered(record_config([source])) == docs  # type: ignore[list-item]


def test_a_missing_column_lists_the_shards_columns_in_every_format(tmp_path: Path) -> None:
    for name, (source, _) in corpora(tmp_path).items():
        wrong = replace(source, columns={"ids": "nope"})
        with pytest.raises(ProjectionError, match="nope") as refused:
            delivered(record_config([wrong]))
        # Each names what the shard (or its record) does hold: the column the mapping meant.
        assert f"{source.columns['ids']}" in str(refused.value).split("(its ")[-1], (name, str(refused.value))


def test_a_name_no_field_reads_is_refused_naming_it(tmp_path: Path) -> None:
    source, _ = corpora(tmp_path)["parquet"]
    typo = replace(source, columns={"idz": "input_ids"})
    with pytest.raises(
        ConfigError, match=r"stages\[0\]\.sources\[0\]\.columns\['idz'\].*the names read are ids"
    ):
        open_batch_stream(record_config([typo]))


def test_the_mapping_is_pinned_and_a_checkpoint_of_another_is_refused(tmp_path: Path) -> None:
    docs = token_corpus([3, 5, 2, 4])
    pq.write_table(
        pa.table(
            {"a": pa.array(docs, pa.list_(pa.int64())), "b": pa.array(docs[::-1], pa.list_(pa.int64()))}
        ),
        tmp_path / "x.parquet",
    )
    config = record_config([FileSource(files=[str(tmp_path / "x.parquet")], columns={"ids": "a"})])
    other = record_config([FileSource(files=[str(tmp_path / "x.parquet")], columns={"ids": "b"})])
    with open_batch_stream(config) as stream:
        first = stream.checkpoint().fingerprint
        next(stream)
        checkpoint = stream.checkpoint()
    with open_batch_stream(other) as stream:
        assert stream.checkpoint().fingerprint != first
    with pytest.raises(CheckpointError, match=r"stages\[0\]\.sources\[0\]\.columns"):
        resume_batch_stream(checkpoint, config=other)
    with resume_batch_stream(checkpoint, config=config) as resumed:
        rest = [[int(t) for t in b.arrays()["ids"][0] if t >= 0] for b in resumed]
    assert rest == docs[1:]
    assert np.array_equal(
        json.loads(checkpoint.to_json())["resolved"]["stages"][0]["sources"][0]["columns"]["ids"], "a"
    )
