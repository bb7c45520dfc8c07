"""The naming-form resume matrix through Lightning: ``Trainer.fit(ckpt_path="last")`` over a
corpus named as ``docs/corpora.md`` recommends resumes the stream exactly (the core runs the
same matrix, ``packages/core/tests/test_naming_forms.py``)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from lightning.pytorch import LightningModule, Trainer
from lightning.pytorch.callbacks import ModelCheckpoint
from o41_testkit.naming import NAMING_FORMS, named_corpus, naming_config
from o41_training_data_lightning import O41DataModule

RESUMING = pytest.mark.filterwarnings("ignore:Checkpoint directory .* exists and is not empty:UserWarning")


class Recorder(LightningModule):
    """Records the ``@row_id`` of every row a step trains on."""

    def __init__(self) -> None:
        super().__init__()
        self.layer = torch.nn.Linear(8, 1)
        self.trained: list[tuple[int, list[int]]] = []

    def training_step(self, batch: dict[str, Any], batch_idx: int) -> torch.Tensor:
        self.trained.append((self.global_step, batch["row_id"].tolist()))
        return self.layer(batch["ids"].float()).mean()

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.01)


def fit(datamodule: O41DataModule, root: Path, max_steps: int, ckpt_path: str | None = None) -> Recorder:
    model = Recorder()
    trainer = Trainer(
        accelerator="cpu",
        devices=1,
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        max_steps=max_steps,
        default_root_dir=root,
        callbacks=[ModelCheckpoint(dirpath=root, every_n_train_steps=3, save_top_k=-1, save_last=True)],
    )
    trainer.fit(model, datamodule=datamodule, ckpt_path=ckpt_path)
    return model


@RESUMING
@pytest.mark.parametrize("form", NAMING_FORMS)
def test_fit_resumes_from_last_whatever_the_naming_form(tmp_path: Path, form: str) -> None:
    config = naming_config(named_corpus(form, tmp_path / "data"), infinite=True)
    straight = fit(O41DataModule(config), tmp_path / "straight", 8)
    fit(O41DataModule(config), tmp_path / "run", 4)  # its last checkpoint is at step 3
    resumed = fit(O41DataModule(config), tmp_path / "run", 8, ckpt_path="last")
    assert resumed.trained == straight.trained[3:]
