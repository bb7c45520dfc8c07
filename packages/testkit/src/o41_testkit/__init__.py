"""The repository's test kit (not published): shard writers, a local S3 server and its helpers.

The pytest fixtures (``shard``, ``encoding``, ``s3_server``, ``boto3_client``, ``s3_prefix``,
``fault_proxy``) load through the ``pytest11`` entry point of :mod:`o41_testkit.fixtures`; the
names below are for tests to import.
"""

from o41_training_data import _local_s3 as _local_s3
from o41_training_data._local_s3 import LocalS3Server, weed_binary

from .fault_proxy import Fault, FaultProxy, RequestRecord
from .fixtures import ENCODINGS, S3_BUCKET, SUFFIX, Records, ShardWriter, boto3_client_for, write_shard
from .helpers import QUICK, collect, config_for, copy_without_times, data_for, rows_of, upload

__all__ = [
    "ENCODINGS",
    "QUICK",
    "S3_BUCKET",
    "SUFFIX",
    "Fault",
    "FaultProxy",
    "LocalS3Server",
    "Records",
    "RequestRecord",
    "ShardWriter",
    "boto3_client_for",
    "collect",
    "config_for",
    "copy_without_times",
    "data_for",
    "rows_of",
    "upload",
    "weed_binary",
    "write_shard",
]
