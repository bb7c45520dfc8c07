"""Open time of sources of many shards: MDS dataset directories and plain file lists of 1,000,
4,000 and 30,000 local shards, with the inspection cache cold (a fresh directory: the first open
on a host) and warm (the second).

Writes the "open" section of benchmarks/RESULTS.md. Each figure is the median of fresh processes
(open, then close; no batch read), beside its floor measured in the same run: for an MDS
directory, parsing its ``index.json`` with the standard library; for a file list, ``os.stat`` of
every file (what looking at each shard cannot avoid).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).parent
sys.path.insert(0, str(HERE.parent / "packages" / "testkit" / "src"))

from report import preamble, run_child, write_section  # noqa: E402

COUNTS = tuple(int(c) for c in os.environ.get("O41_OPEN_COUNTS", "1000,4000,30000").split(","))


def write_corpora(root: Path, count: int) -> tuple[Path, Path]:
    """An MDS directory and a directory of JSON Lines files, ``count`` one-record shards each."""
    from o41_testkit.corpora import token_corpus, write_mds_tokens_plain

    mds = root / f"mds-{count}"
    if not (mds / "index.json").exists():
        write_mds_tokens_plain(mds, token_corpus([3] * count), per_shard=1)
    lines = root / f"jsonl-{count}"
    if not lines.exists():
        lines.mkdir()
        for k in range(count):
            (lines / f"part-{k:06d}.jsonl").write_text(json.dumps({"v": k}) + "\n")
    return mds, lines


def child(kind: str, path: str) -> None:
    """Opens and closes one stream over ``path``; prints the seconds open took."""
    from o41_training_data import BatchStreamConfig, FileSource, ProjectedField, Stage, open_batch_stream

    if kind == "mds":
        source = FileSource([path], encoding="mds")
        field = ProjectedField("t", "tokens", "i32", length=4)
    else:
        source = FileSource(sorted(str(p) for p in Path(path).iterdir()))
        field = ProjectedField("v", "v", "i64")
    config = BatchStreamConfig(fields=[field], stages=[Stage(sources=[source], batch_size=1)])
    started = time.perf_counter()
    with open_batch_stream(config):
        seconds = time.perf_counter() - started
    print(json.dumps({"seconds": seconds}))


def floor(kind: str, path: Path) -> float:
    started = time.perf_counter()
    if kind == "mds":
        json.loads((path / "index.json").read_text())
    else:
        for entry in os.scandir(path):
            os.stat(entry.path)
    return time.perf_counter() - started


def median_open(kind: str, path: Path, reps: int, cache: Path | None) -> tuple[float, float]:
    """Median seconds of a cold open (each in a fresh cache) and of a warm one (its second)."""
    cold, warm = [], []
    for _ in range(reps):
        with tempfile.TemporaryDirectory(prefix="o41-cache-", dir=cache) as directory:
            env = {**os.environ, "O41_INSPECT_CACHE": directory}
            command = [sys.executable, __file__, "--child", kind, str(path)]
            cold.append(run_child(command, env=env)["seconds"])
            warm.append(run_child(command, env=env)["seconds"])
    return statistics.median(cold), statistics.median(warm)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--child", nargs=2, metavar=("KIND", "PATH"))
    parser.add_argument("--reps", type=int, default=3)
    args = parser.parse_args()
    if args.child:
        child(*args.child)
        return
    rows = []
    with tempfile.TemporaryDirectory(prefix="o41-open-") as tmp:
        root = Path(tmp)
        for count in COUNTS:
            mds, lines = write_corpora(root, count)
            for kind, path in (("mds", mds), ("file list", lines)):
                cold, warm = median_open("mds" if kind == "mds" else "list", path, args.reps, root)
                base = statistics.median(floor("mds" if kind == "mds" else "list", path) for _ in range(5))
                rows.append(
                    f"| {kind} | {count:,} | {cold:.2f} | {warm:.2f} | {base:.3f} | {cold / base:.0f}x |"
                )
    body = "\n".join(
        [
            "## Open time of sources of many shards",
            "",
            preamble("uv run python benchmarks/open_bench.py"),
            "One-record local shards; the cold open writes the inspection cache (a fresh directory per",
            "repetition), the warm one reads it; medians of fresh processes. The floor is what no",
            "open can skip: parsing an MDS `index.json` with `json.loads`, or `os.stat` of each file.",
            "Issue 48 measured MDS directories of 1,000 / 4,000 / 8,000 shards opening in 4.4 / 37.0 /",
            "> 60 s (each shard's inspection parsed the whole index) and a first open of 4,000 listed",
            "shards in 3.8 s (a flush to disk per cache entry); goals: 30,000 MDS shards and a first open",
            "of 4,000 listed shards each under 1 s.",
            "",
            "| source | shards | cold open s | warm open s | floor s | cold / floor |",
            "|---|---:|---:|---:|---:|---:|",
            *rows,
        ]
    )
    write_section("open", body)
    print(body)


if __name__ == "__main__":
    main()
