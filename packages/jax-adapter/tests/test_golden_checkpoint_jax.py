"""An Orbax checkpoint an earlier release of the JAX adapter wrote still restores, exactly.

``golden/orbax-v1`` was written by ``golden/make_orbax_v1.py`` before the run's checkpoint files
moved into the engine: ``process_0-of-1.json`` in the split form beside its resolved document,
taken at step 6 right after a switch to stage 1. Restoring it through :class:`O41Restore` must
continue with the batches a core stream resumed from the same position delivers.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import jax
import numpy as np
import orbax.checkpoint as ocp
from golden_corpus import STEP, golden_config, upload_corpus
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P
from o41_testkit import data_for
from o41_training_data import open_batch_stream, read_checkpoint, resume_batch_stream
from o41_training_data._local_s3 import LocalS3Server
from o41_training_data_jax import O41JaxIterator, O41Restore

jax.config.update("jax_num_cpu_devices", 2)

GOLDEN = Path(__file__).parent / "golden" / "orbax-v1"


def test_an_orbax_checkpoint_of_an_earlier_release_restores(
    s3_server: LocalS3Server, boto3_client: Any, tmp_path: Path
) -> None:
    upload_corpus(boto3_client, tmp_path / "corpus")
    data = data_for(s3_server)
    directory = tmp_path / "checkpoints"
    shutil.copytree(GOLDEN, directory)  # Orbax may write beside what it restores
    saved = read_checkpoint(directory / str(STEP) / "data" / "process_0-of-1.json")
    assert (saved.next_batch, saved.stage, saved.batches_yielded) == (STEP, 1, STEP)
    # What a core stream delivers from there: stage 1's batches from global batch 6 on.
    with resume_batch_stream(saved, storage=data.storage_config) as stream:
        expected = [next(stream).arrays()["v"].tolist() for _ in range(6)]
    with open_batch_stream(golden_config(), storage=data.storage_config) as stream:
        before = [next(stream).arrays()["v"].tolist() for _ in range(STEP)]
    # Stage 0's drained rows first, then stage 1, which reads c alone (values from 5000).
    assert any(v >= 5000 for batch in expected for v in batch)
    assert not any(v >= 5000 for batch in before for v in batch)

    mesh = jax.make_mesh((2,), ("data",))
    sharding = NamedSharding(mesh, P("data"))
    with (
        O41JaxIterator(golden_config(), sharding, data) as fresh,
        ocp.CheckpointManager(directory) as manager,
    ):
        abstract = {"w": jax.ShapeDtypeStruct((4,), np.float32, sharding=NamedSharding(mesh, P()))}
        restored = manager.restore(
            STEP, args=ocp.args.Composite(state=ocp.args.StandardRestore(abstract), data=O41Restore(fresh))
        )
        assert restored["data"] is fresh
        assert np.asarray(restored["state"]["w"]).tolist() == [0.0, 1.0, 2.0, 3.0]
        assert fresh.position.next_batch == STEP
        assert [np.asarray(next(fresh)["v"]).tolist() for _ in range(6)] == expected
