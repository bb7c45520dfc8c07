"""Issue 48, case 14: opening an MDS dataset directory reads its ``index.json`` once, as a
manifest, not once per shard (open of 8,000 shards took over a minute, quadratic in the count).
The index promises each shard's samples and size; a shard that breaks the promise fails closed
when it is first read."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from o41_testkit import FaultProxy, LocalS3Server, data_for, upload
from o41_testkit.corpora import token_corpus, write_mds_tokens_plain
from o41_training_data import (
    BatchStreamConfig,
    FileSource,
    MalformedShardError,
    ProjectedField,
    Stage,
    open_batch_stream,
)

SHARDS = 60


def config(directory: str, batch_size: int = 4) -> BatchStreamConfig:
    return BatchStreamConfig(
        fields=[ProjectedField("ids", "tokens", "i32", length=4, pad=-1)],
        stages=[Stage(sources=[FileSource([directory], encoding="mds")], batch_size=batch_size)],
        threads=2,
    )


def test_open_over_s3_asks_for_the_index_once_whatever_the_shard_count(
    tmp_path: Path, s3_server: LocalS3Server, boto3_client: Any, s3_prefix: str, fault_proxy: FaultProxy
) -> None:
    docs = token_corpus([3] * SHARDS)
    local = write_mds_tokens_plain(tmp_path / "mds", docs, per_shard=1)
    for file in sorted(local.iterdir()):
        upload(boto3_client, file, f"{s3_prefix}mds/{file.name}")
    data = data_for(s3_server, fault_proxy.endpoint_url)
    # What open does before any batch is read: resolving the config. (A stream's read jobs
    # start while open returns, so the requests seen right after it include theirs on a loaded
    # machine; resolving alone starts none.)
    data.resolve_batch_stream_config(config(f"{s3_prefix}mds"))
    at_open = list(fault_proxy.requests)
    with data.batch_stream(config(f"{s3_prefix}mds")) as stream:
        rows = [r for b in stream for r in b.arrays()["ids"].tolist()]
    assert sorted(r[:3] for r in rows) == sorted(docs)
    index_reads = [r for r in at_open if r.path.endswith("/index.json")]
    shard_reads = {r.path for r in at_open if not r.path.endswith("/index.json")}
    # The index for the listing (and the one shard whose first record checks the fields).
    assert len(index_reads) <= 4, index_reads
    assert len(shard_reads) <= 1, sorted(shard_reads)


def test_a_shard_that_breaks_the_index_fails_closed_when_read(tmp_path: Path) -> None:
    local = write_mds_tokens_plain(tmp_path / "mds", token_corpus([3] * 6), per_shard=2)
    index = json.loads((local / "index.json").read_text())
    last = local / index["shards"][-1]["raw_data"]["basename"]
    last.write_bytes(last.read_bytes() + b"\0")  # another size than the index lists
    # Open does not look at it (the index promises it); the read that first needs it does.
    with open_batch_stream(config(str(local), batch_size=2)) as stream:
        next(stream)
        with pytest.raises(MalformedShardError, match=r"index lists 174 bytes, the shard is 175 bytes"):
            for _ in stream:
                pass
