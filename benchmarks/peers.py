"""This project against the loaders users would pick instead, side by side in one run.

    make bench        # or: uv run --group bench python benchmarks/peers.py --reps 3

Every contender runs the same job on the same corpus (benchmarks/corpus.py): fixed batches of
32 x 2,048 int32 tokens (truncate/pad) plus the 0/1 mask, from a two-source 3:1 mix (the first
three quarters of the shards against the rest), shuffled with a window of about 4,096 rows, on
this machine's cores, consumed by a NumPy sum. Each contender runs in its own process,
alternating, and reports steady-state rows/s and tokens/s, time to first batch, CPU seconds per
1,000 batches and peak RSS; resume at global batch 100,000 is measured where the contender can
seek, and estimated from its replay rate where it replays. Writes the "peers" section of
benchmarks/RESULTS.md and benchmarks/peers.png.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import json
import os
import resource
import statistics
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np

from contenders import numpy_of
from corpus import generate, jsonl_copy
from report import preamble, write_section

HERE = Path(__file__).parent
SEQ, BATCH, WINDOW, DEPTH = 2048, 32, 4096, 100_000
MDS_DIR = HERE / "data" / "mds"

Batches = Iterator[tuple[np.ndarray, np.ndarray]]


def split(shards: list[str]) -> tuple[list[str], list[str]]:
    cut = len(shards) * 3 // 4
    return shards[:cut], shards[cut:]


def fixed(values: np.ndarray, dtype: type) -> np.ndarray:
    out = np.zeros(SEQ, dtype=dtype)
    n = min(len(values), SEQ)
    out[:n] = values[:n]
    return out


def collate(rows: list[dict]) -> tuple[np.ndarray, np.ndarray]:
    tokens = np.stack([fixed(np.asarray(r["input_ids"]), np.int32) for r in rows])
    mask = np.stack([fixed(np.asarray(r["loss_mask"]), np.uint8) for r in rows])
    return tokens, mask


# --- this project -------------------------------------------------------------------------


def o41_config(shards: list[str]):
    from o41_training_data import BatchStreamConfig, FileSource, ProjectedField, Shuffle, Stage

    a, b = split(shards)
    return BatchStreamConfig(
        fields=[
            ProjectedField(name="tokens", source="input_ids", dtype="i32", length=SEQ, pad=0),
            ProjectedField(name="loss_mask", source="loss_mask", dtype="bool", length=SEQ, pad=False),
        ],
        stages=[
            Stage(
                sources=[FileSource(files=a, weight=3.0), FileSource(files=b, weight=1.0)],
                batch_size=BATCH,
                shuffle=Shuffle(buffer_rows=WINDOW),
                infinite=True,
            )
        ],
        seed=1,
        threads=os.cpu_count() or 2,
        prefetch_batches=4,
    )


def o41_checkpoint_at(shards: list[str], depth: int):
    """The checkpoint a run of the config takes after `depth` global batches (written directly:
    a checkpoint is positional, so there is no need to run that far to get one)."""
    from o41_training_data import Checkpoint, open_batch_stream

    with open_batch_stream(o41_config(shards)) as stream:
        document = json.loads(stream.checkpoint().to_json())
    document["cursor"]["next_batch"] = depth
    document["batches_yielded"] = depth
    document["rows_yielded"] = depth * BATCH
    return Checkpoint.from_json(json.dumps(document))


def o41_stream(shards: list[str], resume_at: int = 0) -> Batches:
    from o41_training_data import open_batch_stream, resume_batch_stream

    if resume_at:
        stream = resume_batch_stream(o41_checkpoint_at(shards, resume_at))
    else:
        stream = open_batch_stream(o41_config(shards))
    with stream:
        for batch in stream:
            arrays = batch.arrays()
            yield arrays["tokens"], arrays["loss_mask"]


def o41_torch(shards: list[str], resume_at: int = 0) -> Batches:
    from o41_training_data_torch import O41IterableDataset
    from torch.utils.data import DataLoader

    source = o41_checkpoint_at(shards, resume_at) if resume_at else o41_config(shards)
    for batch in DataLoader(O41IterableDataset(source), batch_size=None, num_workers=0):
        yield batch["tokens"].numpy(), batch["loss_mask"].numpy()


# --- peers --------------------------------------------------------------------------------


def hf_datasets(shards: list[str], resume_at: int = 0) -> Batches:
    from datasets import interleave_datasets, load_dataset
    from torch.utils.data import DataLoader

    a, b = split(shards)
    parts = [
        load_dataset("parquet", data_files=files, split="train", streaming=True).select_columns(
            ["input_ids", "loss_mask"]
        )
        for files in (a, b)
    ]
    mixed = interleave_datasets(parts, probabilities=[0.75, 0.25], seed=1, stopping_strategy="all_exhausted")
    mixed = mixed.shuffle(buffer_size=WINDOW, seed=1).repeat(None)
    loader = DataLoader(mixed, batch_size=BATCH, num_workers=2, collate_fn=collate)
    yield from loader


def convert_mds(shards: list[str]) -> float:
    """Writes the corpus as two MDS datasets once; returns the seconds that conversion took."""
    import pyarrow.parquet as pq
    from streaming import MDSWriter

    stamp = MDS_DIR / "done.json"
    if stamp.exists():
        done = json.loads(stamp.read_text())
        if isinstance(done, dict) and done.get("shards") == shards:
            return float(done["seconds"])
    start = time.perf_counter()
    for name, files in zip("ab", split(shards), strict=True):
        out = MDS_DIR / name
        if out.exists():
            import shutil

            shutil.rmtree(out)
        columns = {"input_ids": "ndarray:int32", "loss_mask": "ndarray:uint8"}
        with MDSWriter(out=str(out), columns=columns, size_limit="64mb") as writer:
            for path in files:
                table = pq.read_table(path, columns=["input_ids", "loss_mask"])
                for ids, mask in zip(
                    table.column("input_ids").to_pylist(), table.column("loss_mask").to_pylist(), strict=True
                ):
                    writer.write(
                        {
                            "input_ids": np.asarray(ids, dtype=np.int32),
                            "loss_mask": np.asarray(mask, dtype=np.uint8),
                        }
                    )
    seconds = time.perf_counter() - start
    stamp.write_text(json.dumps({"shards": shards, "seconds": seconds}))
    return seconds


def mosaic_streaming(shards: list[str], resume_at: int = 0) -> Batches:
    from streaming import Stream, StreamingDataset
    from torch.utils.data import DataLoader

    streams = [
        Stream(local=str(MDS_DIR / "a"), proportion=0.75),
        Stream(local=str(MDS_DIR / "b"), proportion=0.25),
    ]
    dataset = StreamingDataset(
        streams=streams,
        shuffle=True,
        shuffle_block_size=WINDOW,
        batch_size=BATCH,
        shuffle_seed=1,
    )
    if resume_at:
        epoch, sample = divmod(resume_at * BATCH, dataset.size)
        dataset.load_state_dict(
            {"epoch": epoch, "sample_in_epoch": sample, "num_canonical_nodes": 1, "shuffle_seed": 1}
        )
    loader = DataLoader(dataset, batch_size=BATCH, num_workers=2, collate_fn=collate)
    yield from loader


def grain_pipeline(shards: list[str], resume_at: int = 0) -> Batches:
    import grain
    import grain.experimental as ge

    a, b = split(shards)
    sources = [ge.ParquetIterDataset(files).map(lambda r: r) for files in (a, b)]
    mixed = grain.IterDataset.mix(sources, weights=[0.75, 0.25])
    shuffled = ge.WindowShuffleIterDataset(mixed, window_size=WINDOW, seed=1)
    batched = shuffled.batch(BATCH, batch_fn=collate)
    yield from batched


def torch_map_style(shards: list[str], resume_at: int = 0) -> Batches:
    import pyarrow as pa
    import pyarrow.parquet as pq
    import torch
    from torch.utils.data import DataLoader, Dataset

    class Rows(Dataset):
        def __init__(self) -> None:
            table = pa.concat_tables(pq.read_table(p, columns=["input_ids", "loss_mask"]) for p in shards)
            ids = table.column("input_ids").combine_chunks()
            mask = table.column("loss_mask").combine_chunks()
            self.offsets = numpy_of(ids.offsets)
            self.ids = numpy_of(ids.values)
            self.mask = numpy_of(mask.values).astype(np.uint8)

        def __len__(self) -> int:
            return len(self.offsets) - 1

        def __getitem__(self, i: int) -> dict:
            lo, hi = self.offsets[i], self.offsets[i + 1]
            return {"input_ids": self.ids[lo:hi], "loss_mask": self.mask[lo:hi]}

    rows = Rows()
    a, _ = split(shards)
    n_a = sum(pq.ParquetFile(p).metadata.num_rows for p in a)
    # A 3:1 mix by sampling weights (DistributedSampler-style shuffled indices, with replacement
    # weights per source), the usual map-style way to mix.
    weights = np.where(np.arange(len(rows)) < n_a, 0.75 / n_a, 0.25 / (len(rows) - n_a))
    sampler = torch.utils.data.WeightedRandomSampler(
        weights, num_samples=10**6, generator=torch.Generator().manual_seed(1)
    )
    loader = DataLoader(rows, batch_size=BATCH, sampler=sampler, num_workers=2, collate_fn=collate)
    yield from loader


def pyarrow_scan(shards: list[str], resume_at: int = 0) -> Batches:
    """The ceiling: one pass of batch-sized reads, no shuffle, no mix."""
    import pyarrow.parquet as pq

    while True:
        for path in shards:
            for record_batch in pq.ParquetFile(path).iter_batches(
                batch_size=BATCH, columns=["input_ids", "loss_mask"]
            ):
                if record_batch.num_rows == BATCH:
                    yield _scan_arrays(record_batch)


def _scan_arrays(record_batch) -> tuple[np.ndarray, np.ndarray]:
    out = []
    for column, dtype in ((record_batch.column(0), np.int32), (record_batch.column(1), np.uint8)):
        offsets = numpy_of(column.offsets)
        values = numpy_of(column.values)
        array = np.zeros((BATCH, SEQ), dtype=dtype)
        for i in range(BATCH):
            n = min(offsets[i + 1] - offsets[i], SEQ)
            array[i, :n] = values[offsets[i] : offsets[i] + n]
        out.append(array)
    return out[0], out[1]


CONTENDERS = {
    "o41-stream": (o41_stream, "seeks", ["o41_training_data"]),
    "o41-torch (num_workers=0)": (o41_torch, "seeks", ["torch", "o41_training_data_torch"]),
    "hf-datasets streaming": (hf_datasets, "replays", ["torch", "datasets"]),
    "mosaicml-streaming": (mosaic_streaming, "seeks", ["torch", "streaming"]),
    "grain": (grain_pipeline, "replays", ["grain", "grain.experimental"]),
    "torch map-style pyarrow": (torch_map_style, "replays", ["torch", "pyarrow.parquet"]),
    "pyarrow scan (ceiling)": (pyarrow_scan, "replays", ["pyarrow.parquet"]),
}


PROBE = 50


def probe(name: str, shards: list[str], depth: int) -> dict[str, float]:
    """Checksum of batch `depth` of an uninterrupted run, and of the first batch after resuming
    at `depth`: equal when the contender's resume is exact."""
    make = CONTENDERS[name][0]
    straight = None
    for i, (tokens, mask) in enumerate(make(shards, 0)):
        if i == depth:
            straight = int(tokens.sum(dtype=np.int64)) + int(mask.sum(dtype=np.int64))
            break
    tokens, mask = next(iter(make(shards, depth)))
    resumed = int(tokens.sum(dtype=np.int64)) + int(mask.sum(dtype=np.int64))
    return {"exact": float(straight == resumed)}


