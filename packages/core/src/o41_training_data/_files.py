"""Reading the small documents the Python side reads itself (configs, checkpoints), bounded.

A path given by a user or found on disk may name a FIFO (an open would block until a writer
appears), a device (``/dev/zero`` never ends), a directory, or a file far larger than any
config. Each is refused before it is read: the file is opened without blocking, must be a
regular file, and is read up to a size limit; its text must be UTF-8, and a JSON document deeper
than a nesting limit is refused before Python's parser recurses. Every refusal is an error of
the package's hierarchy naming the file.
"""

from __future__ import annotations

import errno
import os
import secrets
import stat
from pathlib import Path

from ._errors import O41Error, ObjectNotFoundError, StorageError, invalid

__all__ = ["MAX_DOCUMENT_BYTES", "MAX_DOCUMENT_DEPTH", "check_depth", "json_depth", "read_bytes", "read_text"]

MAX_DOCUMENT_BYTES = 256 << 20
"""Largest config or checkpoint file read (a checkpoint pins every shard of its stream: a
million-shard document is about 150 MiB)."""

MAX_DOCUMENT_DEPTH = 64
"""Deepest nesting of lists and mappings a config or checkpoint document may have (the deepest
legitimate one is under 10)."""


def _located(error_class: type[O41Error], path: Path, message: str) -> O41Error:
    error = error_class(f"{path}: {message}")
    error.path = str(path)
    return error


def as_path(path: object) -> Path:
    """``path`` (a string or path-like) as a :class:`Path`.

    Anything else, bytes or a NUL character is a :class:`ConfigError` naming ``path``.
    """
    if not isinstance(path, (str, os.PathLike)):
        raise invalid("path", f"expected a path, got {type(path).__name__}")
    name = os.fspath(path)
    if not isinstance(name, str) or "\0" in name:
        raise invalid("path", f"{name!r} is not a path (bytes, or a NUL character)")
    return Path(name)


def read_bytes(path: Path, error_class: type[O41Error], what: str, limit: int) -> bytes:
    """The bytes of the regular file ``path``, at most ``limit``, refused with ``error_class`` otherwise.

    ``what`` names the file in errors (``config file``, ``CA bundle``). A missing file raises
    :class:`ObjectNotFoundError`.
    """
    try:
        descriptor = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except FileNotFoundError:
        raise _located(ObjectNotFoundError, path, f"no such {what}") from None
    except IsADirectoryError:
        raise _located(error_class, path, f"is a directory, not a {what}") from None
    except OSError as error:
        if error.errno == errno.ELOOP:
            raise _located(StorageError, path, "a loop of symbolic links, not a file") from None
        raise _located(error_class, path, f"cannot open the {what}: {error.strerror}") from None
    try:
        status = os.fstat(descriptor)
        if not stat.S_ISREG(status.st_mode):
            kind = "a directory" if stat.S_ISDIR(status.st_mode) else "not a regular file"
            raise _located(error_class, path, f"is {kind} (a {what} must be a regular file)")
        if status.st_size > limit:
            raise _located(
                error_class, path, f"is {status.st_size} bytes, more than a {what} may be ({limit})"
            )
        chunks = []
        size = 0
        while True:
            chunk = os.read(descriptor, min(1 << 20, limit + 1 - size))
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
            if size > limit:  # grew while being read
                raise _located(error_class, path, f"is more than a {what} may be ({limit} bytes)")
    except OSError as error:
        raise _located(error_class, path, f"cannot read the {what}: {error.strerror}") from None
    finally:
        os.close(descriptor)
    return b"".join(chunks)


def read_text(path: Path, error_class: type[O41Error], what: str, limit: int = MAX_DOCUMENT_BYTES) -> str:
    """The UTF-8 text of the regular file ``path``, refused with ``error_class`` otherwise.

    ``what`` names the document in errors (``config file``, ``checkpoint``). A missing file raises
    :class:`ObjectNotFoundError`.
    """
    data = read_bytes(path, error_class, what, limit)
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as error:
        raise _located(
            error_class, path, f"is not UTF-8 text (byte {error.start}), so not a {what}"
        ) from None


def json_depth(text: str) -> int:
    """How deep ``[``/``{`` nest in ``text`` outside strings (0 for a scalar), without parsing.

    Safe on any input, so that no parser recurses on a forged document first; for text that is
    not JSON it is a bound the parser then refines with its own error.
    """
    depth = deepest = 0
    in_string = escaped = False
    for char in text:
        if in_string:
            if escaped:
                escaped = False
            elif char == "\\":
                escaped = True
            elif char == '"':
                in_string = False
        elif char == '"':
            in_string = True
        elif char in "[{":
            depth += 1
            deepest = max(deepest, depth)
        elif char in "]}":
            depth -= 1
    return deepest


def check_depth(text: str, path: Path, error_class: type[O41Error], limit: int = MAX_DOCUMENT_DEPTH) -> None:
    """Refuses a JSON (or flow-style YAML) text nesting brackets deeper than ``limit``."""
    if json_depth(text) > limit:
        message = f"nests deeper than {limit} levels, so it is not a valid document"
        raise _located(error_class, path, message)


def create_beside(path: Path, prefix: str | None = None) -> tuple[int, Path]:
    """A new, empty temporary file beside ``path``, open for writing, and its name.

    Named ``.<name>.<random>.tmp``, or ``<prefix><random>``. Created with mode ``0o666`` as
    ``open()`` creates files, so the umask (and a directory's default ACL) decide its
    permissions; ``tempfile.mkstemp`` would make it ``0o600``, and the rename or link that
    publishes it would keep that.
    """
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0) | getattr(os, "O_BINARY", 0)
    while True:
        random = secrets.token_hex(8)
        name = f".{path.name}.{random}.tmp" if prefix is None else f"{prefix}{random}"
        temporary = path.parent / name
        try:
            return os.open(temporary, flags, 0o666), temporary
        except FileExistsError:  # another writer's name: draw another
            continue
