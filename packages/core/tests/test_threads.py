"""Streams shared between threads, closed from anywhere, and interrupted with Ctrl-C.

A hang is the failure these tests look for, so each runs with a bounded wait: in a child process
(``thread_jobs.py``) with a timeout, or on a thread joined with a timeout.
"""

from __future__ import annotations

import os
import queue
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from o41_testkit import QUICK, Fault, FaultProxy, LocalS3Server, data_for, upload, write_shard
from o41_training_data import BatchStreamConfig, FileSource, StreamClosedError

from thread_jobs import FIELDS

JOBS = Path(__file__).with_name("thread_jobs.py")


def run_job(*args: str, timeout: float = 120) -> str:
    done = subprocess.run(
        [sys.executable, str(JOBS), *args], capture_output=True, text=True, timeout=timeout, check=False
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout


def test_a_monitoring_thread_never_blocks_the_stream(tmp_path: Path) -> None:
    _, calls, batches = run_job("monitor", str(tmp_path)).split()
    assert int(calls) == 300
    assert int(batches) > 0  # the main thread iterated while the watcher ran


def test_two_threads_calling_next_get_distinct_whole_batches_in_order(tmp_path: Path) -> None:
    assert run_job("two-consumers", str(tmp_path)).strip() == "ok"


def s3_shards(tmp_path: Path, client: Any, prefix: str, count: int = 2, rows: int = 20_000) -> list[str]:
    """Parquet shards with many small row groups, so reading on keeps sending new requests."""
    uris = []
    for k in range(count):
        rows_of = [{"v": k * 100_000 + i, "tokens": [i % 5] * (i % 9)} for i in range(rows)]
        path = write_shard(tmp_path / f"part-{k}.parquet", "parquet", rows_of, row_group_rows=64)
        uris.append(upload(client, path, f"{prefix}part-{k}.parquet"))
    return uris


def test_close_from_another_thread_stops_a_next_blocked_on_a_stalled_read(
    tmp_path: Path, s3_server: LocalS3Server, boto3_client: Any, s3_prefix: str, fault_proxy: FaultProxy
) -> None:
    uris = s3_shards(tmp_path, boto3_client, s3_prefix, count=1)
    training_data = data_for(s3_server, fault_proxy.endpoint_url, retry=QUICK)
    config = BatchStreamConfig(
        fields=FIELDS,
        stages=[_stage(uris)],
        threads=1,
        prefetch_batches=1,
    )
    stream = training_data.batch_stream(config)
    next(stream)
    fault_proxy.add_fault(Fault(kind="stall", method="GET", seconds=60, times=10_000))
    last_batch = [time.monotonic()]
    outcome: queue.Queue[BaseException | None] = queue.Queue()

    def consume() -> None:
        try:
            while True:
                next(stream)
                last_batch[0] = time.monotonic()
        except BaseException as err:
            outcome.put(err)

    consumer = threading.Thread(target=consume, daemon=True)
    consumer.start()
    deadline = time.monotonic() + 60
    while time.monotonic() - last_batch[0] < 1.0:  # until next() has waited a whole second
        assert time.monotonic() < deadline, "the stream never reached the stalled reads"
        time.sleep(0.1)
    started = time.monotonic()
    stream.close()
    closing = time.monotonic() - started
    consumer.join(timeout=10)
    assert not consumer.is_alive(), "next() still blocked after close()"
    assert isinstance(outcome.get_nowait(), StreamClosedError)
    assert closing < 3.0, f"close() took {closing:.1f} s"


def _stage(uris: list[str]) -> Any:
    from o41_training_data import Stage

    return Stage(sources=[FileSource(files=uris)], batch_size=4, infinite=True)


class Child:
    """A ``thread_jobs.py interrupt`` child, its output read line by line with timeouts."""

    def __init__(self, op: str, uris: list[str], server: LocalS3Server, endpoint: str) -> None:
        env = {
            **os.environ,
            "AWS_ENDPOINT_URL": endpoint,
            "AWS_ACCESS_KEY_ID": server.access_key_id,
            "AWS_SECRET_ACCESS_KEY": server.secret_access_key,
            "AWS_REGION": server.region,
        }
        self.process = subprocess.Popen(
            [sys.executable, str(JOBS), "interrupt", op, *uris],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
        )
        self.lines: queue.Queue[str] = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            self.lines.put(line.strip())

    def expect(self, word: str, timeout: float = 60) -> str:
        try:
            line = self.lines.get(timeout=timeout)
        except queue.Empty:
            self.process.kill()
            _, errors = self.process.communicate()
            raise AssertionError(f"no '{word}' within {timeout} s: {errors[-3000:]}") from None
        assert line.startswith(word), line
        return line

    def send(self, text: str) -> None:
        assert self.process.stdin is not None
        self.process.stdin.write(text + "\n")
        self.process.stdin.flush()

    def finish(self) -> None:
        """Waits for the child to exit (killing it after a bound) and checks it exited cleanly."""
        try:
            _, errors = self.process.communicate(timeout=15)
        except subprocess.TimeoutExpired:
            self.process.kill()
            _, errors = self.process.communicate()
        assert self.process.returncode == 0, errors[-3000:]


@pytest.mark.parametrize(
    ("op", "fault"),
    [
        # Opening asks for each shard's size first: a service that stops answering that request.
        ("open", Fault(kind="stall", method="HEAD", seconds=60, times=10_000)),
        ("advance", Fault(kind="stall", method="GET", seconds=60, times=10_000)),
        ("close", Fault(kind="stall", method="GET", seconds=60, times=10_000)),
    ],
)
def test_ctrl_c_stops_blocking_calls_promptly(
    tmp_path: Path,
    s3_server: LocalS3Server,
    boto3_client: Any,
    s3_prefix: str,
    fault_proxy: FaultProxy,
    op: str,
    fault: Fault,
) -> None:
    uris = s3_shards(tmp_path, boto3_client, s3_prefix)
    child = Child(op, uris, s3_server, fault_proxy.endpoint_url)
    child.expect("ready")
    fault_proxy.add_fault(fault)
    child.send("go")
    child.expect("calling")
    time.sleep(1.0)
    child.process.send_signal(signal.SIGINT)
    signalled = time.monotonic()
    outcome, took = child.expect("", timeout=10).split()
    assert time.monotonic() - signalled < 2.0, "the interrupt was not seen promptly"
    if op == "open":
        assert outcome == "interrupted"  # the stalled request would otherwise hold it for a minute
    # advance and close stop reads in flight themselves: they return at once, stall or not.
    assert float(took) < 2.5
    child.finish()


def test_close_after_ctrl_c_in_next_is_prompt(
    tmp_path: Path, s3_server: LocalS3Server, boto3_client: Any, s3_prefix: str, fault_proxy: FaultProxy
) -> None:
    uris = s3_shards(tmp_path, boto3_client, s3_prefix)
    child = Child("next-then-close", uris, s3_server, fault_proxy.endpoint_url)
    child.expect("ready")
    fault_proxy.add_fault(Fault(kind="stall", method="GET", seconds=60, times=10_000))
    child.send("go")
    child.expect("calling")
    time.sleep(3.0)  # long enough to drain what was fetched before the stall and block in next()
    child.process.send_signal(signal.SIGINT)
    outcome, closing = child.expect("", timeout=10).split()
    assert outcome == "interrupted"
    assert float(closing) < 2.0, f"close() after the interrupt took {closing} s"
    child.finish()
