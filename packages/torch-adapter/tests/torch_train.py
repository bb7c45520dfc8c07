"""A small training loop for the torchrun test: DataLoader workers, checkpoints every few steps,
a fingerprint of every batch per rank, and an optional SIGKILL of the whole job.

    torchrun --nproc_per_node=2 tests/torch_train.py --data DIR --out DIR [--die-at STEP]
"""

from __future__ import annotations

import argparse
import hashlib
import os
import signal
from pathlib import Path

import torch
import torch.distributed as dist
from o41_training_data import BatchStreamConfig, Checkpoint, FileSource, ProjectedField, Shuffle, Stage
from o41_training_data_torch import O41IterableDataset
from torch.utils.data import DataLoader

CHECKPOINT_EVERY = 4


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--data", type=Path, required=True)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--die-at", type=int, default=0)
    args = parser.parse_args()

    dist.init_process_group("gloo")
    rank = dist.get_rank()
    config = BatchStreamConfig(
        fields=[
            ProjectedField("tokens", "input_ids", "i32", length=16),
            ProjectedField("id", "@row_id", "i64"),
        ],
        stages=[
            Stage(
                sources=[
                    FileSource(files=sorted(str(p) for p in args.data.glob("a-*.parquet")), weight=3.0),
                    FileSource(files=sorted(str(p) for p in args.data.glob("b-*.jsonl.gz")), weight=1.0),
                ],
                batch_size=4,
                shuffle=Shuffle(buffer_rows=64),
            )
        ],
        seed=7,
        threads=1,
    )
    checkpoint_file = args.out / f"stream-rank{rank}.json"
    log_file = args.out / f"log-rank{rank}.txt"
    if checkpoint_file.exists():
        checkpoint = Checkpoint.from_json(checkpoint_file.read_text())
        dataset, step = O41IterableDataset(checkpoint), checkpoint.batches_yielded
    else:
        dataset, step = O41IterableDataset(config), 0
    # Gradients are all-reduced every step, so the ranks advance in step as in real training.
    model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(16, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    with log_file.open("a") as log:
        for batch in DataLoader(dataset, batch_size=None, num_workers=2):
            step += 1
            loss = model(batch["tokens"].float()).mean()
            loss.backward()
            optimizer.step()
            optimizer.zero_grad()
            digest = hashlib.sha256(
                batch["tokens"].numpy().tobytes() + batch["id"].numpy().tobytes()
            ).hexdigest()
            log.write(f"{step} {batch['batch_index']} {digest[:16]}\n")
            log.flush()
            os.fsync(log.fileno())
            if step % CHECKPOINT_EVERY == 0:
                tmp = checkpoint_file.with_suffix(".tmp")
                tmp.write_text(dataset.checkpoint(batch).to_json())
                tmp.replace(checkpoint_file)
            if step == args.die_at and rank == 0:
                os.killpg(os.getpgid(0), signal.SIGKILL)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
