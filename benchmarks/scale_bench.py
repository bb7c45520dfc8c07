"""Open and resume at corpus scale: manifests of 10 to 10,000 real shards, and a simulated
1,000,000-shard, 10-billion-row corpus at world sizes up to 16,384.

Writes the "scale" section of benchmarks/RESULTS.md.

Real manifests: small Parquet shards written once, listed by a manifest, opened and resumed
(a checkpoint 1,000 batches deep) locally and on a local SeaweedFS server behind a counting
proxy, which reports the requests open and resume send. A plain file list of the same shards
is opened with the inspection cache off (every shard counted) and warm, for contrast.

Simulation: a manifest of 1,000,000 shards whose row counts are drawn from a seed (about 10
billion rows in all). Only the first shard exists on disk: open must read the manifest and that
shard alone, or it fails. Each world size runs in a fresh process, which reports, for rank 0:
open time, RSS growth once open (the resolved document, the order function and the plan), the
time to take a checkpoint (the first and the next), its JSON's size and the time to write and
parse it, and the time to resume at global batch 10,000,000.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import secrets
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

HERE = Path(__file__).parent
sys.path.insert(0, str(HERE.parent / "tests"))

from report import preamble, run_child, write_section  # noqa: E402

ROWS_PER_SHARD = 1_000
BATCH = 32


def write_shards(root: Path, count: int) -> Path:
    """``count`` Parquet shards of ``ROWS_PER_SHARD`` rows and a manifest listing them; reused."""
    manifest = root / f"manifest-{count}.json"
    if manifest.exists():
        return manifest
    root.mkdir(parents=True, exist_ok=True)
    shards = []
    for k in range(count):
        path = root / f"part-{k:06d}.parquet"
        if not path.exists():
            table = pa.table({"v": pa.array(range(k * ROWS_PER_SHARD, (k + 1) * ROWS_PER_SHARD), pa.int64())})
            pq.write_table(table, path)
        shards.append(
            {
                "location": path.name,
                "rows": ROWS_PER_SHARD,
                "bytes": path.stat().st_size,
                "checksum": "none:0",
            }
        )
    document = {"format": "o41-data-manifest", "version": 1, "data_format": "parquet"}
    document["splits"] = {"train": {"shards": shards}}
    manifest.write_text(json.dumps(document))
    return manifest


def child(args: argparse.Namespace) -> None:
    """One measurement in a fresh process; prints a JSON line."""
    import o41_training_data as o41

    storage = None
    proxy = None
    if args.endpoint:
        from fault_proxy import FaultProxy

        # A counting proxy in this process, so requests are counted at exact points.
        proxy = FaultProxy(args.endpoint)
        proxy.start()
        storage = o41.TrainingData(
            s3_base_url=proxy.endpoint_url,
            region="us-east-1",
            access_key_id=os.environ["BENCH_KEY"],
            secret_access_key=os.environ["BENCH_SECRET"],
        ).storage_config
    field = o41.ProjectedField("v", "v", "i64")
    if args.files:
        source: Any = o41.FileSource(files=json.loads(Path(args.files).read_text()))
    else:
        source = o41.ManifestSource(args.manifest, "train")
    config = o41.BatchStreamConfig(
        fields=[field],
        stages=[o41.Stage(sources=[source], batch_size=BATCH, shuffle=o41.Shuffle(4096), infinite=True)],
        seed=7,
        threads=2,
        rank=0,
        world_size=args.world,
    )
    figures: dict[str, Any] = {}
    if proxy is not None:
        # What resolution alone reads (the part of open before any thread starts).
        o41.resolve_batch_stream_config(config, storage=storage)
        figures["resolve_requests"] = len(proxy.requests)
        proxy.clear()
    rss_before = rss_bytes()
    started = time.perf_counter()
    stream = o41.open_batch_stream(config, storage=storage)
    figures["open_s"] = time.perf_counter() - started
    figures["rss_open"] = rss_bytes() - rss_before
    figures["peak_open"] = rss_bytes("VmHWM") - rss_before
    if args.read_first:
        next(stream)
        figures["first_s"] = time.perf_counter() - started
        if proxy is not None:
            figures["first_requests"] = len(proxy.requests)
    # The first checkpoint hashes the resolved config for its fingerprint; later ones reuse it.
    started = time.perf_counter()
    checkpoint = stream.checkpoint()
    figures["checkpoint_s"] = time.perf_counter() - started
    started = time.perf_counter()
    stream.checkpoint()
    figures["checkpoint_again_s"] = time.perf_counter() - started
    stream.close()
    started = time.perf_counter()
    text = checkpoint.to_json()
    figures["to_json_s"] = time.perf_counter() - started
    figures["checkpoint_bytes"] = len(text.encode())
    document = json.loads(text)
    depth = args.depth - args.depth % args.world
    document["cursor"]["next_batch"] = depth
    document["batches_yielded"] = depth // args.world
    document["rows_yielded"] = depth // args.world * BATCH
    text = json.dumps(document)
    started = time.perf_counter()
    deep = o41.Checkpoint.from_json(text)
    figures["from_json_s"] = time.perf_counter() - started
    started = time.perf_counter()
    resumed = o41.resume_batch_stream(deep, storage=storage)
    figures["resume_s"] = time.perf_counter() - started
    if args.read_first:
        next(resumed)
        figures["resume_first_s"] = time.perf_counter() - started
    # A resumed stream's positions carry the checkpoint's fingerprint, checked when it was read.
    started = time.perf_counter()
    resumed.checkpoint()
    figures["resumed_checkpoint_s"] = time.perf_counter() - started
    resumed.close()
    if proxy is not None:
        proxy.stop()
    print(json.dumps(figures))


def rss_bytes(field: str = "VmRSS") -> int:
    """This process's resident set (``VmRSS``) or its peak so far (``VmHWM``), in bytes."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(f"{field}:"):
            return int(line.split()[1]) * 1024
    return 0


