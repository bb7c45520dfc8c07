"""The naming-form resume matrix through the torch adapter: ``StatefulDataLoader`` state taken
over a corpus named as ``docs/corpora.md`` recommends loads into a loader built from the same
config (the core runs the same matrix, ``packages/core/tests/test_naming_forms.py``)."""

from __future__ import annotations

from pathlib import Path

import pytest
from o41_testkit.naming import NAMING_FORMS, named_corpus, naming_config
from o41_training_data_torch import O41IterableDataset
from torchdata.stateful_dataloader import StatefulDataLoader


def row_ids(loader: StatefulDataLoader, limit: int = 10_000) -> list[list[int]]:
    out = []
    for batch in loader:
        out.append(batch["row_id"].tolist())
        if len(out) == limit:
            break
    return out


@pytest.mark.parametrize("form", NAMING_FORMS)
def test_a_loader_resumes_from_its_state_whatever_the_naming_form(tmp_path: Path, form: str) -> None:
    config = naming_config(named_corpus(form, tmp_path))
    everything = row_ids(StatefulDataLoader(O41IterableDataset(config), batch_size=None))
    loader = StatefulDataLoader(O41IterableDataset(config), batch_size=None)
    head = row_ids(loader, 3)
    state = loader.state_dict()
    del loader
    resumed = StatefulDataLoader(O41IterableDataset(config), batch_size=None)
    resumed.load_state_dict(state)
    assert head + row_ids(resumed) == everything
    assert len(everything) > 3


@pytest.mark.parametrize("form", ["megatron-idx", "dataset-dict-split"])
def test_the_datasets_own_state_resumes_too(tmp_path: Path, form: str) -> None:
    config = naming_config(named_corpus(form, tmp_path))
    dataset = O41IterableDataset(config)
    everything = [b["row_id"].tolist() for b in dataset]
    taken = O41IterableDataset(config)
    batches = iter(taken)
    head = [next(batches)["row_id"].tolist() for _ in range(2)]
    state = taken.state_dict()
    restored = O41IterableDataset(config)
    restored.load_state_dict(state)
    assert head + [b["row_id"].tolist() for b in restored] == everything
