"""The exception hierarchy of o41_training_data.

Every error the package raises is an :class:`O41Error`. Subclasses also derive from the
built-in exception users would naturally catch (``ValueError`` for bad configs and data,
``OSError``/``FileNotFoundError`` for storage), so existing ``except`` clauses keep working.

Each instance carries the thing at fault as attributes, ``None`` where they do not apply:
``option`` (config path such as ``stages[0].batch_size``), ``path`` (shard location),
``row`` (record index within the shard) and ``field`` (projected field name).
"""

from __future__ import annotations

__all__ = [
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
]


class O41Error(Exception):
    """Base class of every error raised by o41_training_data.

    Examples:
        >>> try:
        ...     raise ConfigError("invalid threads: must be at least 1")
        ... except O41Error as err:
        ...     print(type(err).__name__)
        ConfigError

    """

    option: str | None = None
    path: str | None = None
    row: int | None = None
    field: str | None = None


class ConfigError(O41Error, ValueError):
    """A configuration value is invalid; ``option`` names it (``fields[1].dtype``)."""


def invalid(option: str, message: str) -> ConfigError:
    """A :class:`ConfigError` about ``option``: its message starts ``invalid <option>:``."""
    error = ConfigError(f"invalid {option}: {message}")
    error.option = option
    return error


class DataError(O41Error, ValueError):
    """A shard's content cannot be delivered as configured; ``path`` and ``row`` locate it."""


class MalformedShardError(DataError):
    """A shard cannot be decoded as its encoding (corrupt file, truncated frame, bad JSON)."""


class UnsupportedFormatError(DataError):
    """A shard is well formed but uses a feature this build cannot read.

    For example a Parquet column compressed with LZO; the message names the file, the column
    and the feature. Rewriting the shard with a supported codec fixes it; retrying does not.
    """


class ProjectionError(DataError):
    """A record's value does not fit its projected field (wrong type, too deep, null, missing)."""


class StorageError(O41Error, OSError):
    """Reading or writing an object failed; ``path`` names the object."""


class ObjectNotFoundError(StorageError, FileNotFoundError):
    """A shard or other object does not exist."""


class AccessDeniedError(StorageError, PermissionError):
    """The storage service refused the credentials or the permission for an object."""


class ObjectConflictError(StorageError, FileExistsError):
    """A create-only write found a different object at its location; nothing was replaced."""


class CheckpointError(O41Error, ValueError):
    """A checkpoint cannot be used.

    It is corrupt JSON, of another version, altered, another rank's, or its shards changed
    since it was taken.
    """


class StreamClosedError(O41Error, RuntimeError):
    """A batch stream was used after ``close()``."""
