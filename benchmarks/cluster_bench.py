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
import itertools
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


def read_unit_rows(name: str, paths: list[Path], rows: int) -> int:
    """Rows of the smallest piece of ``name``'s shards a reader can fetch alone: a 32 KiB page
    with a page index, a row group without one, a 1 MiB block of a gzip stream (what a rank
    reads past its rows), a whole MDS shard (compressed whole)."""
    row_bytes = sum(p.stat().st_size for p in paths) / rows
    if name.startswith("page index"):
        return max(1, round((32 << 10) / row_bytes))
    if name.startswith("jsonl.gz"):
        return max(1, round((1 << 20) / row_bytes))
    if name.startswith("MDS"):
        return 1 << 40
    return BLOCK


def floor(shards: list[str], layout: str, world: int, planned: int, block: int | None, unit: int) -> float:
    """The amplification the order itself makes the ranks share: each read unit charged to
    every rank whose rows it holds (``plan_reads``, the figure ``o41 plan`` prints)."""
    from o41_training_data import BatchStreamConfig, plan_reads

    config = BatchStreamConfig.from_dict(config_document(shards, layout, world, 0, planned, block))
    return plan_reads(config, world, read_unit_rows=unit, block_rows=BLOCK).amplification


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


def py1e_diversity(shard_sizes: list[int], nodes: int, block_size: int, batches: int) -> tuple[float, float]:
    """MosaicML streaming's py1e order over the same rows (one stream, its shards as MDS wrote
    them): each canonical node's samples in the order its device reads them, cut into batches of
    ``BATCH``; mean distinct 1,024-row blocks per batch and the fraction of consecutive neighbours."""
    import numpy as np
    from streaming.base.shuffle import get_shuffle

    ids = get_shuffle("py1e", np.array(shard_sizes, dtype=np.int64), nodes, 1, 0, block_size)
    per_node = len(ids) // nodes
    blocks, pairs, consecutive = [], 0, 0
    for node in range(nodes):
        samples = ids[node * per_node : (node + 1) * per_node].tolist()
        for k in range(0, len(samples) - BATCH + 1, BATCH):
            if len(blocks) >= batches:
                break
            batch = samples[k : k + BATCH]
            blocks.append(len({s // BLOCK for s in batch}))
            pairs += BATCH - 1
            consecutive += sum(b == a + 1 for a, b in itertools.pairwise(batch))
    return sum(blocks) / len(blocks), consecutive / max(pairs, 1)


def measure(
    shards: list[str],
    layout: str,
    world: int,
    block: int | None,
    sample: int | None,
    planned: int | None = None,
) -> dict[str, float]:
    """One pass of every rank of ``world`` (or ``sample`` of them), partitions planned for
    ``planned`` ranks (the world itself unless given)."""
    ranks = range(world) if sample is None else range(0, world, world // sample)
    documents = [config_document(shards, layout, world, r, planned or world, block) for r in ranks]
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
    parser.add_argument(
        "--uneven",
        default="64:24,64:96",
        help="PARTITIONS:WORLD pairs: worlds that do not divide the partitions they run",
    )
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
        unit = read_unit_rows(name, paths, args.rows)
        runs = [(layout, world, world) for layout in ("one", "planned") for world in worlds]
        runs += [
            ("planned", *(int(n) for n in pair.split(":"))) for pair in filter(None, args.uneven.split(","))
        ]
        for layout, planned, world in runs:
            sample = args.sample if world > 64 else None
            m = measure(shards, layout, world, block, sample, planned)
            least = floor(shards, layout, world, planned if layout == "planned" else 1, block, unit)
            order = f"blocks of {block}" if block else "shard order"
            label = "one partition" if layout == "one" else f"partitions={planned}, {order}"
            extrapolated = f" (sample of {args.sample}, extrapolated)" if sample else ""
            lines.append(
                f"| {name} | {label} | {world}{extrapolated} | **{m['bytes'] / size:.2f}x** | {least:.2f}x | "
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
    mds_index = json.loads((HERE / "data" / "corpus-mds-zstd" / "index.json").read_text())
    sizes = [shard["samples"] for shard in mds_index["shards"]]
    for nodes, block_size in ((8, WINDOW), (64, WINDOW), (8, 1 << 18)):
        blocks, consecutive = py1e_diversity(sizes, nodes, block_size, args.diversity_batches)
        label = f"MosaicML streaming py1e, {nodes} canonical nodes, shuffle_block_size={block_size:,}"
        table.append(f"| {label} | {blocks:.1f} | {consecutive:.1%} |")
        print(table[-1], flush=True)
    command = (
        f"uv run python benchmarks/cluster_bench.py --rows {args.rows} --worlds {args.worlds}"
        f" --uneven {args.uneven}"
    )
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

| corpus | order | world | amplification | the order's floor | bound MiB | readers MiB | peak RSS MiB | CPU us/row | open CPU ms | after open us/row |
|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|
{chr(10).join(lines)}

Batch diversity over the first {args.diversity_batches} batches of the page-index corpus (the order does not depend on
the world size):

{chr(10).join(table)}

Reading the table: the order's floor is what the order itself makes ranks share: each read
unit (a 32 KiB page with a page index, a row group without, a 1 MiB block of a gzip stream, a
whole MDS shard) charged to every rank that delivers one of its rows (`plan_reads`, what
`o41 plan` prints; footers, indexes and the first record open checks are not in it). Where the
measured amplification meets it, every rank reads each unit it needs once and nothing else.

With partitions planned for the world (partition layout 2: each source's epoch cut into one
contiguous share per partition), a rank reads only its shares but for the read units a share's
two ends cut, which two ranks both read: at most `partitions - 1` units per source per epoch.
That is what is left at 8 ranks (1.01x with a page index, 1.28x with row groups of 1,024
rows, on a corpus whose shares hold about 4.6 and 1.5 row groups per source). On this corpus
of 50,000 rows a share at 64 ranks holds less than one row group of either source (586 and
195 rows), so every row group is read by about two ranks and three without a page index
(3.5x, the order's floor); at 1,024 ranks a rank delivers 49 rows from row groups of 1,024,
and nothing short of reading less than a read unit can go below about 20x. The floor falls as
a share holds more units: about `1 + (partitions - 1) x sources x unit rows / rows` (10 TB on
1,024 ranks in row groups of 8 MB: 1.002x). With a page index the cost above the floor at 64
and 1,024 ranks is each rank's footers and page indexes of the shards it opens (about 280 KiB
a rank here), which a larger share makes small too.

A world that does not divide the partitions (24 or 96 ranks on 64) is exact; each partition
is then read by `world / gcd(world, partitions)` ranks (3 here), on top of the floor at 64.
Plan `partitions` as a multiple of every world size the run may move to (192 covers 24, 64
and 96, at three windows per rank on 64).

Batch diversity: in layout 2 rows move one by one (a window belongs to one rank whatever the
unit), so a batch of partitions=8 draws from 7.9 blocks with almost no consecutive neighbours,
against 3.6 and 38.8% for the default order; at 64 partitions a partition's window spans the
few blocks of its share on this corpus. MosaicML streaming's py1e over the same rows (its
shards as its `MDSWriter` cut them, one stream) is shown for its per-node order at the same
shuffle block of 4,096 rows and at its default block.
"""
    write_section("cluster", body)


if __name__ == "__main__":
    main()
