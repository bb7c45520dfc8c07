"""One conformance suite every storage backend runs: local disk, SeaweedFS and moto.

Each check is a behaviour users meet wherever their corpus lives: every format reads exactly
what it holds, a stream resumes exactly from a checkpoint, a missing object is named, and a
shard that changed under a checkpoint is refused. Two S3 implementations run it, so no check
rests on one server's defaults rather than on the protocol.
"""

from __future__ import annotations

import shutil
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from o41_testkit import FormatCase, boto3_client_for, data_for, upload, write_format_case
from o41_training_data import (
    BatchStreamConfig,
    CheckpointError,
    ObjectNotFoundError,
    StorageConfig,
    open_batch_stream,
    resume_batch_stream,
)

BACKENDS = ["local", "seaweedfs", "moto"]


@dataclass
class Backend:
    """Where a test's objects live: ``base`` (a directory or an ``s3://`` prefix) and its storage."""

    name: str
    base: str
    storage: StorageConfig | None
    put: Callable[[Path, str], None]
    """Stores the local file at the name (relative to ``base``), replacing what is there."""
    remove: Callable[[str], None]

    def put_case(self, case: FormatCase) -> None:
        for name in case.files:
            self.put(case.root / name, name)


@pytest.fixture(params=BACKENDS)
def backend(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Backend]:
    if request.param == "local":
        store = tmp_path / "store"

        def copy(path: Path, name: str) -> None:
            (store / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(path, store / name)

        yield Backend("local", str(store), None, copy, lambda name: (store / name).unlink())
        return
    server: Any = request.getfixturevalue("s3_server" if request.param == "seaweedfs" else "moto_server")
    client = boto3_client_for(server)
    bucket = "o41" if request.param == "seaweedfs" else "o41-moto"
    if request.param == "moto":
        client.create_bucket(Bucket=bucket)  # moto keeps buckets for its life: idempotent there
    key_prefix = f"conformance-{uuid.uuid4().hex[:12]}"

    def put(path: Path, name: str) -> None:
        upload(client, path, f"s3://{bucket}/{key_prefix}/{name}")

    def remove(name: str) -> None:
        client.delete_object(Bucket=bucket, Key=f"{key_prefix}/{name}")

    try:
        yield Backend(
            request.param, f"s3://{bucket}/{key_prefix}", data_for(server).storage_config, put, remove
        )
    finally:
        client.close()


def rows(config: BatchStreamConfig, storage: StorageConfig | None) -> list[list[int]]:
    with open_batch_stream(config, storage=storage) as stream:
        return [row for batch in stream for row in _values(batch)]


def _values(batch: Any) -> list[list[int]]:
    (column,) = batch.arrays().values()
    return [value if isinstance(value, list) else [value] for value in column.tolist()]


def test_every_format_reads_exactly_what_it_holds(backend: Backend, format_case: FormatCase) -> None:
    backend.put_case(format_case)
    assert rows(format_case.config(backend.base), backend.storage) == format_case.expected()


@pytest.mark.parametrize("encoding", ["jsonl.gz", "megatron", "mds"])
def test_a_stream_resumes_exactly_from_a_checkpoint(backend: Backend, encoding: str, tmp_path: Path) -> None:
    case = write_format_case(encoding, tmp_path / "corpus")
    backend.put_case(case)
    expected = case.expected()
    with open_batch_stream(case.config(backend.base), storage=backend.storage) as stream:
        head = [row for _ in range(3) for row in _values(next(stream))]
        checkpoint = stream.checkpoint()
    with resume_batch_stream(checkpoint, storage=backend.storage) as resumed:
        tail = [row for batch in resumed for row in _values(batch)]
    assert head + tail == expected


def test_a_missing_object_is_named(backend: Backend, tmp_path: Path) -> None:
    case = write_format_case("jsonl", tmp_path / "corpus")
    config = case.config(backend.base)
    with pytest.raises(ObjectNotFoundError, match=case.entry):
        open_batch_stream(config, storage=backend.storage)


def test_a_shard_that_changed_under_a_checkpoint_is_refused(backend: Backend, tmp_path: Path) -> None:
    case = write_format_case("jsonl", tmp_path / "corpus")
    backend.put_case(case)
    with open_batch_stream(case.config(backend.base), storage=backend.storage) as stream:
        next(stream)
        checkpoint = stream.checkpoint()
    shorter = tmp_path / "shorter.jsonl"
    shorter.write_text("".join(f'{{"v": {i}}}\n' for i in range(5)))
    backend.put(shorter, case.entry)
    with pytest.raises(CheckpointError, match=case.entry):
        first_batch_after(checkpoint, backend.storage)
    backend.remove(case.entry)
    with pytest.raises(ObjectNotFoundError, match=case.entry):
        first_batch_after(checkpoint, backend.storage)


def first_batch_after(checkpoint: Any, storage: StorageConfig | None) -> list[list[int]]:
    with resume_batch_stream(checkpoint, storage=storage) as resumed:
        return _values(next(resumed))
