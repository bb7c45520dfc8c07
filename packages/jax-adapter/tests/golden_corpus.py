"""The corpus and config of the golden JAX checkpoint (``golden/orbax-v1``), rebuilt byte for byte.

The checkpoint's resolved document names the shards by their S3 URIs and content versions, so
the tests upload these exact bytes to the same keys of their local S3 server before restoring.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from o41_testkit import upload, write_shard
from o41_training_data import BatchStreamConfig, FileSource, ProjectedField, Shuffle, Stage

PREFIX = "s3://o41/golden/jax-v1/"
STEP = 6
"""The step the checkpoint was saved at, right after ``advance(1)``."""


def upload_corpus(client: Any, scratch: Path) -> None:
    """Writes the golden shards under ``scratch`` and uploads them to :data:`PREFIX`."""
    shards = {
        "a.jsonl": [{"v": i} for i in range(60)],
        "b.jsonl": [{"v": 1000 + i} for i in range(40)],
        "c.jsonl": [{"v": 5000 + i} for i in range(50)],
    }
    scratch.mkdir(parents=True, exist_ok=True)
    for name, rows in shards.items():
        path = write_shard(scratch / name, "jsonl", rows)
        upload(client, path, PREFIX + name)


def golden_config() -> BatchStreamConfig:
    """Two stages: a 2:1 mix of ``a`` and ``b``, then ``c`` alone."""
    return BatchStreamConfig(
        fields=[ProjectedField("v", "v", "i32")],
        stages=[
            Stage(
                sources=[
                    FileSource(files=[PREFIX + "a.jsonl"], weight=2.0),
                    FileSource(files=[PREFIX + "b.jsonl"]),
                ],
                batch_size=4,
                shuffle=Shuffle(buffer_rows=16, unit_rows=2),
                infinite=True,
            ),
            Stage(sources=[FileSource(files=[PREFIX + "c.jsonl"])], batch_size=4, infinite=True),
        ],
        seed=41,
        threads=1,
    )