class RssSampler:
    """Peak resident memory of this process and its descendants (DataLoader workers), sampled.

    `ru_maxrss` cannot be used: a child started by fork inherits its parent's high-water mark.
    """

    def __init__(self) -> None:
        import threading

        self.peak = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    @staticmethod
    def _rss(pid: int) -> int:
        try:
            for line in Path(f"/proc/{pid}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
        except OSError:
            pass
        return 0

    @staticmethod
    def _children(pid: int) -> list[int]:
        out = []
        for task in Path(f"/proc/{pid}/task").glob("*"):
            with contextlib.suppress(OSError):
                out += [int(c) for c in (task / "children").read_text().split()]
        return out

    def _run(self) -> None:
        while not self._stop.is_set():
            pids, total, seen = [os.getpid()], 0, set()
            while pids:
                pid = pids.pop()
                if pid in seen:
                    continue
                seen.add(pid)
                total += self._rss(pid)
                pids += self._children(pid)
            self.peak = max(self.peak, total)
            self._stop.wait(0.02)

    def stop(self) -> int:
        self._stop.set()
        self._thread.join()
        return self.peak


def measure(name: str, shards: list[str], batches: int, resume_at: int) -> dict[str, float]:
    """Runs one contender in this process: steady state over `batches`, or one resumed batch."""
    make, _, modules = CONTENDERS[name]
    for module in modules:  # imports are not the loader's cost: load them before the clock
        __import__(module)
    sampler = RssSampler()
    start = time.perf_counter()
    cpu = time.process_time()
    first = steady = 0.0
    count = 0
    checksum = 0
    for tokens, mask in make(shards, resume_at):
        assert tokens.shape == (BATCH, SEQ)
        assert mask.shape == (BATCH, SEQ)
        checksum += int(tokens.sum(dtype=np.int64)) + int(mask.sum(dtype=np.int64))
        count += 1
        if count == 1:
            first = time.perf_counter() - start
            steady, cpu = time.perf_counter(), time.process_time()
            if resume_at:
                break
        if count == batches + 1:
            break
    seconds = time.perf_counter() - steady
    own_cpu = time.process_time() - cpu
    rows = (count - 1) * BATCH
    # DataLoader workers are children: once they exit, their CPU time and peak RSS show up here.
    children_before = resource.getrusage(resource.RUSAGE_CHILDREN)
    gc.collect()
    time.sleep(0.5)
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    child_cpu = (children.ru_utime + children.ru_stime) - (
        children_before.ru_utime + children_before.ru_stime
    )
    return {
        "first_batch_s": first,
        "rows_per_s": rows / seconds if seconds > 0 else 0.0,
        "cpu_per_1000_batches": (own_cpu + child_cpu) / max(count - 1, 1) * 1000,
        "peak_rss_mib": sampler.stop() / 2**20,
        "checksum": checksum,
    }


def run(name: str, rows: int, batches: int, resume_at: int = 0, probe: bool = False) -> dict[str, float]:
    env = {
        **os.environ,
        "OPENBLAS_NUM_THREADS": "1",
        "TOKENIZERS_PARALLELISM": "false",
        "PYTHONWARNINGS": "ignore",
    }
    command = [sys.executable, __file__, "--job", name, "--rows", str(rows), "--batches", str(batches)]
    command += ["--resume-at", str(resume_at)] + (["--probe"] if probe else [])
    out = subprocess.run(command, check=True, capture_output=True, text=True, env=env, timeout=900)
    result: dict[str, float] = json.loads(out.stdout.strip().splitlines()[-1])
    return result


def peer_versions() -> str:
    from importlib.metadata import version

    names = ["torch", "datasets", "mosaicml-streaming", "grain", "numpy"]
    return ", ".join(f"{n} {version(n)}" for n in names)


def plot(medians: dict[str, dict[str, float]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = list(medians)
    fig, (left, right) = plt.subplots(1, 2, figsize=(13, 4.5))
    left.barh(names, [medians[n]["rows_per_s"] for n in names], color="#3b7dd8")
    left.set_xlabel("rows/s, steady state (higher is better)")
    left.invert_yaxis()
    right.barh(names, [medians[n]["resume_s"] for n in names], color="#d8763b")
    right.set_xscale("log")
    right.set_xlabel(f"seconds to the first batch after global batch {DEPTH:,} (log; lower is better)")
    right.invert_yaxis()
    right.set_yticklabels([])
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rows", type=int, default=50_000)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--batches", type=int, default=600)
    parser.add_argument("--job")
    parser.add_argument("--resume-at", type=int, default=0)
    parser.add_argument("--probe", action="store_true")
    args = parser.parse_args()
    shards = [str(p) for p in generate(HERE / "data" / "corpus", args.rows)]
    if args.job and args.probe:
        print(json.dumps(probe(args.job, shards, PROBE)))
        return
    if args.job:
        print(json.dumps(measure(args.job, shards, args.batches, args.resume_at)))
        return
    conversion = convert_mds(shards)
    jsonl_seconds = jsonl_copy([Path(s) for s in shards], HERE / "data" / "corpus-jsonl")
    names = list(CONTENDERS)
    runs: dict[str, list[dict[str, float]]] = {n: [] for n in names}
    resumes: dict[str, list[float]] = {n: [] for n in names}
    for rep in range(args.reps):
        for name in names if rep % 2 == 0 else list(reversed(names)):
            runs[name].append(run(name, args.rows, args.batches))
            if CONTENDERS[name][1] == "seeks":
                resumes[name].append(run(name, args.rows, 1, resume_at=DEPTH)["first_batch_s"])
            print(f"rep {rep + 1} {name}: {runs[name][-1]['rows_per_s']:,.0f} rows/s", file=sys.stderr)

    exact = {n: bool(run(n, args.rows, 0, probe=True)["exact"]) for n in names if CONTENDERS[n][1] == "seeks"}

    def med(name: str, key: str) -> float:
        return statistics.median(r[key] for r in runs[name])

    medians: dict[str, dict[str, float]] = {}
    for name in names:
        m = {
            key: med(name, key)
            for key in ("rows_per_s", "first_batch_s", "cpu_per_1000_batches", "peak_rss_mib")
        }
        if resumes[name]:
            m["resume_s"] = statistics.median(resumes[name])
        else:  # replays: the time to read its way to the depth at its own steady rate
            m["resume_s"] = m["first_batch_s"] + DEPTH * BATCH / m["rows_per_s"]
        medians[name] = m
    ours = medians["o41-stream"]
    peers = [n for n in names if not n.startswith("o41") and "ceiling" not in n]
    best_peer = max(peers, key=lambda n: medians[n]["rows_per_s"])
    ceiling = medians["pyarrow scan (ceiling)"]
    seekers = [n for n in peers if CONTENDERS[n][1] == "seeks"]
    fastest_exact_peer = min(seekers, key=lambda n: medians[n]["resume_s"]) if seekers else None
    lowest_rss_peer = min(peers, key=lambda n: medians[n]["peak_rss_mib"])

    def spread(name: str, key: str) -> str:
        values = [r[key] for r in runs[name]]
        return f"{min(values):,.0f}-{max(values):,.0f}"

    tokens_per_row = {n: 0 for n in names}
    table = [
        "| contender | rows/s | spread | x ours | tokens/s | first batch s | resume at 100k s | resume | "
        "CPU s / 1k batches | peak RSS MiB | x ours |",
        "|---|---:|---:|---:|---:|---:|---:|---|---:|---:|---:|",
    ]
    del tokens_per_row
    for name in names:
        m = medians[name]
        if CONTENDERS[name][1] == "seeks":
            how = "seeks, exact" if exact[name] else "seeks, NOT exact"
        else:
            how = "replays (estimated; exact by replaying)"
        table.append(
            f"| {name} | {m['rows_per_s']:,.0f} | {spread(name, 'rows_per_s')} | {m['rows_per_s'] / ours['rows_per_s']:.2f} "
            f"| {m['rows_per_s'] * SEQ:,.0f} | {m['first_batch_s']:.2f} | {m['resume_s']:,.2f} | {how} "
            f"| {m['cpu_per_1000_batches']:.1f} | {m['peak_rss_mib']:,.0f} | {m['peak_rss_mib'] / ours['peak_rss_mib']:.2f} |"
        )

    def mark(ok: bool) -> str:
        return "met" if ok else "MISSED"

    vs_peer = ours["rows_per_s"] / medians[best_peer]["rows_per_s"]
    vs_ceiling = ours["rows_per_s"] / ceiling["rows_per_s"]
    resume_vs_open = ours["resume_s"] / ours["first_batch_s"]
    rss_vs_peer = ours["peak_rss_mib"] / medians[lowest_rss_peer]["peak_rss_mib"]
    rss_note = (
        "- **Peak RSS vs the lowest peer** is met in this run, and moves with that peer's own peak\n"
        "  RSS, which varies between runs (grain: 447 and 567 MiB in two runs of this benchmark)."
        if rss_vs_peer <= 0.5
        else "- **Peak RSS vs the lowest peer.** Our working set is dominated by two planned groups of a\n"
        "  shuffle window each (8,192 rows of 2 x 2,048 columns), plus the decode jobs in flight."
    )
    goals = [
        f"| rows/s vs the best peer ({best_peer}) | {vs_peer:.2f}x | >= 3x | {mark(vs_peer >= 3)} |",
        f"| rows/s vs the pyarrow scan ceiling | {vs_ceiling:.2f}x | >= 0.8x | {mark(vs_ceiling >= 0.8)} |",
        f"| resume at 100k vs our own first batch at 0 | {resume_vs_open:.2f}x | <= 2x | {mark(resume_vs_open <= 2)} |",
        f"| peak RSS vs the lowest peer ({lowest_rss_peer}) | {rss_vs_peer:.2f}x | <= 0.5x | {mark(rss_vs_peer <= 0.5)} |",
    ]
    if fastest_exact_peer is not None:
        r = ours["resume_s"] / medians[fastest_exact_peer]["resume_s"]
        goals.insert(
            2,
            f"| resume at 100k vs the fastest seeking peer ({fastest_exact_peer}) | {r:.2f}x | <= 0.5x | {mark(r <= 0.5)} |",
        )
    plot(medians, HERE / "peers.png")
    body = f"""## Against the peers (`benchmarks/peers.py`)

{preamble(f"uv run --group bench python benchmarks/peers.py --rows {args.rows} --reps {args.reps}")}
- Job: batches of 32 x 2,048 int32 tokens + 0/1 mask (truncate/pad), a 3:1 mix of two sources
  (the first three quarters of the shards against the rest), a shuffle window of ~4,096 rows, a
  NumPy sum per batch; steady state over {args.batches} batches after the first; {args.reps}
  repetitions, each contender in its own process, alternating; medians (rows/s min-max).
- Peer versions: {peer_versions()}
- Conversions, once: MDS for mosaicml-streaming {conversion:.1f} s; the jsonl.gz copy of the
  corpus {jsonl_seconds:.1f} s (measured when each was first written).
- Resume: contenders that seek (o41 through a checkpoint at that depth, mosaicml-streaming
  through `load_state_dict`) are measured in a fresh process; the others replay, and the figure
  is their time to first batch plus 100,000 batches at their own steady rate (estimated).
- Exactness of resume: for each contender that seeks, the first batch after resuming at batch
  {PROBE} is compared with batch {PROBE} of an uninterrupted run (o41 is also property-tested at
  every step). A contender that replays is exact by construction when its order is seeded, at
  the cost of reading everything before the resume point.

{chr(10).join(table)}

| goal | measured | target | |
|---|---:|---|---|
{chr(10).join(goals)}

![throughput and resume time per contender](peers.png)

### What moves these figures

- **Throughput vs the best peer.** This goal was missed and then met in successive runs with
  almost the same o41 figure (2.61x at 70,972 rows/s, 3.12x at 68,508): the best peer's own rate
  moved by a fifth between the runs (27,144 and 21,975 rows/s), so the goal sits at the edge of
  the noise. Between those two runs this contender did get faster, which the recorded figures
  hide: run alone, four times each and interleaved with the previous build, its medians went
  from 51,000 to 56,000 rows/s and from 1.04 to 0.87 CPU-seconds per 1,000 batches, while
  single runs of either build spread from 47,000 to 73,000 rows/s.
- **Resume vs mosaicml-streaming.** Neither replays. The first batch after an open or a resume
  is planned as a group of its own, so it waits for the reads of its own rows; before, it waited
  for the whole 4,096-row shuffle window holding it (0.13 s against mosaicml-streaming's 0.20 s).
{rss_note}
"""
    print(body)
    write_section("peers", body)


if __name__ == "__main__":
    main()
