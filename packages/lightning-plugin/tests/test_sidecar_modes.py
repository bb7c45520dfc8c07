"""Stream checkpoints get the mode of the model checkpoint beside them: what ``open()`` gives.

Written ``0o600`` beside a ``0o644`` ``.ckpt``, they kept a job run as another user (an
evaluation, a copy to shared storage) from resuming the stream (issue 46).
"""

from __future__ import annotations

import os
import stat
from pathlib import Path
from typing import Any

import pytest
import torch
from lightning.pytorch import LightningModule, Trainer
from lightning.pytorch.callbacks import ModelCheckpoint
from o41_testkit import write_shard
from o41_training_data import BatchStreamConfig, FileSource, ProjectedField, Stage
from o41_training_data_lightning import INDEX_FILE, O41DataModule, rank_file


class Model(LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.layer = torch.nn.Linear(4, 1)

    def training_step(self, batch: dict[str, Any], batch_idx: int) -> torch.Tensor:
        return self.layer(batch["x"]).mean()

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.01)


def current_umask() -> int:
    umask = os.umask(0o022)
    os.umask(umask)
    return umask


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def save(tmp_path: Path) -> tuple[Path, list[Path]]:
    """Trains two steps with a checkpoint after the second: the ``.ckpt`` and its sidecars."""
    shard = write_shard(
        tmp_path / "a.parquet", "parquet", [{"x": [i, i + 1, i + 2, i + 3]} for i in range(64)]
    )
    config = BatchStreamConfig(
        fields=[ProjectedField("x", "x", "f32", length=4)],
        stages=[Stage(sources=[FileSource(files=[str(shard)])], batch_size=4, infinite=True)],
        threads=1,
    )
    directory = tmp_path / "ck"
    trainer = Trainer(
        max_steps=2, accelerator="cpu", devices=1, logger=False, enable_progress_bar=False,
        enable_model_summary=False, default_root_dir=tmp_path,
        callbacks=[ModelCheckpoint(dirpath=directory, every_n_train_steps=2, save_top_k=-1)],
    )  # fmt: skip
    trainer.fit(Model(), datamodule=O41DataModule(config))
    sidecars = sorted((directory / "epoch=0-step=2.ckpt.o41").iterdir())
    names = [p.name for p in sidecars]
    assert INDEX_FILE in names
    assert rank_file(0, 1) in names
    assert len(names) == 3
    return directory / "epoch=0-step=2.ckpt", sidecars


def test_sidecars_get_the_mode_of_the_checkpoint_beside_them(tmp_path: Path) -> None:
    checkpoint, sidecars = save(tmp_path)
    assert mode(checkpoint) == 0o666 & ~current_umask()
    assert {p.name: mode(p) for p in sidecars} == {p.name: mode(checkpoint) for p in sidecars}


@pytest.mark.parametrize("umask", [0o002, 0o077], ids=lambda m: f"umask-{m:03o}")
def test_sidecars_follow_the_umask(tmp_path: Path, umask: int) -> None:
    # The .ckpt is left out here: fsspec, which writes it, reads the umask once per process.
    old = os.umask(umask)
    try:
        _, sidecars = save(tmp_path)
    finally:
        os.umask(old)
    assert {p.name: mode(p) for p in sidecars} == {p.name: 0o666 & ~umask for p in sidecars}
