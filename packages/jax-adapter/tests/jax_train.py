"""A small jit-ed training loop for the multi-process JAX test: a 2-D mesh over processes, global
batches from O41JaxIterator, an Orbax CheckpointManager every few steps, a curriculum switch, a
validation pass, and a JSON log of every global batch (gathered from all processes) per process.

    XLA_FLAGS=--xla_force_host_platform_device_count=2 python tests/jax_train.py \
        --data DIR --out DIR --checkpoints DIR --steps 12 [--die-at 7] \
        [--coordinator 127.0.0.1:PORT --processes 2 --process-id I] [--check-layouts]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import signal
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import multihost_utils
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P
from o41_training_data import (
    BatchStreamConfig,
    ConfigError,
    FileSource,
    ProjectedField,
    Shuffle,
    Stage,
)

BATCH = 4  # rows per process and step
SEQ = 8
CHECKPOINT_EVERY = 3
ADVANCE_AFTER = 3  # the curriculum switches after this step, on every process
VALIDATE_AFTER = 5


def train_config(data: Path) -> BatchStreamConfig:
    """Stage 0: a shuffled 3:1 mix of Parquet and gzip JSON Lines; stage 1: another source."""
    return BatchStreamConfig(
        fields=[
            ProjectedField("tokens", "tokens", "i32", length=SEQ),
            ProjectedField("mask", "mask", "bool", length=SEQ),
            ProjectedField("id", "id", "i32"),
        ],
        stages=[
            Stage(
                sources=[
                    FileSource(files=sorted(str(p) for p in data.glob("a-*.parquet")), weight=3.0),
                    FileSource(files=[str(data / "b.jsonl.gz")], weight=1.0),
                ],
                batch_size=BATCH,
                shuffle=Shuffle(buffer_rows=32, unit_rows=2),
                infinite=True,
            ),
            Stage(
                sources=[FileSource(files=[str(data / "c.jsonl")])],
                batch_size=BATCH,
                shuffle=Shuffle(buffer_rows=16, unit_rows=1),
                infinite=True,
            ),
        ],
        seed=3,
        threads=1,
    )


def validation_config(data: Path) -> BatchStreamConfig:
    """A finite split: every process steps through it the same number of times."""
    return BatchStreamConfig(
        fields=[
            ProjectedField("tokens", "tokens", "i32", length=SEQ),
            ProjectedField("mask", "mask", "bool", length=SEQ),
            ProjectedField("id", "id", "i32"),
        ],
        stages=[Stage(sources=[FileSource(files=[str(data / "val.jsonl")])], batch_size=BATCH)],
        threads=1,
    )


def gathered(batch: dict[str, jax.Array]) -> dict[str, np.ndarray]:
    """The whole global batch on every process (a collective), to log what the step saw."""
    return {name: np.asarray(multihost_utils.process_allgather(a, tiled=True)) for name, a in batch.items()}


def digest(arrays: dict[str, Any]) -> str:
    return hashlib.sha256(b"".join(np.asarray(arrays[k]).tobytes() for k in sorted(arrays))).hexdigest()[:16]


@jax.jit
def train_step(params: dict[str, jax.Array], batch: dict[str, jax.Array]) -> dict[str, jax.Array]:
    def loss(params: dict[str, jax.Array]) -> jax.Array:
        x = batch["tokens"].astype(jnp.float32) / 100.0
        prediction = x @ params["w"]
        return jnp.mean(jnp.where(batch["mask"].any(axis=1), (prediction - 1.0) ** 2, 0.0))

    grads = jax.grad(loss)(params)
    return {"w": params["w"] - 0.01 * grads["w"]}


def layouts(config: BatchStreamConfig, mesh: Mesh) -> dict[str, Any]:
    """Rows follow the global sequence whatever the mesh order; layouts that cannot are refused."""
    from o41_training_data_jax import O41JaxIterator

    devices = np.array(jax.devices()).reshape(jax.process_count(), -1)
    out: dict[str, Any] = {}
    reversed_mesh = Mesh(devices[::-1], ("data", "model"))
    with O41JaxIterator(config, NamedSharding(reversed_mesh, P("data"))) as it:
        out["reversed"] = {"rank": it.rank, "world": it.world_size, "ids": gathered(next(it))["id"].tolist()}
    # The batch axis over the devices within each process: every process holds every row.
    replicated_mesh = Mesh(devices, ("model", "data"))
    with O41JaxIterator(config, NamedSharding(replicated_mesh, P("data"))) as it:
        batch = next(it)
        out["replicated"] = {"rank": it.rank, "world": it.world_size, "ids": gathered(batch)["id"].tolist()}
    interleaved_mesh = Mesh(devices.T.reshape(-1), ("data",))
    try:
        O41JaxIterator(config, NamedSharding(interleaved_mesh, P("data")))
    except ConfigError as error:
        out["interleaved"] = str(error)
    return out


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--data", type=Path, required=True)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--checkpoints", type=Path, required=True)
    parser.add_argument("--steps", type=int, required=True)
    parser.add_argument("--die-at", type=int, default=0)
    parser.add_argument("--coordinator")
    parser.add_argument("--processes", type=int, default=1)
    parser.add_argument("--process-id", type=int, default=0)
    parser.add_argument("--check-layouts", action="store_true")
    args = parser.parse_args()

    if args.processes > 1:
        jax.distributed.initialize(
            args.coordinator,
            num_processes=args.processes,
            process_id=args.process_id,
            initialization_timeout=60,
        )
    import orbax.checkpoint as ocp
    from o41_training_data_jax import O41JaxIterator, O41Restore, O41Save

    me = jax.process_index()
    mesh = jax.make_mesh((jax.process_count(), 2), ("data", "model"))
    sharding = NamedSharding(mesh, P("data"))
    config = train_config(args.data)
    log = (args.out / f"log-{jax.process_count()}-{me}.jsonl").open("a")

    def write(record: dict[str, Any]) -> None:
        log.write(json.dumps(record) + "\n")
        log.flush()

    if args.check_layouts:
        write({"layouts": layouts(config, mesh)})

    replicated = NamedSharding(mesh, P())
    params = {"w": jax.device_put(np.linspace(-1, 1, SEQ, dtype=np.float32), replicated)}
    iterator = O41JaxIterator(config, sharding)
    manager = ocp.CheckpointManager(args.checkpoints.resolve())
    step = 0
    if manager.latest_step() is not None:
        step = manager.latest_step()
        abstract = {"w": jax.ShapeDtypeStruct((SEQ,), np.float32, sharding=replicated)}
        restored = manager.restore(
            step,
            args=ocp.args.Composite(state=ocp.args.StandardRestore(abstract), data=O41Restore(iterator)),
        )
        params = restored["state"]
        write({"restored": step, "rank": iterator.rank, "world": iterator.world_size})
    while step < args.steps:
        batch = next(iterator)
        step += 1
        params = train_step(params, batch)
        rows = gathered(batch)
        write(
            {
                "step": step,
                "shape": list(batch["tokens"].shape),
                "ids": rows["id"].tolist(),
                "batch": digest(rows),
                "params": digest(params),
            }
        )
        if step == ADVANCE_AFTER:
            iterator.advance(1)
        if step == VALIDATE_AFTER:
            with O41JaxIterator(validation_config(args.data), sharding) as validation:
                ids = [gathered(b)["id"].tolist() for b in validation]
            write({"validation": ids})
        if step % CHECKPOINT_EVERY == 0:
            manager.save(
                step, args=ocp.args.Composite(state=ocp.args.StandardSave(params), data=O41Save(iterator))
            )
            manager.wait_until_finished()
        if step == args.die_at:
            os.kill(os.getpid(), signal.SIGKILL)  # a crash: nothing after the last checkpoint is saved
    iterator.close()
    manager.close()
    log.close()


if __name__ == "__main__":
    main()
