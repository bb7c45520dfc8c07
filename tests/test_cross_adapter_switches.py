"""A pending curriculum switch is the position's own (docs/checkpoint.md, "Pending switches"), so a
state taken by one adapter with a switch requested and not reached continues exactly in another."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import jax
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
from lightning.pytorch import LightningModule, Trainer
from lightning.pytorch.callbacks import ModelCheckpoint
from o41_training_data import (
    BatchStreamConfig,
    Checkpoint,
    FileSource,
    Position,
    ProjectedField,
    Shuffle,
    Stage,
    SwitchPoint,
    open_batch_stream,
)
from o41_training_data_jax import O41JaxIterator
from o41_training_data_lightning import O41Curriculum, O41DataModule
from o41_training_data_torch import O41IterableDataset

Batches = list[tuple[int, int, list[int]]]


@pytest.fixture
def config(tmp_path: Path) -> BatchStreamConfig:
    paths = []
    for name, base in (("easy", 0), ("hard", 10_000)):
        path = tmp_path / f"{name}.parquet"
        pq.write_table(pa.table({"v": np.arange(base, base + 300, dtype=np.int32)}), path)
        paths.append(str(path))
    return BatchStreamConfig(
        fields=[ProjectedField("v", "v", "i32")],
        stages=[
            Stage(
                sources=[FileSource(files=[path])],
                batch_size=4,
                shuffle=Shuffle(buffer_rows=16),
                infinite=True,
            )
            for path in paths
        ],
        seed=11,
        threads=1,
    )


def reference(config: BatchStreamConfig, at: int, n: int) -> Batches:
    with open_batch_stream(config) as stream:
        stream.advance(1, at=at)
        return [(b.batch_index, b.stage, b.arrays()["v"].tolist()) for b in (next(stream) for _ in range(n))]


def torch_state(checkpoint: Checkpoint) -> dict[str, Any]:
    return {"version": 1, "checkpoint": checkpoint.to_json(), "offset": 0, "stride": 1, "workers": 1}


def lightning_state(checkpoint: Checkpoint) -> dict[str, Any]:
    return {
        "format": "o41-training-data-lightning",
        "version": 2,
        "world_size": 1,
        "resolved": checkpoint.resolved_json(),
        "ranks": [{"position": checkpoint.position.to_json()}],
    }


def from_torch(config: BatchStreamConfig, state: dict[str, Any], n: int) -> Batches:
    dataset = O41IterableDataset(config)
    dataset.load_state_dict(state)
    got = []
    for batch in torch.utils.data.DataLoader(dataset, batch_size=None):
        got.append((batch["batch_index"], batch["stage"], batch["v"].tolist()))
        if len(got) == n:
            return got
    return got


def from_jax(config: BatchStreamConfig, checkpoint: Checkpoint, n: int) -> Batches:
    sharding = jax.sharding.SingleDeviceSharding(jax.devices()[0])
    with O41JaxIterator(config, sharding) as iterator:
        iterator.set_state(checkpoint.to_json().encode())
        got = []
        for _ in range(n):
            position = iterator.checkpoint()
            batch = next(iterator)
            stage = iterator.checkpoint().stage
            got.append((position.next_batch, stage, np.asarray(batch["v"]).tolist()))
        return got


def from_lightning(config: BatchStreamConfig, state: dict[str, Any], n: int) -> Batches:
    datamodule = O41DataModule(config)
    datamodule.load_state_dict(state)
    got = []
    for batch in datamodule.train_dataloader():
        got.append((batch["batch_index"], batch["stage"], batch["v"].tolist()))
        if len(got) == n:
            return got
    return got


def test_a_torch_state_with_a_pending_switch_continues_in_lightning_and_jax(
    config: BatchStreamConfig,
) -> None:
    expected = reference(config, at=6, n=14)
    assert [stage for _, stage, _ in expected] == [0] * 6 + [1] * 8
    dataset = O41IterableDataset(config, switch=SwitchPoint(stage=1, at=6))
    it = iter(dataset)
    for _ in range(3):
        next(it)
    state = dataset.state_dict()
    checkpoint = Checkpoint.from_json(state["checkpoint"])
    assert checkpoint.position.switches == [(1, 6)]
    assert from_lightning(config, lightning_state(checkpoint), 11) == expected[3:]
    assert from_jax(config, checkpoint, 11) == expected[3:]
    assert from_torch(config, state, 11) == expected[3:]


class Model(LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.layer = torch.nn.Linear(1, 1)

    def training_step(self, batch: dict[str, Any], batch_idx: int) -> torch.Tensor:
        return self.layer(batch["v"].float()[:, None]).mean()

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.0)


def test_a_lightning_state_with_a_pending_switch_continues_in_torch_and_jax(
    config: BatchStreamConfig, tmp_path: Path
) -> None:
    saving = ModelCheckpoint(dirpath=tmp_path / "ck", every_n_train_steps=1, save_top_k=-1)
    trainer = Trainer(
        max_steps=4,
        accelerator="cpu",
        devices=1,
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        default_root_dir=tmp_path,
        callbacks=[saving, O41Curriculum({1: 1})],
    )
    trainer.fit(Model(), datamodule=O41DataModule(config))
    # Requested as step 1 starts, with batch 2 fetched ahead: stage 1 starts at global batch 3.
    state = torch.load(tmp_path / "ck" / "epoch=0-step=2.ckpt", weights_only=True)["O41DataModule"]
    position = Position.from_json(state["ranks"][0]["position"])
    assert (position.next_batch, position.switches) == (2, [(1, 3)])
    checkpoint = Checkpoint.from_position(position, state["resolved"])
    expected = reference(config, at=3, n=12)[2:]
    assert from_torch(config, torch_state(checkpoint), 10) == expected
    assert from_jax(config, checkpoint, 10) == expected
    assert from_lightning(config, state, 10) == expected


def test_a_jax_state_taken_after_a_switch_continues_in_torch_and_lightning(config: BatchStreamConfig) -> None:
    expected = reference(config, at=4, n=12)
    sharding = jax.sharding.SingleDeviceSharding(jax.devices()[0])
    with O41JaxIterator(config, sharding) as iterator:
        for _ in range(4):
            next(iterator)
        iterator.advance(1)
        checkpoint = Checkpoint.from_json(iterator.get_state().decode())
    assert checkpoint.stage == 1
    assert from_torch(config, torch_state(checkpoint), 8) == expected[4:]
    assert from_lightning(config, lightning_state(checkpoint), 8) == expected[4:]
