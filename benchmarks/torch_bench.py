"""The PyTorch adapter's overhead and a common alternative, side by side in one run.

    uv run python benchmarks/torch_bench.py --reps 3 [--mix]

Contenders (each in its own process, alternating): the core stream iterated directly;
``DataLoader(O41IterableDataset(...), batch_size=None)`` with ``num_workers=0`` and with
``num_workers=2`` (batches cross from the workers through the adapter's shared-memory ring); and
``DataLoader`` over a map-style dataset that indexes rows of the same shards loaded with pyarrow,
with ``batch_size=32`` and ``num_workers=2``. Every contender delivers the same 32 x 2,048 int32
token batches (truncated/padded) and the job sums them. ``--mix`` makes the o41 contenders run the
heavier job of the workers issue instead: tokens plus a 2,048-wide bool mask, a shuffled
(4,096-row window) 3:1 mix of two sources (the map-style contender is unchanged). Writes the
"torch" section of benchmarks/RESULTS.md.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

from corpus import generate
from report import preamble, write_section

HERE = Path(__file__).parent
SEQ = 2048
BATCH = 32


def core_config(shards, mix=False):
    from o41_training_data import BatchStreamConfig, FileSource, ProjectedField, Shuffle, Stage

    fields = [ProjectedField(name="tokens", source="input_ids", dtype="i32", length=SEQ, pad=0)]
    if not mix:
        stage = Stage(sources=[FileSource(files=shards)], batch_size=BATCH)
    else:
        # The workers issue's job (the order benchmark's shuffled mix).
        fields.append(
            ProjectedField(name="loss_mask", source="loss_mask", dtype="bool", length=SEQ, pad=False)
        )
        cut = len(shards) * 3 // 4
        sources = [FileSource(files=shards[:cut], weight=3.0), FileSource(files=shards[cut:], weight=1.0)]
        stage = Stage(sources=sources, batch_size=BATCH, shuffle=Shuffle(buffer_rows=4096))
    return BatchStreamConfig(fields=fields, stages=[stage], threads=2, prefetch_batches=4)


def core(shards, limit, mix=False):
    from o41_training_data import open_batch_stream

    with open_batch_stream(core_config(shards, mix)) as stream:
        for i, batch in enumerate(stream):
            if i == limit:
                return
            yield batch.arrays()["tokens"]


def adapter(shards, limit, mix=False, workers=0):
    from o41_training_data_torch import O41IterableDataset
    from torch.utils.data import DataLoader

    loader = DataLoader(O41IterableDataset(core_config(shards, mix)), batch_size=None, num_workers=workers)
    for i, batch in enumerate(loader):
        if i == limit:
            return
        yield batch["tokens"].numpy()  # shares memory; consumed like the core stream's arrays


def adapter_workers(shards, limit, mix=False):
    # The usual DataLoader habit; batches come through the adapter's shared-memory ring.
    yield from adapter(shards, limit, mix, workers=2)


class RowDataset:
    """Map-style: row ``i`` of the shards, truncated/padded to SEQ tokens."""

    def __init__(self, shards):
        import pyarrow as pa
        import pyarrow.parquet as pq

        table = pa.concat_tables(pq.read_table(path, columns=["input_ids"]) for path in shards)
        column = table.column("input_ids").combine_chunks()
        self.offsets = column.offsets.to_numpy()
        self.values = column.values.to_numpy()

    def __len__(self):
        return len(self.offsets) - 1

    def __getitem__(self, i):
        start = self.offsets[i]
        n = min(self.offsets[i + 1] - start, SEQ)
        row = np.zeros(SEQ, dtype=np.int32)
        row[:n] = self.values[start : start + n]
        return row


def map_style(shards, limit, mix=False):
    from torch.utils.data import DataLoader

    loader = DataLoader(RowDataset(shards), batch_size=BATCH, num_workers=2, drop_last=True)
    for i, batch in enumerate(loader):
        if i == limit:
            return
        yield batch


CONTENDERS = {
    "core-stream": core,
    "o41-torch-num_workers=0": adapter,
    "o41-torch-num_workers=2": adapter_workers,
    "map-style-pyarrow-num_workers=2": map_style,
}


def measure(name, shards, limit, mix):
    # Imports (torch takes seconds) and opening are not the steady state: time from batch one.
    import o41_training_data_torch  # noqa: F401
    import torch  # noqa: F401

    batches = 0
    start = 0.0
    for tokens in CONTENDERS[name](shards, limit, mix):
        assert tuple(tokens.shape) == (BATCH, SEQ)
        int(tokens.sum())
        batches += 1
        if batches == 1:
            start = time.perf_counter()
    seconds = time.perf_counter() - start
    return {"batches_per_s": (batches - 1) / seconds, "batches": batches}


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rows", type=int, default=50_000)
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--batches", type=int, default=1500)
    parser.add_argument("--mix", action="store_true", help="o41 contenders run the shuffled 3:1 mix job")
    parser.add_argument("--job")
    args = parser.parse_args()
    shards = [str(p) for p in generate(HERE / "data" / "corpus", args.rows)]
    if args.job:
        print(json.dumps(measure(args.job, shards, args.batches, args.mix)))
        return
    runs = {name: [] for name in CONTENDERS}
    env = {**os.environ, "OPENBLAS_NUM_THREADS": "1"}
    names = list(CONTENDERS)
    for rep in range(args.reps):
        for name in names if rep % 2 == 0 else reversed(names):
            command = [
                sys.executable,
                __file__,
                "--job",
                name,
                "--rows",
                str(args.rows),
                "--batches",
                str(args.batches),
                *(["--mix"] if args.mix else []),
            ]
            out = subprocess.run(command, check=True, capture_output=True, text=True, env=env)
            runs[name].append(json.loads(out.stdout.strip().splitlines()[-1]))
            print(f"rep {rep + 1} {name}: {runs[name][-1]['batches_per_s']:,.1f} batches/s", file=sys.stderr)
    medians = {name: statistics.median(r["batches_per_s"] for r in runs[name]) for name in names}
    adapter_ratio = medians["o41-torch-num_workers=0"] / medians["core-stream"]
    workers_ratio = medians["o41-torch-num_workers=2"] / medians["core-stream"]
    rows = "\n".join(
        f"| {name} | {medians[name]:,.1f} | {min(r['batches_per_s'] for r in runs[name]):,.1f}-"
        f"{max(r['batches_per_s'] for r in runs[name]):,.1f} | {medians[name] / medians['core-stream']:.2f} |"
        for name in names
    )
    mix = " --mix" if args.mix else ""
    if args.mix:
        job = (
            "32 x 2,048 int32 tokens + 32 x 2,048 bool mask (truncate/pad) of a shuffled (4,096-row\n"
            "  window) 3:1 two-source mix for the o41 contenders, 32 x 2,048 int32 tokens for the\n"
            "  map-style one,"
        )
    else:
        job = "32 x 2,048 int32 tokens (truncate/pad) of the corpus,"
    body = f"""## PyTorch adapter (`benchmarks/torch_bench.py`)

