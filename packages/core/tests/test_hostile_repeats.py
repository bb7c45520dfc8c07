"""Issue 48, case 18: a source that names one shard twice (two spellings of a file, a Megatron
``.idx`` and its prefix, a ``state.json`` or MDS ``index.json`` listing a file twice) would deliver
every row of it twice; it is refused naming both spellings. Weights are how a source is
upweighted."""

from __future__ import annotations

import json
import os
from pathlib import Path

import datasets  # type: ignore[import-untyped]
import pytest
from o41_testkit import write_shard
from o41_testkit.corpora import token_corpus, write_mds_tokens_plain, write_megatron_plain
from o41_training_data import (
    BatchStreamConfig,
    ConfigError,
    FileSource,
    ProjectedField,
    Stage,
    open_batch_stream,
)

IDS = ProjectedField("ids", "tokens", "i64", length=8)


def config(source: FileSource, field: ProjectedField = IDS) -> BatchStreamConfig:
    return BatchStreamConfig(fields=[field], stages=[Stage(sources=[source], batch_size=1)])


def test_two_spellings_of_one_file_are_refused_naming_both(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    shard = write_shard(tmp_path / "a.jsonl", "jsonl", [{"v": i} for i in range(4)])
    monkeypatch.chdir(tmp_path)
    source = FileSource([str(shard), "./a.jsonl"])
    with pytest.raises(
        ConfigError, match=r"files\[0\] \(.*a\.jsonl\) and files\[1\] \(\./a\.jsonl\) both name it"
    ) as refused:
        open_batch_stream(config(source, ProjectedField("v", "v", "i64")))
    assert refused.value.option == "stages[0].sources[0]"
    assert "larger weight" in str(refused.value)


def test_a_megatron_index_and_its_prefix_are_one_dataset(tmp_path: Path) -> None:
    idx = write_megatron_plain(tmp_path / "corpus", token_corpus([3, 4]))
    with pytest.raises(ConfigError, match=r"files\[0\] .* and files\[1\] .* both name it"):
        open_batch_stream(config(FileSource([str(idx), str(tmp_path / "corpus")], encoding="megatron")))


def test_a_listing_that_names_a_file_twice_is_refused(tmp_path: Path) -> None:
    datasets.Dataset.from_dict({"tokens": token_corpus([3, 4, 5, 6])}).save_to_disk(
        str(tmp_path / "hf"), num_shards=2
    )
    state = tmp_path / "hf" / "state.json"
    document = json.loads(state.read_text())
    document["_data_files"].append(document["_data_files"][0])
    state.write_text(json.dumps(document))
    with pytest.raises(ConfigError, match=r"files\[0\] \(.*hf\) lists it twice"):
        open_batch_stream(config(FileSource([str(tmp_path / "hf")], encoding="arrow")))
    mds = write_mds_tokens_plain(tmp_path / "mds", token_corpus([3, 4, 5, 6]), per_shard=2)
    index = mds / "index.json"
    document = json.loads(index.read_text())
    document["shards"].append(document["shards"][0])
    index.write_text(json.dumps(document))
    with pytest.raises(ConfigError, match="lists it twice"):
        open_batch_stream(config(FileSource([str(mds)], encoding="mds")))


def test_a_symlinked_copy_is_another_file_and_two_sources_may_share_one(tmp_path: Path) -> None:
    shard = write_shard(tmp_path / "a.jsonl", "jsonl", [{"v": i} for i in range(4)])
    os.symlink(shard, tmp_path / "b.jsonl")
    field = ProjectedField("v", "v", "i64")
    # Another name of the file is the user's choice to make, as a copy would be.
    with open_batch_stream(config(FileSource([str(shard), str(tmp_path / "b.jsonl")]), field)) as stream:
        assert sum(b.num_rows for b in stream) == 8
    both = BatchStreamConfig(
        fields=[field],
        stages=[Stage(sources=[FileSource([str(shard)]), FileSource([str(shard)])], batch_size=1)],
    )
    with open_batch_stream(both) as stream:
        assert sum(b.num_rows for b in stream) == 8
