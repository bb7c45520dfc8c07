"""The naming-form resume matrix through the JAX adapter: ``O41JaxIterator.set_state`` with a
state taken over a corpus named as ``docs/corpora.md`` recommends continues exactly (the core
runs the same matrix, ``packages/core/tests/test_naming_forms.py``)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import jax
import numpy as np
import pytest
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P
from o41_testkit.naming import NAMING_FORMS, named_corpus, naming_config
from o41_training_data_jax import O41JaxIterator

jax.config.update("jax_num_cpu_devices", 2)


def row_ids(iterator: Iterator[dict[str, jax.Array]], limit: int = 10_000) -> list[list[int]]:
    out = []
    for batch in iterator:
        out.append(np.asarray(batch["row_id"]).tolist())
        if len(out) == limit:
            break
    return out


@pytest.mark.parametrize("form", NAMING_FORMS)
def test_set_state_resumes_whatever_the_naming_form(tmp_path: Path, form: str) -> None:
    sharding = NamedSharding(jax.make_mesh((2,), ("data",)), P("data"))
    config = naming_config(named_corpus(form, tmp_path))
    with jax.enable_x64(True):  # the ids are i64
        with O41JaxIterator(config, sharding) as iterator:
            everything = row_ids(iterator)
        with O41JaxIterator(config, sharding) as iterator:
            head = row_ids(iterator, 3)
            state = iterator.get_state()
        with O41JaxIterator(config, sharding) as restored:
            restored.set_state(state)
            assert head + row_ids(restored) == everything
    assert len(everything) > 3
