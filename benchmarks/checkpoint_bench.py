"""Checkpoints at corpus scale: what each rank writes and reads, split form against self-contained.

Writes the "checkpoint" section of benchmarks/RESULTS.md.

The corpus is the scale benchmark's simulated manifest (shards of 5,000-15,000 rows drawn from a
seed; only the first exists on disk). A world-64 rank-0 stream over it is opened and checkpointed
once; each figure is then the median over repetitions in a fresh process holding that
checkpoint: the bytes a rank writes per checkpoint, the time `write_checkpoint` takes for it
(the split form once the run's resolved document exists, which is every checkpoint of a run but
its first; and the first, which writes the document too), and the time `read_checkpoint` takes
to read it back. Goal: at a million shards, at most 64 KiB and 10 ms per rank per checkpoint.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).parent
sys.path.insert(0, str(HERE))

from scale_bench import simulated_config, simulated_manifest  # noqa: E402

from report import preamble, run_child, write_section  # noqa: E402

WORLD = 64
BATCH = 32


def child(args: argparse.Namespace) -> None:
    """Measures one corpus size in a fresh process; prints a JSON line."""
    import o41_training_data as o41

    config = simulated_config(Path(args.manifest), WORLD, BATCH)
    with o41.open_batch_stream(config) as stream:
        checkpoint = stream.checkpoint()
    figures: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="o41-ckpt-") as tmp:
        folder = Path(tmp)
        first: list[float] = []
        again: list[float] = []
        whole: list[float] = []
        read_split: list[float] = []
        read_whole: list[float] = []
        for rep in range(args.reps):
            split_dir = folder / f"split-{rep}"
            started = time.perf_counter()
            path = o41.write_checkpoint(checkpoint, split_dir / "rank0.json")
            first.append(time.perf_counter() - started)
            started = time.perf_counter()
            o41.write_checkpoint(checkpoint, split_dir / "rank1.json")
            again.append(time.perf_counter() - started)
            started = time.perf_counter()
            single = o41.write_checkpoint(checkpoint, folder / f"whole-{rep}.json", split=False)
            whole.append(time.perf_counter() - started)
            started = time.perf_counter()
            o41.read_checkpoint(path)
            read_split.append(time.perf_counter() - started)
            started = time.perf_counter()
            o41.read_checkpoint(single)
            read_whole.append(time.perf_counter() - started)
        (shared,) = split_dir.glob("resolved-*.json")
        figures = {
            "rank_bytes": path.stat().st_size,
            "shared_bytes": shared.stat().st_size,
            "whole_bytes": single.stat().st_size,
            "first_s": statistics.median(first),
            "again_s": statistics.median(again),
            "whole_s": statistics.median(whole),
            "read_split_s": statistics.median(read_split),
            "read_whole_s": statistics.median(read_whole),
        }
    print(json.dumps(figures))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--child", action="store_true")
    parser.add_argument("--manifest")
    parser.add_argument("--reps", type=int, default=5)
    args = parser.parse_args()
    if args.child:
        child(args)
        return
    rows: list[str] = []
    verdict = ""
    with tempfile.TemporaryDirectory(prefix="o41-ckpt-bench-") as tmp:
        for shards in (10_000, 1_000_000):
            manifest, _ = simulated_manifest(Path(tmp), shards)
            reps = args.reps if shards < 1_000_000 else min(args.reps, 3)
            f = run_child(
                [sys.executable, __file__, "--child", "--manifest", str(manifest), "--reps", str(reps)]
            )
            rows.append(
                f"| {shards:,} | {f['rank_bytes']:,} B | {f['again_s'] * 1e3:.2f} | {f['first_s']:.2f} | "
                f"{f['shared_bytes'] / 1e6:,.1f} MB | {f['read_split_s']:.2f} | "
                f"{f['whole_bytes'] / 1e6:,.1f} MB | {f['whole_s']:.2f} | {f['read_whole_s']:.2f} |"
            )
            if shards == 1_000_000:
                size_ok = f["rank_bytes"] <= 64 << 10
                time_ok = f["again_s"] <= 0.010
                verdict = (
                    f"**{f['rank_bytes']:,} bytes** ({'met' if size_ok else 'MISSED'}) and "
                    f"**{f['again_s'] * 1e3:.2f} ms** ({'met' if time_ok else 'MISSED'})"
                )
    command = f"uv run python benchmarks/checkpoint_bench.py --reps {args.reps}"
    body = f"""## Checkpoints at corpus scale (`benchmarks/checkpoint_bench.py`)

{preamble(command)}
- Corpus: the scale benchmark's simulated manifest; a world-{WORLD} rank-0 checkpoint (batch
  {BATCH}). Split form (version 2): a rank's file and, once per run, the resolved document
  beside it; self-contained (version 1): the document in every rank's file. *Write* is
  `write_checkpoint` (a temporary file, flushed, renamed; the directory flushed), *read* is
  `read_checkpoint` (parsing, the fingerprint checked against the document, the counters
  against it). Medians of the repetitions in one fresh process per size.

| shards | split: rank file | split: write per rank and checkpoint, ms | split: first write of the run (with the document), s | split: shared document | split: read, s | self-contained: per rank | self-contained: write, s | self-contained: read, s |
|---|---:|---:|---:|---:|---:|---:|---:|---:|
{chr(10).join(rows)}

Goal at a million shards, per rank and checkpoint: at most 64 KiB and 10 ms to write: {verdict}.
At 16,384 ranks the split form writes 16,384 rank files of that size plus one document per run
where the self-contained one wrote 16,384 copies of the document. Reading still parses the
document (a resume needs every shard's pin), so read time stays that of the document.
"""
    write_section("checkpoint", body)
    print(body)


if __name__ == "__main__":
    main()
