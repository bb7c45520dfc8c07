"""The command line's start-up: `o41 --version`, `o41 --help` and `o41 trace`, beside the floor.

Writes the "startup" section of benchmarks/RESULTS.md.

Each command runs as a fresh process, the way a user types it, and the commands alternate within
each repetition (after one discarded warm-up round, which fills the page cache). The floor is
measured in the same run: `python -c pass` (the interpreter alone) and `python -c "import
pyarrow, numpy"` (what any command that touches data pays before its work). `o41 trace` traces
one global batch of a config over a few real shards, and at corpus scale over the scale
benchmark's simulated manifest of a million shards (only the first on disk): from the config
file (which resolves the manifest) and from a self-contained checkpoint of the same stream.
Goals: `o41 --version` and `o41 --help` under 0.3 s; `o41 trace` of one global batch at a
million shards under 1 s.
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

import pyarrow as pa
import pyarrow.parquet as pq

HERE = Path(__file__).parent
sys.path.insert(0, str(HERE))

from scale_bench import simulated_manifest  # noqa: E402
from trace_bench import DEEP, checkpoint_file  # noqa: E402

from report import preamble, write_section  # noqa: E402

O41 = str(Path(sys.executable).parent / "o41")
SHARDS = 1_000_000
WORLD = 64
BATCH = 32


def seconds(command: list[str], env: dict[str, str]) -> float:
    started = time.perf_counter()
    subprocess.run(command, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env)
    return time.perf_counter() - started


def loads_heavy(command: list[str], env: dict[str, str]) -> str:
    """Which of NumPy and PyArrow a run of ``command`` imports (``-X importtime``'s list)."""
    # The o41 console script is a Python file: run by the same interpreter, with the flag.
    script = command[1:] if command[0] == sys.executable else command
    argv = [sys.executable, "-X", "importtime", *script]
    done = subprocess.run(argv, check=True, capture_output=True, env=env, text=True)
    loaded = {
        line.rsplit("|", 1)[1].strip() for line in done.stderr.splitlines() if line.startswith("import time:")
    }
    return ", ".join(name for name in ("numpy", "pyarrow") if name in loaded) or "neither"


def small_config(root: Path) -> Path:
    """A JSON config over four small Parquet shards (JSON: a YAML file would time PyYAML too)."""
    files = []
    for k in range(4):
        path = root / f"small-{k}.parquet"
        pq.write_table(pa.table({"v": pa.array(range(k * 1000, (k + 1) * 1000), pa.int64())}), path)
        files.append(path.name)
    return config_file(root / "small.json", {"files": files})


def config_file(path: Path, source: dict[str, object]) -> Path:
    document = {
        "fields": [{"name": "v", "source": "v", "dtype": "i64"}],
        "stages": [
            {"sources": [source], "batch_size": BATCH, "shuffle": {"buffer_rows": 4096}, "infinite": True}
        ],
        "seed": 7,
        "threads": 1,
        "world_size": WORLD,
    }
    path.write_text(json.dumps(document))
    return path


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--reps", type=int, default=7)
    parser.add_argument("--shards", type=int, default=SHARDS, help="Shards of the simulated manifest.")
    args = parser.parse_args()
    # One BLAS thread, as the other benchmarks' children: NumPy's idle pool would otherwise
    # spin a core after import, which a two-core machine's next measurement pays. Bytecode is
    # written in the warm-up round, as an install or a user's first run writes it: without it,
    # every run would compile click, rich and the package again.
    env = {**os.environ, "OPENBLAS_NUM_THREADS": "1"}
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    with tempfile.TemporaryDirectory(prefix="o41-startup-") as tmp:
        root = Path(tmp)
        manifest, _ = simulated_manifest(root, args.shards)
        large = config_file(root / "large.json", {"manifest_uri": manifest.name, "split": "train"})
        small = small_config(root)
        checkpoint = checkpoint_file(manifest, root)
        batch = ["--global-batch", "5"]
        commands = {
            "`python -c pass`": [sys.executable, "-c", "pass"],
            '`python -c "import pyarrow, numpy"`': [sys.executable, "-c", "import pyarrow, numpy"],
            "`o41 --version`": [O41, "--version"],
            "`o41 --help`": [O41, "--help"],
            "`o41 trace` a config of 4 shards": [O41, "trace", str(small), *batch],
            f"`o41 trace` a config of {args.shards:,} shards": [O41, "trace", str(large), *batch],
            f"`o41 trace` a checkpoint of {args.shards:,} shards": [
                O41,
                "trace",
                str(checkpoint),
                "--global-batch",
                str(DEEP + 5),
            ],
        }
        for command in commands.values():  # warm-up: page cache, .pyc files
            seconds(command, env)
        heavy = {name: loads_heavy(command, env) for name, command in commands.items()}
        times: dict[str, list[float]] = {name: [] for name in commands}
        for _ in range(args.reps):
            for name, command in commands.items():
                times[name].append(seconds(command, env))
        checkpoint_mb = checkpoint.stat().st_size / 1e6
        manifest_mb = manifest.stat().st_size / 1e6
    floor = statistics.median(times["`python -c pass`"])
    lines = [
        f"| {name} | {statistics.median(t):.3f} | {min(t):.3f}-{max(t):.3f} | "
        f"{statistics.median(t) - floor:.3f} | {heavy[name]} |"
        for name, t in times.items()
    ]
    version = statistics.median(times["`o41 --version`"])
    help_s = statistics.median(times["`o41 --help`"])
    traces = [statistics.median(t) for name, t in times.items() if f"{args.shards:,} shards" in name]

    imports = statistics.median(times['`python -c "import pyarrow, numpy"`']) - floor
    heavy_commands = [
        name for name, loaded in heavy.items() if name.startswith("`o41") and loaded != "neither"
    ]
    note = (
        f"\nStill importing NumPy and PyArrow: {', '.join(heavy_commands)}; that is about\n"
        f"{imports:.2f} s of each one's time here (the second row over the floor).\n"
        if heavy_commands
        else ""
    )

    def verdict(value: float, goal: float) -> str:
        return f"**{value:.2f} s** ({'met' if value < goal else 'MISSED'})"

    command = f"uv run python benchmarks/startup_bench.py --reps {args.reps}"
    body = f"""## Start-up of the command line (`benchmarks/startup_bench.py`)

{preamble(command)}
- Each command is a fresh process, as typed; the commands alternate within each of {args.reps}
  repetitions, after a discarded warm-up round (which also writes the modules' bytecode, as a
  user's first run does). *over the floor* subtracts `python -c pass`; the last column is
  what a run imports of NumPy and PyArrow (`python -X importtime`).
- `o41 trace` traces one global batch of a world-{WORLD} stream (batch {BATCH}, shuffle window
  4,096): of a JSON config over four small Parquet shards; of a JSON config over the scale
  benchmark's simulated manifest of {args.shards:,} shards ({manifest_mb:,.1f} MB, only the first
  shard on disk), which the trace resolves; and of a self-contained checkpoint of that stream
  ({checkpoint_mb:,.1f} MB) moved to global batch {DEEP:,}.

| command | median s | spread (min-max) s | over the floor s | imports NumPy / PyArrow |
|---|---:|---:|---:|---|
{chr(10).join(lines)}

Goals: `o41 --version` {verdict(version, 0.3)} and `o41 --help` {verdict(help_s, 0.3)} under
0.3 s; `o41 trace` of one global batch at {args.shards:,} shards under 1 s: from the config
{verdict(traces[0], 1.0)}, from the checkpoint {verdict(traces[1], 1.0)}.
{note}"""
    write_section("startup", body)
    print(body)


if __name__ == "__main__":
    main()
