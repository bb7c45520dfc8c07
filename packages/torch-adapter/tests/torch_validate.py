"""A validation pass under torchrun: every rank scores its batches, masked by ``valid``, with a
collective per step (so ranks yielding different batch counts would hang), and rank 0 writes the
row ids all ranks saw.

    torchrun --nproc_per_node=3 tests/torch_validate.py --data DIR --out DIR
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch
import torch.distributed as dist
from o41_training_data import BatchStreamConfig, FileSource, ProjectedField, Stage
from o41_training_data_torch import O41IterableDataset
from torch.utils.data import DataLoader


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--data", type=Path, required=True)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()

    dist.init_process_group("gloo")
    config = BatchStreamConfig(
        fields=[ProjectedField("x", "x", "f32"), ProjectedField("id", "@row_id", "i64")],
        stages=[
            Stage(
                sources=[FileSource(files=sorted(str(p) for p in args.data.glob("*.parquet")))], batch_size=4
            )
        ],
        threads=1,
        validation_pass=True,
    )
    ids: list[int] = []
    steps = 0
    score = torch.zeros(2, dtype=torch.float64)  # sum of x over real rows, real rows
    for batch in DataLoader(O41IterableDataset(config), batch_size=None, num_workers=1):
        valid = batch["valid"]
        assert valid.dtype == torch.bool
        local = torch.stack([batch["x"][valid].double().sum(), valid.sum().double()])
        # One collective per step, as a distributed evaluation loop does.
        dist.all_reduce(local)
        score += local
        ids.extend(batch["id"][valid].tolist())
        steps += 1
    gathered: list[object] = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, {"ids": ids, "steps": steps})
    if dist.get_rank() == 0:
        result = {"ranks": gathered, "score": score.tolist()}
        (args.out / "validation.json").write_text(json.dumps(result))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
