"""Child processes of the thread-safety and interrupt tests: a hang or a crash here cannot take the
test runner with it, and a signal reaches only this process.

    python tests/thread_jobs.py monitor DIR
    python tests/thread_jobs.py two-consumers DIR
    python tests/thread_jobs.py interrupt OP URI...     (OP: open, advance, close, next-then-close)

The interrupt jobs read ``s3://`` shards with settings from the ``AWS_*`` environment variables,
print ``ready`` and wait for ``go`` on stdin where the parent must first make storage slow,
print ``calling`` right before the operation under test, and then one line with the outcome
(``returned`` or ``interrupted``) and seconds the operation took.
"""

from __future__ import annotations

import contextlib
import dataclasses
import signal
import sys
import threading
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
from o41_training_data import (
    BatchStreamConfig,
    FileSource,
    ProjectedField,
    RetryPolicy,
    Shuffle,
    Stage,
    StreamClosedError,
    TrainingData,
    open_batch_stream,
)

FIELDS = [ProjectedField("v", "v", "i64"), ProjectedField("t", "tokens", "i32", length=8)]


def local_config(directory: Path) -> BatchStreamConfig:
    """A finite shuffled stage of 15,000 rows over three local Parquet shards."""
    paths = []
    for k in range(3):
        path = directory / f"part-{k}.parquet"
        rows = [{"v": k * 100_000 + i, "tokens": [i % 11] * (i % 9)} for i in range(5000)]
        pq.write_table(pa.Table.from_pylist(rows), path, row_group_size=500)
        paths.append(str(path))
    return BatchStreamConfig(
        fields=FIELDS,
        stages=[Stage(sources=[FileSource(files=paths)], batch_size=8, shuffle=Shuffle(buffer_rows=256))],
        seed=5,
        threads=2,
        prefetch_batches=2,
    )


def monitor(directory: Path) -> None:
    """A logger thread reads stats, positions and checkpoints every millisecond, 300 times, while
    the main thread iterates without pause: neither may deadlock the other."""
    config = local_config(directory)
    stream = open_batch_stream(
        dataclasses.replace(config, stages=[dataclasses.replace(config.stages[0], infinite=True)])
    )
    done = threading.Event()
    calls = 0

    def watch() -> None:
        nonlocal calls
        for _ in range(300):
            stats = stream.stats
            assert stream.checkpoint().batches_yielded >= stats.batches_yielded
            assert stream.position.batches_yielded >= 0
            calls += 1
            time.sleep(0.001)
        done.set()

    watcher = threading.Thread(target=watch)
    watcher.start()
    batches = 0
    while not done.is_set():
        next(stream)
        batches += 1
    watcher.join(timeout=10)
    assert not watcher.is_alive()
    assert calls == 300
    assert stream.stats.batches_yielded == batches
    stream.close()
    print(f"ok {calls} {batches}")


def two_consumers(directory: Path) -> None:
    """Two threads call next() on one stream: each gets whole batches, none twice, in order."""
    config = local_config(directory)
    with open_batch_stream(config) as reference_stream:
        head = [next(reference_stream) for _ in range(400)]
        reference = [(b.batch_index, b.arrays()["v"].tolist()) for b in head]
    stream = open_batch_stream(config)
    got: list[list[tuple[int, list[int]]]] = [[], []]

    def consume(k: int) -> None:
        for _ in range(200):
            batch = next(stream)
            got[k].append((batch.batch_index, batch.arrays()["v"].tolist()))

    threads = [threading.Thread(target=consume, args=(k,)) for k in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
        assert not thread.is_alive()
    for part in got:
        indexes = [index for index, _ in part]
        assert indexes == sorted(indexes), "each thread receives batches in order"
    assert sorted(got[0] + got[1]) == reference
    stream.close()
    print("ok")


def interrupt(op: str, uris: list[str]) -> None:
    """Runs ``op`` against storage the parent makes slow; Ctrl-C (SIGINT) must stop it promptly."""
    # A process started in the background of a shell without job control (a CI script's `cmd &`)
    # inherits SIGINT ignored, and Python then installs no KeyboardInterrupt handler: the test
    # would measure how the runner was launched, not the library.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    training_data = TrainingData(retry=RetryPolicy(initial_backoff_s=0.05, max_backoff_s=0.2))
    stages = [
        Stage(sources=[FileSource(files=uris[:1])], batch_size=4, infinite=True),
        Stage(sources=[FileSource(files=uris[1:])], batch_size=4, infinite=True),
    ]
    config = BatchStreamConfig(fields=FIELDS, stages=stages, threads=1, prefetch_batches=1)
    stream = None
    if op != "open":
        stream = training_data.batch_stream(config)
        next(stream)
    print("ready", flush=True)
    sys.stdin.readline()
    print("calling", flush=True)
    start = time.monotonic()
    outcome, took = "interrupted", None
    try:
        if op == "open":
            stream = training_data.batch_stream(config)
        elif op == "advance":
            stream.advance(1)
        elif op == "close":
            stream.close()
        elif op == "next-then-close":
            while True:
                next(stream)
        outcome, took = "returned", time.monotonic() - start
        time.sleep(5)  # a signal that comes after the call returned lands here
    except KeyboardInterrupt:
        if took is None:
            took = time.monotonic() - start
    if op == "next-then-close":
        closing = time.monotonic()
        stream.close()
        took = time.monotonic() - closing
        with contextlib.suppress(StreamClosedError):
            next(stream)
    print(outcome, f"{took:.3f}", flush=True)


if __name__ == "__main__":
    job = sys.argv[1]
    if job == "monitor":
        monitor(Path(sys.argv[2]))
    elif job == "two-consumers":
        two_consumers(Path(sys.argv[2]))
    elif job == "interrupt":
        interrupt(sys.argv[2], sys.argv[3:])
    else:
        raise SystemExit(f"unknown job {job}")