def measure(extra: list[str], env: dict[str, str] | None = None) -> dict[str, Any]:
    return run_child([sys.executable, __file__, "--child", *extra], env)


def median_of(reps: int, extra: list[str], env: dict[str, str] | None = None) -> dict[str, float]:
    return medians([measure(extra, env) for _ in range(reps)])


def medians(runs: list[dict[str, Any]]) -> dict[str, float]:
    return {key: statistics.median(r[key] for r in runs) for key in runs[0]}


def simulated_manifest(root: Path, shards: int, seed: int = 1) -> tuple[Path, int]:
    """A manifest of ``shards`` shards of 5,000-15,000 rows; only shard 0 exists on disk."""
    manifest = root / f"sim-{shards}.json"
    rng = random.Random(seed)
    rows = [rng.randint(5_000, 15_000) for _ in range(shards)]
    first = root / "sim-000000.parquet"
    pq.write_table(pa.table({"v": pa.array(range(rows[0]), pa.int64())}), first)
    entries = [{"location": first.name, "rows": rows[0], "bytes": first.stat().st_size, "checksum": "none:0"}]
    entries += [
        {
            "location": f"missing/sim-{k:07d}.parquet",
            "rows": rows[k],
            "bytes": 1_000_000,
            "checksum": "none:0",
        }
        for k in range(1, shards)
    ]
    document = {"format": "o41-data-manifest", "version": 1, "data_format": "parquet"}
    document["splits"] = {"train": {"shards": entries}}
    manifest.write_text(json.dumps(document))
    return manifest, sum(rows)


def simulated_config(manifest: Path, world_size: int, batch: int = BATCH) -> Any:
    """One infinite stage over a manifest's train split, shuffled over 4,096 rows: rank 0 of
    ``world_size``, one decode thread (the provenance and checkpoint benchmarks read no rows)."""
    import o41_training_data as o41

    return o41.BatchStreamConfig(
        fields=[o41.ProjectedField("v", "v", "i64")],
        stages=[
            o41.Stage(
                sources=[o41.ManifestSource(str(manifest), "train")],
                batch_size=batch,
                shuffle=o41.Shuffle(4096),
                infinite=True,
            )
        ],
        seed=7,
        threads=1,
        world_size=world_size,
    )


