"""A Lightning DDP job for the plugin's kill-and-restart test: two CPU ranks (gloo), a
checkpoint every few steps, a curriculum switch, a validation stream, a fingerprint of every
training batch per rank, and an optional SIGKILL of the whole job.

    python tests/lightning_train.py --data DIR --out DIR [--die-at STEP] [--resume]
        [--die-after-save STEP] [--resume-newest] [--renamed]

``--die-after-save`` kills the job inside the save of step STEP's checkpoint, right after the
model checkpoint file is written; ``--resume-newest`` resumes from the newest ``.ckpt`` on disk
(what a restart script that lists the directory does), with ``--renamed`` through a datamodule
subclass whose state Lightning does not find in the checkpoint (so the sidecars are read).

Lightning's DDP launcher starts rank 1 as a child of this process, in its process group, so
killing the group kills the job.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import signal
from pathlib import Path
from typing import Any

import torch
from lightning.pytorch import LightningModule, Trainer
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.plugins.io import TorchCheckpointIO
from o41_training_data import BatchStreamConfig, FileSource, ProjectedField, Shuffle, Stage
from o41_training_data_lightning import O41Curriculum, O41DataModule

MAX_STEPS = 16
CHECKPOINT_EVERY = 4
SWITCH_AT = 6  # requested at step 6: the first batch of stage 1 trains at step 8, right after a checkpoint


class TinyModel(LightningModule):
    def __init__(self, out: Path, die_at: int) -> None:
        super().__init__()
        self.layer = torch.nn.Linear(8, 1)
        self.out = out
        self.die_at = die_at

    def training_step(self, batch: dict[str, Any], batch_idx: int) -> torch.Tensor:
        digest = hashlib.sha256(batch["tokens"].numpy().tobytes() + batch["id"].numpy().tobytes()).hexdigest()
        with (self.out / f"log-rank{self.global_rank}.txt").open("a") as log:
            log.write(f"{self.global_step} {batch['batch_index']} {batch['stage']} {digest[:16]}\n")
            log.flush()
            os.fsync(log.fileno())
        if self.global_step == self.die_at and self.global_rank == 0:
            os.killpg(os.getpgid(0), signal.SIGKILL)
        return self.layer(batch["tokens"].float()).mean()

    def validation_step(self, batch: dict[str, Any], batch_idx: int) -> torch.Tensor:
        return self.layer(batch["tokens"].float()).mean()

    def configure_optimizers(self) -> Any:
        optimizer = torch.optim.SGD(self.parameters(), lr=0.01)
        # Sets the train loader up before the fit loop does, after the checkpoint was restored.
        total = self.trainer.estimated_stepping_batches
        scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1 - step / (total + 1))
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": scheduler, "interval": "step"}}


class Renamed(O41DataModule):
    """Lightning keys datamodule state by class name: this one finds none in the checkpoint."""


def die_after_saving(step: int) -> None:
    """Kills the job inside the save of step ``step``: after the model checkpoint is written."""
    save = TorchCheckpointIO.save_checkpoint

    def saving(
        self: TorchCheckpointIO, checkpoint: dict[str, Any], path: Any, storage_options: Any = None
    ) -> None:
        save(self, checkpoint, path, storage_options=storage_options)
        if str(path).endswith(f"-step={step}.ckpt"):
            os.killpg(os.getpgid(0), signal.SIGKILL)

    TorchCheckpointIO.save_checkpoint = saving  # type: ignore[method-assign]


def newest_checkpoint(directory: Path) -> Path:
    return max(directory.glob("epoch=*-step=*.ckpt"), key=lambda p: int(p.stem.rsplit("=", 1)[1]))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--data", type=Path, required=True)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--die-at", type=int, default=-1)
    parser.add_argument("--resume", action="store_true")
    parser.add_argument("--die-after-save", type=int, default=-1)
    parser.add_argument("--resume-newest", action="store_true")
    parser.add_argument("--renamed", action="store_true")
    args = parser.parse_args()
    if args.die_after_save >= 0:
        die_after_saving(args.die_after_save)

    fields = [ProjectedField("tokens", "input_ids", "i32", length=8), ProjectedField("id", "@row_id", "i64")]
    config = BatchStreamConfig(
        fields=fields,
        stages=[
            Stage(
                sources=[
                    FileSource(files=sorted(str(p) for p in args.data.glob("a-*.parquet")), weight=3.0),
                    FileSource(files=sorted(str(p) for p in args.data.glob("b-*.jsonl")), weight=1.0),
                ],
                batch_size=4,
                shuffle=Shuffle(buffer_rows=32),
                infinite=True,
            ),
            Stage(
                sources=[FileSource(files=sorted(str(p) for p in args.data.glob("b-*.jsonl")))],
                batch_size=4,
                shuffle=Shuffle(buffer_rows=32),
                infinite=True,
            ),
        ],
        seed=11,
        threads=1,
    )
    val_config = BatchStreamConfig(
        fields=fields,
        stages=[
            Stage(
                sources=[FileSource(files=sorted(str(p) for p in args.data.glob("b-*.jsonl")))], batch_size=8
            )
        ],
        threads=1,
    )
    trainer = Trainer(
        strategy="ddp",
        accelerator="cpu",
        devices=2,
        max_steps=MAX_STEPS,
        max_epochs=1,  # with max_steps, estimated_stepping_batches sets the train loader up early
        val_check_interval=5,
        num_sanity_val_steps=0,
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        callbacks=[
            ModelCheckpoint(
                dirpath=args.out / "checkpoints",
                every_n_train_steps=CHECKPOINT_EVERY,
                save_top_k=-1,
                save_last="link",
            ),
            O41Curriculum({SWITCH_AT: 1}),
        ],
    )
    model = TinyModel(args.out, args.die_at)
    datamodule = (Renamed if args.renamed else O41DataModule)(config, val_config=val_config)
    ckpt_path: Any = "last" if args.resume else None
    if args.resume_newest:
        ckpt_path = newest_checkpoint(args.out / "checkpoints")
    trainer.fit(model, datamodule=datamodule, ckpt_path=ckpt_path)


if __name__ == "__main__":
    main()
