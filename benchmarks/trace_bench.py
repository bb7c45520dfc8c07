"""Provenance at corpus scale: which rows one global batch holds, at 10,000 and 1,000,000 shards.

Writes the "trace" section of benchmarks/RESULTS.md.

The corpus is the scale benchmark's simulated manifest (shards of 5,000-15,000 rows drawn from
a seed; only the first exists on disk, so nothing but counts can answer). A world-64 stream over
it is opened, advanced 100 batches and checkpointed to a file. Measured, each the median of
fresh processes: `trace_batches(checkpoint, g)` in a process that already holds the checkpoint
(what a training job's own tooling pays), `Checkpoint.from_json` of the file (what a fresh
process pays first), and the `o41 trace FILE --global-batch g` command end to end (Python start,
reading the file, tracing, printing one JSON line a row). Goal: `o41 trace` of one global batch
at a million shards under one second.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
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
DEEP = 10_000_000


def child(args: argparse.Namespace) -> None:
    """One measurement in a fresh process; prints a JSON line."""
    import o41_training_data as o41

    figures: dict[str, Any] = {}
    text = Path(args.checkpoint).read_text()
    started = time.perf_counter()
    checkpoint = o41.Checkpoint.from_json(text)
    figures["from_json_s"] = time.perf_counter() - started
    started = time.perf_counter()
    rows = o41.trace_batches(checkpoint, args.batch)
    figures["trace_s"] = time.perf_counter() - started
    started = time.perf_counter()
    again = o41.trace_batches(checkpoint, range(args.batch, args.batch + 100))
    figures["trace_100_s"] = time.perf_counter() - started
    figures["rows"] = len(rows)
    figures["rows_100"] = len(again)
    print(json.dumps(figures))


def checkpoint_file(manifest: Path, out: Path) -> Path:
    """A world-64 rank-0 checkpoint after 100 batches, moved to global batch ``DEEP``."""
    import o41_training_data as o41

    config = simulated_config(manifest, WORLD, BATCH)
    with o41.open_batch_stream(config) as stream:
        checkpoint = stream.checkpoint()
    document = json.loads(checkpoint.to_json())
    document["cursor"]["next_batch"] = DEEP
    document["batches_yielded"] = DEEP // WORLD
    document["rows_yielded"] = DEEP // WORLD * BATCH
    path = out / f"checkpoint-{manifest.stem}.json"
    path.write_text(json.dumps(document))
    return path


# Children write bytecode, as an installed package's users' runs do: without it every run
# compiles click, rich and the package again (startup_bench.py does the same).
CHILD_ENV = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}


def cli_seconds(path: Path, batch: int) -> float:
    started = time.perf_counter()
    done = subprocess.run(
        [str(Path(sys.executable).parent / "o41"), "trace", str(path), "--global-batch", str(batch)],
        capture_output=True,
        text=True,
        check=True,
        env=CHILD_ENV,
    )
    elapsed = time.perf_counter() - started
    assert len(done.stdout.splitlines()) == BATCH, done.stdout[:200]
    return elapsed


def start_seconds() -> float:
    """The command line's floor: `o41 --version` (interpreter start and imports, no work)."""
    started = time.perf_counter()
    subprocess.run(
        [str(Path(sys.executable).parent / "o41"), "--version"],
        capture_output=True,
        check=True,
        env=CHILD_ENV,
    )
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--child", action="store_true")
    parser.add_argument("--checkpoint")
    parser.add_argument("--batch", type=int, default=DEEP + 5)
    parser.add_argument("--reps", type=int, default=3)
    args = parser.parse_args()
    if args.child:
        child(args)
        return
    lines: list[str] = []
    verdict = ""
    floor = statistics.median(start_seconds() for _ in range(args.reps))
    with tempfile.TemporaryDirectory(prefix="o41-trace-") as tmp:
        root = Path(tmp)
        for shards in (10_000, 1_000_000):
            manifest, _ = simulated_manifest(root, shards)
            path = checkpoint_file(manifest, root)
            runs = [
                run_child([sys.executable, __file__, "--child", "--checkpoint", str(path)], None)
                for _ in range(args.reps)
            ]
            cli = statistics.median(cli_seconds(path, DEEP + 5) for _ in range(args.reps))
            median = {key: statistics.median(r[key] for r in runs) for key in runs[0]}
            size = path.stat().st_size / 1e6
            lines.append(
                f"| {shards:,} | {size:,.1f} | {median['trace_s'] * 1e3:,.1f} | "
                f"{median['trace_100_s'] * 1e3:,.1f} | {median['from_json_s']:.2f} | {cli:.2f} |"
            )
            if shards == 1_000_000:
                verdict = f"**{cli:.2f} s** ({'met' if cli < 1.0 else 'MISSED'})"
    command = f"uv run python benchmarks/trace_bench.py --reps {args.reps}"
    body = f"""## Provenance: `o41 trace` at corpus scale (`benchmarks/trace_bench.py`)

{preamble(command)}
- Corpus: the scale benchmark's simulated manifest (shards of 5,000-15,000 rows, only the first
  on disk); a world-{WORLD} rank-0 checkpoint (batch {BATCH}, shuffle window 4,096) moved to
  global batch {DEEP:,}; global batch {DEEP + 5:,} traced. Medians of {args.reps} fresh processes.
- *trace* is `trace_batches(checkpoint, g)` in a process that holds the checkpoint; *100
  batches* traces 100 consecutive ones; *from_json* parses the checkpoint file; *o41 trace* is
  the command end to end (interpreter start, reading the file, tracing, printing).

| shards | checkpoint MB | trace one batch, ms | trace 100 batches, ms | `from_json` s | `o41 trace` s |
|---|---:|---:|---:|---:|---:|
{chr(10).join(lines)}

Goal: `o41 trace` of one global batch at a million shards under 1 s: {verdict}. Of that,
{floor:.2f} s is the command's floor on this machine (`o41 --version`: the interpreter and the
imports of NumPy, PyArrow, click and rich, before any work), and most of the rest is reading and
parsing the checkpoint, whose resolved document lists every shard (the split checkpoint form of
this issue stores it once per run, but a trace still reads it). The trace itself, from a parsed
checkpoint, builds the order function from the document's row counts and walks the batch's
slots: the *trace one batch* column.
"""
    write_section("trace", body)
    print(body)


if __name__ == "__main__":
    main()
