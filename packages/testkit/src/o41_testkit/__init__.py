"""The repository's test kit (not published): shard writers, a local S3 server and its helpers.

The pytest fixtures (``shard``, ``encoding``, ``format_case``, ``s3_server``, ``moto_server``,
``boto3_client``, ``s3_prefix``, ``fault_proxy``) load through the ``pytest11`` entry point of
:mod:`o41_testkit.fixtures`; the names below are for tests to import.
"""

from o41_training_data import _local_s3 as _local_s3
from o41_training_data._local_s3 import LocalS3Server, weed_binary

from .every_format import EVERY_FORMAT, FormatCase, write_format_case
from .fault_proxy import Fault, FaultProxy, RequestRecord
from .fixtures import S3_BUCKET, ShardWriter, boto3_client_for
from .helpers import QUICK, collect, config_for, copy_without_times, data_for, rows_of, upload
from .moto_server import MotoServer
from .shards import ENCODINGS, SUFFIX, Records, write_shard

__all__ = [
    "ENCODINGS",
    "EVERY_FORMAT",
    "QUICK",
    "S3_BUCKET",
    "SUFFIX",
    "Fault",
    "FaultProxy",
    "FormatCase",
    "LocalS3Server",
    "MotoServer",
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
    "write_format_case",
    "write_shard",
]