{preamble(f"uv run python benchmarks/torch_bench.py --rows {args.rows} --reps {args.reps}{mix}")}
- Job: steady state (after the first batch) over the first {args.batches} batches of
  {job} summed with NumPy;
  {args.reps} repetitions, each contender in its own process, alternating.

| contender | batches/s (median) | spread | ratio to the core stream |
|---|---:|---:|---:|
{rows}

Goal: the adapter with `num_workers=0` at >= 0.9x the core stream (it adds no copies).
Measured: **{adapter_ratio:.2f}x** ({"met" if adapter_ratio >= 0.9 else "MISSED"}).

Goal (workers issue): the adapter with `num_workers=2` at >= 0.8x the core stream (workers'
batches cross through the shared-memory ring: one copy, one small handle per batch on the queue).
Measured: **{workers_ratio:.2f}x** ({"met" if workers_ratio >= 0.8 else "MISSED"}).

With workers, the first one streams every batch through the ring and the others end at once
(each batch is decoded once). Torch's own transfer measured 0.22-0.25x on this machine and the
ring with one engine per worker 0.5x. What is left is the `DataLoader`'s per-batch round trip
(an index message, the item, a feeder thread and a receiving loop on each side) and the worker's
copy into the ring, on the same 2 cores as the engine's threads; `num_workers=0` stays the
fastest setting, which `docs/torch.md` recommends.
"""
    print(body)
    write_section("torch", body)


if __name__ == "__main__":
    main()
