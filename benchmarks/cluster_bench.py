"""What a cluster fetches per epoch: every rank of a world, each in its own process.

    uv run python benchmarks/cluster_bench.py --rows 50000

Writes the "cluster" section of benchmarks/RESULTS.md. The corpus is the benchmark corpus
(`corpus.py`: 1,024-row row groups, 32 KiB pages with a page index) and the same rows rewritten
without a page index (pyarrow's default pages), as jsonl.gz, and as MDS zstd shards of about
1,024 rows (MosaicML's `MDSWriter`); two sources 3:1 (the first shards and the rest), one finite
pass, batches of 32 rows of 2,048 ids + mask, `Shuffle(buffer_rows=4096)`.

For each layout, each layout of the order (one partition as before; partitions planned for the
world, with blocks) and each world size (1, 8, 64, and a sample of the ranks of 1,024,
extrapolated), every rank reads its share of the pass in a fresh process. The figures: the
bytes all ranks fetched over the corpus's bytes (`stats.sources[*].bytes_read`, summed), the
largest per-rank decoded-row bound (`memory_bound.batches`: the planned groups and queued
batches) and readers term (`memory_bound.readers`: readers' buffers and the cache of pages and
shards that later jobs read again), the largest per-rank peak RSS (`VmHWM`), CPU seconds per
delivered row of the slowest rank, and CPU in `open_batch_stream` apart from after it. Batch diversity (distinct 1,024-row blocks per 32-row batch, consecutive neighbours) is
measured on the world-1 order, which every world shares.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).parent
sys.path.insert(0, str(HERE))

from report import preamble, run_child, write_section  # noqa: E402

SEQ = 2048
BATCH = 32
WINDOW = 4096
BLOCK = 1024  # the diversity measure's block, and the row group of both layouts


def corpora(rows: int) -> dict[str, tuple[list[Path], int | None]]:
    """The page-index corpus, its copy without a page index, a jsonl.gz copy and an MDS zstd
    copy, each with the block it is read by: a row group (1,024 rows) for Parquet, so that no
    row group's pages or dictionary are read by two ranks, or twice by one; 1,024 rows for
    jsonl.gz; an MDS shard's own rows (None: the shards' order)."""
    import pyarrow.parquet as pq

    from corpus import generate

    paged = generate(HERE / "data" / "corpus", rows)
    plain_dir = HERE / "data" / "corpus-no-page-index"
    plain_dir.mkdir(parents=True, exist_ok=True)
    plain = []
    for shard in paged:
        target = plain_dir / shard.name
        if not target.exists() or target.stat().st_mtime < shard.stat().st_mtime:
            pq.write_table(pq.read_table(shard), target, compression="zstd", row_group_size=BLOCK)
        plain.append(target)
    from corpus import jsonl_copy

    gz_dir = HERE / "data" / "corpus-jsonl-gz"
    jsonl_copy(paged, gz_dir)
    gzipped = [gz_dir / p.name.replace(".parquet", ".jsonl.gz") for p in paged]
    return {
        "page index, 32 KiB pages": (paged, BLOCK),
        "no page index": (plain, BLOCK),
        "jsonl.gz": (gzipped, BLOCK),
        # An MDS shard is its own block: the planned order keeps the shard order (no block_rows).
        "MDS zstd, shards of about 1,024 rows": (mds_copy(paged, HERE / "data" / "corpus-mds-zstd"), None),
    }


def mds_copy(shards: list[Path], out: Path) -> list[Path]:
    """The same rows written by MosaicML's ``MDSWriter`` (zstd), each shard holding one block
    (1,024 rows, as a row group does), once; returns the shard files in order."""
    import numpy as np
    import pyarrow.parquet as pq
    from streaming import MDSWriter

    stamp = out / "copy.json"
    names = [p.name for p in shards]
    if not (stamp.exists() and json.loads(stamp.read_text()).get("shards") == names):
        # A sample is its two arrays (4 + 1 bytes an id) and a few bytes of MDS framing; a shard
        # closes before the sample that would take it past the limit. The mask is bytes of 0
        # and 1 (MDSWriter has no boolean arrays), read as the config's bool field.
        lengths = pq.read_table(shards[0], columns=["input_ids"]).column(0).combine_chunks()
        sample = int(5 * len(lengths.values) / len(lengths)) + 64
        columns = {"input_ids": "ndarray:int32", "loss_mask": "ndarray:uint8"}
        with MDSWriter(
            out=str(out), columns=columns, compression="zstd", size_limit=BLOCK * sample
        ) as writer:
            for shard in shards:
                for batch in pq.read_table(shard, columns=["input_ids", "loss_mask"]).to_batches(1024):
                    # Documents of their own lengths, as the Parquet rows hold them.
                    ids, mask = batch.column(0), batch.column(1)
                    id_at, id_values = ids.offsets.to_numpy(), ids.values.to_numpy()
                    mask_at = mask.offsets.to_numpy()
                    mask_values = mask.values.to_numpy(zero_copy_only=False).astype(np.uint8)
                    for i in range(len(ids)):
                        writer.write(
                            {
                                "input_ids": id_values[id_at[i] : id_at[i + 1]],
                                "loss_mask": mask_values[mask_at[i] : mask_at[i + 1]],
                            }
                        )
        stamp.write_text(json.dumps({"shards": names}))
    index = json.loads((out / "index.json").read_text())
    return [out / entry["zip_data"]["basename"] for entry in index["shards"]]


def config_document(
    shards: list[str], layout: str, world: int, rank: int, planned: int, block: int | None
) -> dict[str, Any]:
    """The stream: two sources 3:1, one finite pass; ``layout`` is ``one`` (one partition, as
    before partitions) or ``planned`` (``planned`` partitions, blocks of ``block`` rows, or the
    shards' own order where ``block`` is None)."""
    cut = max(1, len(shards) * 3 // 4)
    shuffle: dict[str, Any] = {"buffer_rows": WINDOW}
    if layout == "planned" and block is not None:
        shuffle["block_rows"] = block
    return {
        "fields": [
            {"name": "tokens", "source": "input_ids", "dtype": "i32", "shape": [SEQ]},
            {"name": "mask", "source": "loss_mask", "dtype": "bool", "shape": [SEQ], "pad": False},
        ],
        "stages": [
            {
                "sources": [{"files": shards[:cut], "weight": 3.0}, {"files": shards[cut:], "weight": 1.0}],
                "batch_size": BATCH,
                "shuffle": shuffle,
                "infinite": False,
            }
        ],
        "seed": 1,
        "threads": 2,
        "rank": rank,
        "world_size": world,
        "partitions": planned if layout == "planned" else 1,
    }


def peak_rss() -> int:
    """This process's peak resident bytes (``VmHWM``): ``ru_maxrss`` would report the parent's
    peak from before ``exec``, which Linux carries over."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError("no VmHWM in /proc/self/status")


def child(document: str) -> None:
    """Reads one rank's share; prints its bytes, rows, CPU seconds, bound and peak RSS."""
    from o41_training_data import BatchStreamConfig, open_batch_stream

    config = BatchStreamConfig.from_dict(json.loads(document))
    cpu = time.process_time()
    rows = 0
    with open_batch_stream(config) as stream:
        opened = time.process_time()
        for batch in stream:
            rows += batch.num_rows
        fetched = sum(source.bytes_read for source in stream.stats.sources)
        bound = stream.memory_bound.batches
        readers = stream.memory_bound.readers
    print(
        json.dumps(
            {
                "bytes": fetched,
                "rows": rows,
                "cpu": time.process_time() - cpu,
                "open_cpu": opened - cpu,
                "bound": bound,
                "readers": readers,
                "rss": peak_rss(),
            }
        )
    )


def diversity(
    shards: list[str], layout: str, planned: int, block: int | None, batches: int
) -> tuple[float, float]:
    """Mean distinct 1,024-row blocks per batch and the fraction of consecutive neighbours."""
    from o41_training_data import BatchStreamConfig, open_batch_stream

    document = config_document(shards, layout, 1, 0, planned, block)
    document["fields"] = [
        {"name": "source", "source": "@source", "dtype": "i64"},
        {"name": "row", "source": "@row_id", "dtype": "i64"},
    ]
    blocks, pairs, consecutive = [], 0, 0
    with open_batch_stream(BatchStreamConfig.from_dict(document)) as stream:
        for k, batch in enumerate(stream):
            if k >= batches:
                break
            arrays = batch.arrays()
            source, row = arrays["source"].tolist(), arrays["row"].tolist()
            blocks.append(len({(s, r // BLOCK) for s, r in zip(source, row, strict=True)}))
            for i in range(len(row) - 1):
                pairs += 1
                consecutive += source[i] == source[i + 1] and row[i + 1] == row[i] + 1
    return sum(blocks) / len(blocks), consecutive / max(pairs, 1)


def measure(
    shards: list[str], layout: str, world: int, block: int | None, sample: int | None
) -> dict[str, float]:
    ranks = range(world) if sample is None else range(0, world, world // sample)
    documents = [config_document(shards, layout, world, r, world, block) for r in ranks]
    results = [run_child([sys.executable, __file__, "--child", json.dumps(d)]) for d in documents]
    scale = world / len(results)
    return {
        "bytes": sum(r["bytes"] for r in results) * scale,
        "rows": sum(r["rows"] for r in results) * scale,
        "bound": max(r["bound"] for r in results),
        "readers": max(r["readers"] for r in results),
        "rss": max(r["rss"] for r in results),
        "cpu_per_row": max(r["cpu"] / max(r["rows"], 1) for r in results),
        "stream_cpu_per_row": max((r["cpu"] - r["open_cpu"]) / max(r["rows"], 1) for r in results),
        "open_cpu": max(r["open_cpu"] for r in results),
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rows", type=int, default=50_000)
    parser.add_argument("--worlds", default="1,8,64,1024")
    parser.add_argument("--sample", type=int, default=16, help="ranks measured of a world over 64")
    parser.add_argument("--diversity-batches", type=int, default=200)
    parser.add_argument("--child")
    args = parser.parse_args()
    if args.child:
        child(args.child)
        return
    worlds = [int(w) for w in args.worlds.split(",")]
    lines = []
    notes = []
    layouts = corpora(args.rows)
    for name, (paths, block) in layouts.items():
        shards = [str(p) for p in paths]
        size = sum(p.stat().st_size for p in paths)
        notes.append(f"{name}: {size / 1e6:.0f} MB in {len(paths)} shards")
        for layout in ("one", "planned"):
            for world in worlds:
                sample = args.sample if world > 64 else None
                m = measure(shards, layout, world, block, sample)
                order = f"blocks of {block}" if block else "shard order"
                label = "one partition" if layout == "one" else f"partitions={world}, {order}"
                extrapolated = f" (sample of {args.sample}, extrapolated)" if sample else ""
                lines.append(
                    f"| {name} | {label} | {world}{extrapolated} | **{m['bytes'] / size:.2f}x** | "
                    f"{m['bound'] / 2**20:.0f} | {m['readers'] / 2**20:.0f} | {m['rss'] / 2**20:.0f} | "
                    f"{m['cpu_per_row'] * 1e6:.0f} | {m['open_cpu'] * 1e3:.0f} | {m['stream_cpu_per_row'] * 1e6:.0f} |"
                )
                print(lines[-1], flush=True)
    paths, block = next(iter(layouts.values()))
    first = [str(p) for p in paths]
    table = ["| order | distinct 1,024-row blocks per batch | consecutive neighbours |", "|---|---:|---:|"]
    for layout, planned in (("one", 1), ("planned", 8), ("planned", 64)):
        blocks, consecutive = diversity(first, layout, planned, block, args.diversity_batches)
        label = (
            "one partition (today's default)"
            if layout == "one"
            else f"partitions={planned}, blocks of {block}"
        )
        table.append(f"| {label} | {blocks:.1f} | {consecutive:.1%} |")
        print(table[-1], flush=True)
    command = f"uv run python benchmarks/cluster_bench.py --rows {args.rows} --worlds {args.worlds}"
    body = f"""## Bytes fetched per epoch by a whole cluster (`benchmarks/cluster_bench.py`)

{preamble(command)}
- Corpora: {"; ".join(notes)}. Two sources 3:1, one finite pass, batches of 32 x 2,048 ids +
  mask, `Shuffle(buffer_rows=4096)`, every rank in its own process; a world of 1,024 is a sample
  of its ranks, extrapolated (said in the row).
- Amplification: bytes fetched by all ranks over the corpus's bytes. Bound: the largest rank's
  `memory_bound.batches` (planned rows and queued batches); readers: its `memory_bound.readers`
  (readers' buffers, and the cache of pages and shards later jobs read again). CPU:
  the slowest rank's CPU microseconds per delivered row, then the largest rank's CPU
  milliseconds in `open_batch_stream` (footers, inspection, the order's layouts: the same for
  every rank, whatever its share) and the slowest rank's CPU per row after it.

| corpus | order | world | amplification | bound MiB | readers MiB | peak RSS MiB | CPU us/row | open CPU ms | after open us/row |
|---|---|---:|---:|---:|---:|---:|---:|---:|---:|
{chr(10).join(lines)}

Batch diversity over the first {args.diversity_batches} batches of the page-index corpus (the order does not depend on
the world size):

{chr(10).join(table)}

Reading the table: a rank reads each byte of its rows once while the page cache holds what
several of its jobs read (Parquet chunks and pages, compressed MDS shards, 1 MiB blocks of a
gzip stream): one rank's pass reads 1.00-1.02x the corpus on Parquet and on MDS in shard order,
1.10x for MDS as one partition and 1.18x for jsonl.gz in blocks of 1,024 rows, where a window's
working set is larger than the cache. With partitions planned for the world, each block is
read by one rank where the windows of a round hold whole blocks. What is left at 8 and more
ranks (issue 47): partitions deal windows of the mixed sequence, so a source's block that
straddles a window boundary is read by two ranks; a pass of this corpus is shorter than one
round of 64 or 1,024 windows of 4,096 rows, so its last round is cut into windows smaller than
a block, which several ranks share; and since a job now reads a row group's chunks whole where
there is no page index (so that the next job finds them in the cache), a rank of 1,024 that
needs a few rows of a row group fetches all of it (41x, where reading up to its last row gave
25x before).
"""
    write_section("cluster", body)


if __name__ == "__main__":
    main()
