"""A mixed, packed stage of a Megatron corpus (ids under ``tokens``) and a Hugging Face
``save_to_disk`` corpus (ids under ``input_ids``), mapped onto one field with each source's
``columns``, resumed exactly through ``StatefulDataLoader``."""

from __future__ import annotations

from pathlib import Path

import datasets
import pytest
from o41_testkit.corpora import token_corpus, write_megatron_plain
from o41_training_data import BatchStreamConfig, FileSource, Packing, ProjectedField, Shuffle, Stage
from o41_training_data_torch import O41IterableDataset
from torchdata.stateful_dataloader import StatefulDataLoader

SEQ_LEN = 16


def mixed_config(tmp_path: Path) -> tuple[BatchStreamConfig, set[int]]:
    megatron_docs = token_corpus([9, 3, 17, 5, 12, 7, 2, 11] * 3, first=1)
    (tmp_path / "megatron").mkdir()
    idx = write_megatron_plain(tmp_path / "megatron" / "corpus", megatron_docs)
    hf_docs = token_corpus([4, 13, 6, 8, 21, 3] * 3, first=10_000)
    datasets.Dataset.from_dict({"input_ids": hf_docs}).save_to_disk(str(tmp_path / "hf"), num_shards=2)
    config = BatchStreamConfig(
        fields=[
            ProjectedField("input_ids", "input_ids", "i64", length=SEQ_LEN),
            ProjectedField("segment_ids", "@segment_ids", "i32", length=SEQ_LEN),
        ],
        stages=[
            Stage(
                sources=[
                    FileSource(files=[str(idx)], columns={"input_ids": "tokens"}, weight=2.0),
                    FileSource(files=[str(tmp_path / "hf")], encoding="arrow"),
                ],
                batch_size=2,
                shuffle=Shuffle(buffer_rows=8, unit_rows=1),
                packing=Packing(field="input_ids", seq_len=SEQ_LEN, bins=4),
                infinite=True,
            )
        ],
        seed=11,
        threads=1,
    )
    return config, {t for d in megatron_docs + hf_docs for t in d}


def ids(loader: StatefulDataLoader, count: int) -> list[list[list[int]]]:
    out = []
    for batch in loader:
        out.append(batch["input_ids"].tolist())
        if len(out) == count:
            break
    return out


@pytest.mark.parametrize("workers", [0, 2])
def test_a_mapped_mixed_packed_stage_resumes_exactly_through_torch(tmp_path: Path, workers: int) -> None:
    config, corpus_ids = mixed_config(tmp_path)
    straight = ids(StatefulDataLoader(O41IterableDataset(config), batch_size=None, num_workers=workers), 24)
    delivered = {t for batch in straight for row in batch for t in row if t}
    assert delivered <= corpus_ids
    assert any(t < 10_000 for t in delivered), "the Megatron corpus"
    assert any(t >= 10_000 for t in delivered), "the Hugging Face corpus"
    loader = StatefulDataLoader(O41IterableDataset(config), batch_size=None, num_workers=workers)
    head = ids(loader, 9)
    state = loader.state_dict()
    del loader
    resumed = StatefulDataLoader(O41IterableDataset(config), batch_size=None, num_workers=workers)
    resumed.load_state_dict(state)
    assert head + ids(resumed, 15) == straight
