"""The benchmark corpus: tokenised rows written as zstd Parquet shards, reproducibly.

    python benchmarks/corpus.py --rows 50000 --out benchmarks/data/corpus

Rows carry ``input_ids`` (int32, variable length, mean about 1,500, max 4,096) and a boolean
``loss_mask`` of the same length. The same seed always gives the same bytes. ``web_text``
writes a second corpus of the same columns whose lengths follow web text's long-tailed shape.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Literal

from o41_training_data._synthetic import token_table, write_parquet

ROWS_PER_SHARD = 5000
# Small pages with a page index let a rank read only the pages holding its own rows
# (docs/order.md); about five rows of this corpus fit one page.
PAGE_BYTES = 32 * 1024


def generate(out: Path, rows: int, seed: int = 0) -> list[Path]:
    """Writes the corpus under ``out`` unless an identical one is already there."""
    return _shards(out, rows, seed, "normal", 1500, 4096)


def web_text(out: Path, rows: int, seed: int = 0) -> list[Path]:
    """A second corpus, shaped like web text rather than like the benchmark corpus: log-normal
    lengths averaging 660 tokens (median about 400), a long tail clipped at 32,768. Against a
    2,048-token window most of its documents are short, the case document packing is for."""
    return _shards(out, rows, seed, "lognormal", 660, 32_768)


def _shards(
    out: Path, rows: int, seed: int, spread: Literal["normal", "lognormal"], mean: int, most: int
) -> list[Path]:
    out.mkdir(parents=True, exist_ok=True)
    stamp = out / "corpus.json"
    spec: dict[str, object] = {"rows": rows, "seed": seed, "rows_per_shard": ROWS_PER_SHARD, "version": 2}
    if spread != "normal":
        spec |= {"spread": spread, "mean": mean, "most": most}
    shards = [out / f"part-{i:04d}.parquet" for i in range((rows + ROWS_PER_SHARD - 1) // ROWS_PER_SHARD)]
    if stamp.exists() and json.loads(stamp.read_text()) == spec and all(p.exists() for p in shards):
        return shards
    for i, path in enumerate(shards):
        n = min(ROWS_PER_SHARD, rows - i * ROWS_PER_SHARD)
        table = token_table(
            n,
            seed=seed * 100_003 + i,
            mean_length=mean,
            max_length=most,
            first_id=i * ROWS_PER_SHARD,
            spread=spread,
        )
        write_parquet(table, path, page_bytes=PAGE_BYTES)
    stamp.write_text(json.dumps(spec))
    return shards


def jsonl_copy(shards: list[Path], out: Path) -> float:
    """Writes the same rows as jsonl.gz shards next to the Parquet ones, once; returns the
    seconds that conversion took."""
    from o41_training_data._synthetic import write_jsonl_gz

    out.mkdir(parents=True, exist_ok=True)
    targets = [out / p.name.replace(".parquet", ".jsonl.gz") for p in shards]
    stamp = out / "copy.json"
    names = [p.name for p in shards]
    if stamp.exists() and all(t.exists() for t in targets):
        done = json.loads(stamp.read_text())
        if isinstance(done, dict) and done.get("shards") == names:
            return float(done["seconds"])
    import time

    import pyarrow.parquet as pq

    start = time.perf_counter()
    for source, target in zip(shards, targets, strict=True):
        write_jsonl_gz(pq.read_table(source), target)
    seconds = time.perf_counter() - start
    stamp.write_text(json.dumps({"shards": names, "seconds": seconds}))
    return seconds


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rows", type=int, default=50_000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "data" / "corpus")
    args = parser.parse_args()
    shards = generate(args.out, args.rows, args.seed)
    print(f"{len(shards)} shards under {args.out}")


if __name__ == "__main__":
    main()