def run_s3(root: Path, counts: list[int], reps: int) -> list[list[str]]:
    import boto3
    from o41_testkit import LocalS3Server

    rows: list[list[str]] = []
    key, secret = "O41SCALE" + secrets.token_hex(4).upper(), secrets.token_urlsafe(30)
    with (
        tempfile.TemporaryDirectory(prefix="o41-scale-s3-") as data_dir,
        LocalS3Server(
            Path(data_dir), access_key_id=key, secret_access_key=secret, buckets=("o41",)
        ) as server,
    ):
        client = boto3.client(
            "s3",
            endpoint_url=server.endpoint_url,
            aws_access_key_id=key,
            aws_secret_access_key=secret,
            region_name=server.region,
        )
        uploaded: set[str] = set()
        env = dict(os.environ, BENCH_KEY=key, BENCH_SECRET=secret)
        for count in counts:
            manifest = write_shards(root, count)
            names = [s["location"] for s in json.loads(manifest.read_text())["splits"]["train"]["shards"]]
            for name in names:
                if name not in uploaded:
                    client.upload_file(str(root / name), "o41", f"scale/{name}")
                    uploaded.add(name)
            client.upload_file(str(manifest), "o41", f"scale/{manifest.name}")
            extra = ["--manifest", f"s3://o41/scale/{manifest.name}", "--endpoint", server.endpoint_url]
            figures = median_of(reps, [*extra, "--world", "8", "--read-first"], env)
            rows.append(row(count, "SeaweedFS", figures))
        client.close()
    return rows


