"""The torch adapter over S3 shards in DataLoader workers, and its in-process stream's stats."""

from __future__ import annotations

import pickle
from pathlib import Path
from typing import Any

import torch
from o41_testkit import LocalS3Server, data_for, upload, write_shard
from o41_training_data import BatchStreamConfig, FileSource, ProjectedField, Shuffle, Stage, open_batch_stream
from o41_training_data_torch import O41IterableDataset
from torch.utils.data import DataLoader

V = ProjectedField("v", "v", "i64")
T = ProjectedField("t", "tokens", "i32", length=3)


def records(shard: int, n: int) -> list[dict[str, Any]]:
    return [{"v": shard * 10_000 + i, "tokens": [i % 7] * (i % 4), "pad": "x" * 200} for i in range(n)]


def config(sources: list[FileSource], batch_size: int = 16) -> BatchStreamConfig:
    return BatchStreamConfig(
        fields=[V, T],
        stages=[Stage(sources=sources, batch_size=batch_size, shuffle=Shuffle(buffer_rows=128, unit_rows=4))],
        seed=7,
        threads=2,
    )


def test_the_torch_adapter_streams_s3_shards_in_dataloader_workers(
    tmp_path: Path, s3_server: LocalS3Server, boto3_client: Any, s3_prefix: str
) -> None:
    local, remote = [], []
    for k in range(3):
        path = write_shard(tmp_path / f"part-{k}.parquet", "parquet", records(k, 300), row_group_rows=64)
        local.append(str(path))
        remote.append(upload(boto3_client, path, f"{s3_prefix}part-{k}.parquet"))
    with open_batch_stream(config([FileSource(local)])) as stream:
        expected = [(b.arrays()["v"].tolist(), b.arrays()["t"].tolist()) for b in stream]
    dataset = O41IterableDataset(config([FileSource(remote)]), data_for(s3_server))
    # In this process first, so the workers below are forked from a parent whose I/O runtime and
    # pooled connections already exist; each child must build its own.
    in_process = [(b["v"].tolist(), b["t"].tolist()) for b in DataLoader(dataset, batch_size=None)]
    assert in_process == expected
    # Forked workers find the credentials the dataset's pickle refers to.
    loader = DataLoader(dataset, batch_size=None, num_workers=2)
    got = [(b["v"].tolist(), b["t"].tolist()) for b in loader]
    assert got == expected
    assert s3_server.secret_access_key.encode() not in pickle.dumps(dataset)


def test_forked_dataloader_workers_sign_with_the_parents_credential_provider(
    tmp_path: Path, s3_server: LocalS3Server, boto3_client: Any, s3_prefix: str
) -> None:
    import datetime
    import os

    from o41_training_data import TemporaryCredentials, TrainingData

    local, remote = [], []
    for k in range(2):
        path = write_shard(tmp_path / f"part-{k}.parquet", "parquet", records(k, 200), row_group_rows=64)
        local.append(str(path))
        remote.append(upload(boto3_client, path, f"{s3_prefix}part-{k}.parquet"))
    with open_batch_stream(config([FileSource(local)])) as stream:
        expected = [(b.arrays()["v"].tolist(), b.arrays()["t"].tolist()) for b in stream]
    callers = tmp_path / "callers"
    callers.mkdir()

    def provider() -> TemporaryCredentials:
        # Each process that signs asks for itself: the parent's cache and lock stay in the parent.
        (callers / str(os.getpid())).touch()
        expiry = datetime.datetime.now(datetime.timezone.utc) + datetime.timedelta(hours=1)
        return TemporaryCredentials(s3_server.access_key_id, s3_server.secret_access_key, expiry=expiry)

    data = TrainingData(
        s3_base_url=s3_server.endpoint_url, region=s3_server.region, credential_provider=provider
    )
    dataset = O41IterableDataset(config([FileSource(remote)]), data)
    in_process = [(b["v"].tolist(), b["t"].tolist()) for b in DataLoader(dataset, batch_size=None)]
    assert in_process == expected
    loader = DataLoader(dataset, batch_size=None, num_workers=2)
    assert [(b["v"].tolist(), b["t"].tolist()) for b in loader] == expected
    pids = {int(p.name) for p in callers.iterdir()}
    assert os.getpid() in pids
    # The parent and the worker that streams (the adapter's first worker streams the rank's
    # batches) each fetched their own.
    assert len(pids) == 2


def test_the_torch_dataset_shows_its_in_process_streams_stats(tmp_path: Path) -> None:
    path = write_shard(tmp_path / "a.jsonl", "jsonl", [{"v": i} for i in range(40)])
    dataset = O41IterableDataset(
        BatchStreamConfig(fields=[V], stages=[Stage(sources=[FileSource([str(path)])], batch_size=4)], seed=3)
    )
    assert dataset.stats is None  # no stream before iteration
    loader = torch.utils.data.DataLoader(dataset, batch_size=None)
    seen = 0
    for _ in loader:
        seen += 1
        stats = dataset.stats
        assert stats is not None
        assert stats.batches_delivered == seen
    final = dataset.stats  # the pass ended and closed its stream; its last counters stay
    assert final is not None
    assert final.batches_delivered == 10
    assert seen == 10
