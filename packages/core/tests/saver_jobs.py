"""Worker functions for the saver tests (importable by ProcessPoolExecutor workers)."""

from __future__ import annotations

import os
import signal
from typing import Any

import o41_training_data._saver as saver_module
from o41_training_data import DatasetSaver


def records(split: str, stage: str | None, shard_id: int, n: int = 20) -> list[dict[str, Any]]:
    base = {"train": 0, "valid": 1_000_000}[split] + shard_id * 1000
    return [{"v": base + i, "tokens": list(range(i % 5)), "w": i / 2, "ok": i % 2 == 0} for i in range(n)]


def never_iterated() -> Any:
    """Records that fail the test if a saver consumes them (a completed shard must not)."""
    raise AssertionError("the records of a completed shard must not be consumed")
    yield  # pragma: no cover


def save_shard(job: tuple[DatasetSaver, str, str | None, dict | None, int]) -> str:
    saver, split, stage, metadata, shard_id = job
    return saver.save(
        split, stage, records(split, stage, shard_id), curriculum_metadata=metadata, shard_id=str(shard_id)
    ).location


def die_mid_save(victims: str) -> None:
    """Worker initializer: SIGKILL this process right before the descriptor of a victim shard is
    published, that is after its data object was written (a crash mid-save)."""
    chosen = set(victims.split(","))
    real = saver_module._publish_descriptor

    def publish(store: Any, uri: str, document: bytes) -> None:
        name = uri.rsplit("/", 1)[-1]
        if name.split(".")[0].removeprefix("shard-") in chosen:
            os.kill(os.getpid(), signal.SIGKILL)
        real(store, uri, document)

    saver_module._publish_descriptor = publish