def row(count: int, storage: str, figures: dict[str, float]) -> list[str]:
    requests = (
        f"{figures['resolve_requests']:.0f} / {figures['first_requests']:.0f}"
        if "resolve_requests" in figures
        else "-"
    )
    return [
        f"{count:,}",
        storage,
        f"{figures['open_s']:.3f}",
        f"{figures['first_s']:.3f}",
        f"{figures['resume_first_s']:.3f}",
        requests,
    ]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--child", action="store_true")
    parser.add_argument("--manifest")
    parser.add_argument("--files")
    parser.add_argument("--endpoint")
    parser.add_argument("--world", type=int, default=1)
    parser.add_argument("--depth", type=int, default=1000)
    parser.add_argument("--read-first", action="store_true")
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--sim-shards", type=int, default=1_000_000)
    args = parser.parse_args()
    if args.child:
        child(args)
        return

    root = HERE / "data" / "scale"
    counts = [10, 1_000, 10_000]
    real: list[list[str]] = []
    for count in counts:
        manifest = write_shards(root, count)
        figures = median_of(args.reps, ["--manifest", str(manifest), "--world", "8", "--read-first"])
        real.append(row(count, "local", figures))
    real += run_s3(root, counts, args.reps)
    by = {(r[0], r[1]): r for r in real}

    def flag(ratio: float) -> str:
        return "met" if ratio <= 1.5 else "MISSED"

    local_ratio = float(by[("10,000", "local")][3]) / float(by[("10", "local")][3])
    local_open = float(by[("10,000", "local")][2]) / float(by[("10", "local")][2])
    s3_open = float(by[("10,000", "SeaweedFS")][2]) / float(by[("10", "SeaweedFS")][2])
    per_shard_us = (float(by[("10,000", "local")][2]) - float(by[("10", "local")][2])) / 9_990 * 1e6
    s3_ratio = float(by[("10,000", "SeaweedFS")][3]) / float(by[("10", "SeaweedFS")][3])

    # A plain file list of the 10,000 shards: counted at open without the cache, not with it.
    listing = root / "files-10000.json"
    listing.write_text(json.dumps([str(root / f"part-{k:06d}.parquet") for k in range(10_000)]))
    with tempfile.TemporaryDirectory(prefix="o41-inspect-cache-") as cache:
        cold = median_of(args.reps, ["--files", str(listing)], dict(os.environ, O41_INSPECT_CACHE="off"))
        measure(["--files", str(listing)], dict(os.environ, O41_INSPECT_CACHE=cache))
        warm = median_of(args.reps, ["--files", str(listing)], dict(os.environ, O41_INSPECT_CACHE=cache))

    with tempfile.TemporaryDirectory(prefix="o41-sim-") as sim_dir:
        started = time.perf_counter()
        manifest, total_rows = simulated_manifest(Path(sim_dir), args.sim_shards)
        written = time.perf_counter() - started
        size_mb = manifest.stat().st_size / 1e6
        sim: list[list[str]] = []
        sim_peaks: list[float] = []
        # Fewer repetitions than the real manifests: each process parses 100 MB of JSON twice.
        sim_reps = min(args.reps, 3)
        worlds = (8, 1_024, 16_384)
        # World sizes take turns, so a drift in the machine's speed during the run does not
        # read as a difference between them.
        runs: dict[int, list[dict[str, Any]]] = {world: [] for world in worlds}
        for rep in range(sim_reps):
            for world in worlds if rep % 2 == 0 else reversed(worlds):
                runs[world].append(
                    measure(["--manifest", str(manifest), "--world", str(world), "--depth", "10000000"])
                )
        for world in worlds:
            figures = medians(runs[world])
            sim_peaks.append(figures["peak_open"])
            sim_checkpoint_mb = figures["checkpoint_bytes"] / 1e6
            sim.append(
                [
                    f"{world:,}",
                    f"{figures['open_s']:.2f}",
                    f"{figures['rss_open'] / 2**20:,.0f}",
                    "2 (the manifest, shard 0)",
                    f"{figures['checkpoint_s']:.2f} / {figures['checkpoint_again_s'] * 1e6:,.0f} µs",
                    f"{figures['checkpoint_bytes'] / 1e6:,.0f} MB, {figures['to_json_s']:.2f} / "
                    f"{figures['from_json_s']:.2f}",
                    f"{figures['resume_s']:.2f}",
                    f"{figures['resumed_checkpoint_s'] * 1e6:,.0f} µs",
                ]
            )
    sim_opens = [float(r[1]) for r in sim]
    sim_bytes_per_shard = (
        statistics.median(float(r[2].replace(",", "")) for r in sim) * 2**20 / args.sim_shards
    )
    sim_peak_mib = max(sim_peaks) / 2**20
    sim_flat = max(sim_opens) / min(sim_opens)
    # The rank-CPU goal's bound (order section) serves as what counts as flat here.
    sim_flat_note = "flat" if sim_flat <= 1.25 else "**more than the 1.25x counted as flat**"

    table = "\n".join("| " + " | ".join(r) + " |" for r in real)
    sim_table = "\n".join("| " + " | ".join(r) + " |" for r in sim)
    command = f"uv run python benchmarks/scale_bench.py --reps {args.reps}"
    body = f"""## Open and resume at corpus scale (`benchmarks/scale_bench.py`)

{preamble(command)}
- Real manifests: Parquet shards of {ROWS_PER_SHARD} rows, one infinite shuffled stage, batch
  {BATCH}, world size 8, rank 0, 2 threads; each figure the median of {args.reps} fresh
  processes (with `OPENBLAS_NUM_THREADS=1`: NumPy's idle BLAS pool otherwise spins a core
  through a fresh process's first tenth of a second, which is when open runs). *Open* is `open_batch_stream` until it returns; *first batch* adds the first
  `next` (what a training job waits for); *resume* is `resume_batch_stream` of a checkpoint
  1,000 global batches deep, to its first batch. *Requests* are what a proxy in front of
  SeaweedFS saw for resolution alone (the manifest and one shard per source: every request open
  makes before its threads start) / from open to the first batch (the first batch's shards,
  inspected and read; the rest of the first window, about 33 shards for a world-8 rank's first
  4,096 rows, is planned once that batch is delivered).

| shards | storage | open s | open to first batch s | resume to first batch s | requests: resolve / to first batch |
|---|---|---:|---:|---:|---:|
{table}

Goal: a 10,000-shard manifest within 1.5x of a 10-shard one. Measured to the first batch: local
**{local_ratio:.2f}x** ({flag(local_ratio)}), SeaweedFS **{s3_ratio:.2f}x** ({flag(s3_ratio)});
open alone: local {local_open:.2f}x ({flag(local_open)}), SeaweedFS {s3_open:.2f}x
({flag(s3_open)}).

What the ratio measures: open sends the same requests at every size (the resolve column), and no
shard is read to count it, so the time that grows with the shard count is bookkeeping: parsing
the manifest's entries and building one resolved entry per shard (its location, rows, size and
checksum; the order function and the plan keep a few words per shard and read the rest from
it), about {per_shard_us:.1f} µs per shard here. Against a 10-shard open of a few milliseconds
that is still several times more on local disk; on object storage, where the round trips of the
first batch's reads dominate, it is the smaller part. A profile of repeated 10,000-shard opens
puts over half of open in `serde_json` parsing the manifest's entries (their strings borrowed
from the document, not copied), and the first batch also computes the config fingerprint that
its position carries, over every shard. The 1.5x goal needs a manifest that open does not parse
whole (sharded manifests read per split, or a binary shard index).

The same 10,000 shards as a plain file list: open {cold["open_s"]:.2f} s with the inspection
cache off (every shard counted), {warm["open_s"]:.2f} s with a warm cache (a `stat` per shard,
one shard read).

### Simulated: {args.sim_shards:,} shards, {total_rows / 1e9:.1f} billion rows

The manifest ({size_mb:,.0f} MB of JSON, written in {written:.0f} s) lists shards whose files,
but for the first, do not exist, so open succeeds only if it reads nothing else. Each figure is
the median of {sim_reps} fresh processes per world size (the world sizes taking turns), rank 0,
batch {BATCH} per rank.

| world size | open s | RSS growth once open, MiB | shard and manifest reads at open | `stream.checkpoint()`: first s / again | checkpoint JSON: size, `to_json` / `from_json` s | resume at global batch 10,000,000, s | first checkpoint after resume |
|---|---:|---:|---|---:|---:|---:|---:|
{sim_table}

Open time across world sizes varies by **{sim_flat:.2f}x** ({sim_flat_note}; the order function's
state is per source, not per rank). What open and resume cost grows with the shard count only through
parsing the manifest (or the checkpoint's resolved document) and holding one entry per shard,
about {sim_bytes_per_shard:.0f} bytes a shard once open ({sim_peak_mib:,.0f} MiB at most while
opening, the manifest's text included); no request is sent per shard.

A checkpoint carries the resolved config whole (every shard's location, rows, size and
checksum), so at this scale it is {sim_checkpoint_mb:,.0f} MB of JSON per rank, written with the
model checkpoint. Its first `stream.checkpoint()` hashes that document once for the fingerprint
every position carries; later ones share the stream's document and reuse the hash, so
checkpointing every step costs microseconds. `Checkpoint.from_json` parses the document in one
pass and hashes it again to refuse an altered one; both it and `to_json` release the GIL.
Resume is `resume_batch_stream` of the parsed checkpoint: it rebuilds the plan from the document
without reading the manifest or any shard but the first. The resumed stream takes the
checkpoint's fingerprint, which `from_json` checked, so its first checkpoint (the last column)
costs what a fresh stream's later ones do, not another hash of the document.
"""
    write_section("scale", body)
    print(body)


if __name__ == "__main__":
    main()
