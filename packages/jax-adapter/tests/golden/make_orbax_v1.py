"""Writes ``orbax-v1/``: an Orbax checkpoint the JAX adapter's handler wrote before the run's
checkpoint files moved into the engine (release of commit 86727a4, 2026-12-07).

Kept beside the fixture to say how it was made; it is not run by the tests (they restore the
committed files). The corpus is :func:`golden_corpus`, uploaded to ``s3://o41/golden/jax-v1/``
of the tests' local S3 server, so the resolved document names no path of this machine.

Run from the repository root: ``uv run python packages/jax-adapter/tests/golden/make_orbax_v1.py``.
"""

from __future__ import annotations

import shutil
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).parent
sys.path.insert(0, str(HERE.parent))

import jax  # noqa: E402

jax.config.update("jax_num_cpu_devices", 2)

import numpy as np  # noqa: E402
import orbax.checkpoint as ocp  # noqa: E402
from golden_corpus import STEP, golden_config, upload_corpus  # noqa: E402
from jax.sharding import NamedSharding  # noqa: E402
from jax.sharding import PartitionSpec as P  # noqa: E402
from o41_testkit import boto3_client_for, data_for  # noqa: E402
from o41_training_data._local_s3 import LocalS3Server  # noqa: E402
from o41_training_data_jax import O41JaxIterator, O41Save  # noqa: E402


def main() -> None:
    with tempfile.TemporaryDirectory() as scratch:
        server = LocalS3Server(
            Path(scratch) / "s3",
            access_key_id="O41GOLDEN",
            secret_access_key="golden-secret-key-0",
            buckets=("o41",),
        )
        server.start()
        try:
            client = boto3_client_for(server)
            try:
                upload_corpus(client, Path(scratch))
            finally:
                client.close()
            mesh = jax.make_mesh((2,), ("data",))
            sharding = NamedSharding(mesh, P("data"))
            target = HERE / "orbax-v1"
            shutil.rmtree(target, ignore_errors=True)
            with O41JaxIterator(golden_config(), sharding, data_for(server)) as iterator:
                for _ in range(STEP):
                    next(iterator)
                iterator.advance(1)  # a switch pending in the saved position
                params = {"w": jax.device_put(np.arange(4, dtype=np.float32), NamedSharding(mesh, P()))}
                with ocp.CheckpointManager(target) as manager:
                    manager.save(
                        STEP,
                        args=ocp.args.Composite(state=ocp.args.StandardSave(params), data=O41Save(iterator)),
                    )
                    manager.wait_until_finished()
        finally:
            server.stop()


if __name__ == "__main__":
    main()
