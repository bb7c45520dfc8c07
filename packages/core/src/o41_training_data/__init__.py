"""o41-training-data: deterministic, resumable training-data streams.

A Rust engine reads Parquet, JSON Lines and framed MessagePack shards, projects each record
onto fixed-shape numeric columns, and hands batches to Python as zero-copy Arrow/NumPy arrays.

Examples:
    >>> from o41_training_data import (
    ...     BatchStreamConfig, FileSource, ProjectedField, Stage, open_batch_stream,
    ... )
    >>> config = BatchStreamConfig(
    ...     fields=[ProjectedField(name="tokens", source="input_ids", dtype="i32", length=2048)],
    ...     stages=[Stage(sources=[FileSource(files=["part-000.parquet"])], batch_size=32)],
    ... )
    >>> with open_batch_stream(config) as stream:  # doctest: +SKIP
    ...     for batch in stream:
    ...         tokens = batch.arrays()["tokens"]  # int32 (32, 2048)

"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

# Names are imported from their modules when first used (PEP 562), so that `import
# o41_training_data` and the `o41` command line start without NumPy, PyArrow or Jinja; a
# command that needs a module imports it. Type checkers and IDEs read the imports below.
if TYPE_CHECKING:
    from ._chat import ROLE_IDS, ChatEncoder, ChatEncoding, ChatTemplate, RenderedChat
    from ._checkpoint_files import (
        checkpoint_from_text,
        read_checkpoint,
        restore_run_checkpoint,
        save_run_files,
        stale_run_files,
        write_checkpoint,
    )
    from ._config import (
        DTYPES,
        ENCODINGS,
        BatchStreamConfig,
        DType,
        Encoding,
        FileSource,
        ManifestSource,
        Packing,
        ProjectedField,
        Ramp,
        Shuffle,
        Stage,
        TokenWindows,
    )
    from ._core import (
        RUN_STATE_FORMAT,
        RUN_STATE_VERSION,
        Checkpoint,
        Drain,
        Position,
        RunIndex,
        RunState,
        Segment,
        __version__,
    )
    from ._errors import (
        AccessDeniedError,
        CheckpointError,
        ConfigError,
        DataError,
        MalformedShardError,
        O41Error,
        ObjectConflictError,
        ObjectNotFoundError,
        ProjectionError,
        StorageError,
        StreamClosedError,
        UnsupportedFormatError,
    )
    from ._iter_shard import iter_shard
    from ._limits import LIMITS
    from ._manifest import (
        Curriculum,
        DataManifest,
        ManifestShard,
        ManifestSplit,
        load_manifest,
        save_manifest,
    )
    from ._manifest_build import manifest_from_files
    from ._plan import ReadPlan, plan_reads
    from ._rank_stream import RankStream
    from ._rules import (
        PROCESS_FILE,
        RANK_FILE,
        DeliveredField,
        StageBatches,
        StreamRules,
        SwitchPoint,
        check_adapter_options,
        check_same_place,
        check_same_stream,
        check_stream_of,
        find_rank_files,
        move_to_world,
        observed_ranks,
        parse_rank_file_name,
        process_ranks,
        rank_file_name,
        rank_files_among,
        resume_point,
        switch_point,
        with_ranks,
        write_rank_file,
    )
    from ._saver import DatasetSaver, SavedShard
    from ._stats import RETRY_CAUSES, DecodeStats, MixShare, ReadStats, SourceStats, StageDelivered
    from ._stats_log import log_stats_every
    from ._storage import CredentialProvider, RetryPolicy, StorageConfig, TemporaryCredentials
    from ._stream import (
        Batch,
        BatchStream,
        MemoryBound,
        StreamStats,
        TokenStats,
        open_batch_stream,
        resolve_batch_stream_config,
        resume_batch_stream,
    )
    from ._tokenize import TokenizedDataset, tokenize_dataset
    from ._tokenizer import TextTokenizer, TokenizerIdentity
    from ._trace import TracedRow, WindowDocument, read_traced_rows, trace_batches
    from ._training_data import TrainingData

# The module each public name is defined in; tests/test_startup.py checks it against __all__
# and the imports above.
_EXPORTS: dict[str, tuple[str, ...]] = {
    "_chat": ("ChatEncoder", "ChatEncoding", "ChatTemplate", "ROLE_IDS", "RenderedChat"),
    "_checkpoint_files": (
        "checkpoint_from_text",
        "read_checkpoint",
        "restore_run_checkpoint",
        "save_run_files",
        "stale_run_files",
        "write_checkpoint",
    ),
    "_rank_stream": ("RankStream",),
    "_config": (
        "BatchStreamConfig",
        "DTYPES",
        "DType",
        "ENCODINGS",
        "Encoding",
        "FileSource",
        "ManifestSource",
        "Packing",
        "ProjectedField",
        "Ramp",
        "Shuffle",
        "Stage",
        "TokenWindows",
    ),
    "_core": (
        "Checkpoint",
        "Drain",
        "Position",
        "RUN_STATE_FORMAT",
        "RUN_STATE_VERSION",
        "RunIndex",
        "RunState",
        "Segment",
        "__version__",
    ),
    "_errors": (
        "AccessDeniedError",
        "CheckpointError",
        "ConfigError",
        "DataError",
        "MalformedShardError",
        "O41Error",
        "ObjectConflictError",
        "ObjectNotFoundError",
        "ProjectionError",
        "StorageError",
        "StreamClosedError",
        "UnsupportedFormatError",
    ),
    "_iter_shard": ("iter_shard",),
    "_limits": ("LIMITS",),
    "_manifest": (
        "Curriculum",
        "DataManifest",
        "ManifestShard",
        "ManifestSplit",
        "load_manifest",
        "save_manifest",
    ),
    "_manifest_build": ("manifest_from_files",),
    "_rules": (
        "DeliveredField",
        "PROCESS_FILE",
        "RANK_FILE",
        "StageBatches",
        "StreamRules",
        "SwitchPoint",
        "check_adapter_options",
        "check_same_place",
        "check_same_stream",
        "check_stream_of",
        "find_rank_files",
        "move_to_world",
        "observed_ranks",
        "parse_rank_file_name",
        "process_ranks",
        "rank_file_name",
        "rank_files_among",
        "resume_point",
        "switch_point",
        "with_ranks",
        "write_rank_file",
    ),
    "_saver": ("DatasetSaver", "SavedShard"),
    "_stats": ("DecodeStats", "MixShare", "RETRY_CAUSES", "ReadStats", "SourceStats", "StageDelivered"),
    "_stats_log": ("log_stats_every",),
    "_storage": ("CredentialProvider", "RetryPolicy", "StorageConfig", "TemporaryCredentials"),
    "_stream": (
        "Batch",
        "BatchStream",
        "MemoryBound",
        "StreamStats",
        "TokenStats",
        "open_batch_stream",
        "resolve_batch_stream_config",
        "resume_batch_stream",
    ),
    "_plan": ("ReadPlan", "plan_reads"),
    "_tokenize": ("TokenizedDataset", "tokenize_dataset"),
    "_tokenizer": ("TextTokenizer", "TokenizerIdentity"),
    "_trace": ("TracedRow", "WindowDocument", "read_traced_rows", "trace_batches"),
    "_training_data": ("TrainingData",),
}
_MODULE_OF = {name: module for module, names in _EXPORTS.items() for name in names}

__all__ = [
    "DTYPES",
    "ENCODINGS",
    "LIMITS",
    "PROCESS_FILE",
    "RANK_FILE",
    "RETRY_CAUSES",
    "ROLE_IDS",
    "RUN_STATE_FORMAT",
    "RUN_STATE_VERSION",
    "AccessDeniedError",
    "Batch",
    "BatchStream",
    "BatchStreamConfig",
    "ChatEncoder",
    "ChatEncoding",
    "ChatTemplate",
    "Checkpoint",
    "CheckpointError",
    "ConfigError",
    "CredentialProvider",
    "Curriculum",
    "DType",
    "DataError",
    "DataManifest",
    "DatasetSaver",
    "DecodeStats",
    "DeliveredField",
    "Drain",
    "Encoding",
    "FileSource",
    "MalformedShardError",
    "ManifestShard",
    "ManifestSource",
    "ManifestSplit",
    "MemoryBound",
    "MixShare",
    "O41Error",
    "ObjectConflictError",
    "ObjectNotFoundError",
    "Packing",
    "Position",
    "ProjectedField",
    "ProjectionError",
    "Ramp",
    "RankStream",
    "ReadPlan",
    "ReadStats",
    "RenderedChat",
    "RetryPolicy",
    "RunIndex",
    "RunState",
    "SavedShard",
    "Segment",
    "Shuffle",
    "SourceStats",
    "Stage",
    "StageBatches",
    "StageDelivered",
    "StorageConfig",
    "StorageError",
    "StreamClosedError",
    "StreamRules",
    "StreamStats",
    "SwitchPoint",
    "TemporaryCredentials",
    "TextTokenizer",
    "TokenStats",
    "TokenWindows",
    "TokenizedDataset",
    "TokenizerIdentity",
    "TracedRow",
    "TrainingData",
    "UnsupportedFormatError",
    "WindowDocument",
    "__version__",
    "check_adapter_options",
    "check_same_place",
    "check_same_stream",
    "check_stream_of",
    "checkpoint_from_text",
    "find_rank_files",
    "iter_shard",
    "load_manifest",
    "log_stats_every",
    "manifest_from_files",
    "move_to_world",
    "observed_ranks",
    "open_batch_stream",
    "parse_rank_file_name",
    "plan_reads",
    "process_ranks",
    "rank_file_name",
    "rank_files_among",
    "read_checkpoint",
    "read_traced_rows",
    "resolve_batch_stream_config",
    "restore_run_checkpoint",
    "resume_batch_stream",
    "resume_point",
    "save_manifest",
    "save_run_files",
    "stale_run_files",
    "switch_point",
    "tokenize_dataset",
    "trace_batches",
    "with_ranks",
    "write_checkpoint",
    "write_rank_file",
]


# Hidden from type checkers, which would otherwise take any name to exist (as Any), typos too.
if not TYPE_CHECKING:

    def __getattr__(name: str) -> Any:
        module = _MODULE_OF.get(name)
        if module is None:
            raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(f".{module}", __name__), name)
        globals()[name] = value  # later lookups find it without this function
        return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
