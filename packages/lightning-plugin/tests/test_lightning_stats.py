"""O41StatsLogger: the loader's stats every N steps through a real Lightning Trainer on CPU."""

from __future__ import annotations

import csv
import time
from pathlib import Path
from typing import Any

import pytest
import torch
from lightning.pytorch import LightningModule, Trainer
from lightning.pytorch.loggers import CSVLogger
from o41_testkit import write_shard
from o41_training_data import BatchStreamConfig, ConfigError, FileSource, ProjectedField, Stage
from o41_training_data_lightning import O41DataModule, O41StatsLogger


class SlowModel(LightningModule):
    """A linear layer whose training step also sleeps, so the step (not the loader) sets the pace."""

    def __init__(self) -> None:
        super().__init__()
        self.layer = torch.nn.Linear(1, 1)

    def training_step(self, batch: dict[str, Any], batch_idx: int) -> torch.Tensor:
        time.sleep(0.05)
        return self.layer(batch["v"].float().unsqueeze(1)).mean()

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.01)


def test_the_lightning_callback_logs_every_n_steps_through_the_trainers_loggers(tmp_path: Path) -> None:
    paths = [
        write_shard(
            tmp_path / f"p-{k}.jsonl",
            "jsonl",
            [{"v": k * 10_000 + i, "pad": "x" * (i % 50)} for i in range(200)],
        )
        for k in range(2)
    ]
    config = BatchStreamConfig(
        fields=[ProjectedField("v", "v", "i64"), ProjectedField("src", "@source", "i64")],
        stages=[Stage(sources=[FileSource([str(p) for p in paths])], batch_size=4, infinite=True)],
        seed=3,
        threads=1,
    )
    callback = O41StatsLogger(every_n_steps=3, prefix="data/")
    trainer = Trainer(
        max_steps=9,
        accelerator="cpu",
        devices=1,
        logger=CSVLogger(tmp_path / "logs", name="run"),
        callbacks=[callback],
        enable_progress_bar=False,
        enable_model_summary=False,
        enable_checkpointing=False,
        default_root_dir=tmp_path,
    )
    trainer.fit(SlowModel(), datamodule=O41DataModule(config))

    [metrics_file] = (tmp_path / "logs").rglob("metrics.csv")
    with metrics_file.open() as f:
        rows = [row for row in csv.DictReader(f) if row.get("data/fetch_fraction")]
    assert [int(row["step"]) for row in rows] == [3, 6, 9]
    for row in rows:
        # The engine's view of each window: a few batches, the model's sleeps as consumer time.
        assert 3 <= float(row["data/batches_delivered"]) <= 4
        assert float(row["data/consumer_seconds"]) >= 2 * 0.05
        assert float(row["data/loader_bound_fraction"]) < 0.5
        # The trainer's view: the steps' sleeps, and a fetch fraction below one half too.
        assert float(row["data/step_seconds"]) >= 3 * 0.05
        assert float(row["data/fetch_fraction"]) < 0.5
        assert "data/source0.0/rows_read" in row
        # The mixture: the window's delivered rows, and the one source's share of them.
        assert float(row["data/source0.0/rows_delivered"]) == float(row["data/stage0/rows_delivered"]) > 0
        assert float(row["data/source0.0/row_share"]) == float(row["data/source0.0/weight_share"]) == 1.0
        assert "data/retries/throttled" in row
    assert callback.last_metrics["data/step_seconds"] == pytest.approx(float(rows[-1]["data/step_seconds"]))
    assert sum(float(row["data/rows_read"]) for row in rows) > 0


def test_the_lightning_callback_refuses_a_bad_interval() -> None:
    with pytest.raises(ConfigError, match="every_n_steps"):
        O41StatsLogger(every_n_steps=0)
