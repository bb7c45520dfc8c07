"""Checkpoint files on local disk (``o41 checkpoint show`` and ``reshard``).

Reading one names the file in every error; resharding writes a run's checkpoints for another
world size.

Resharding uses the engine's position API only: positions are global (the batch sequence does
not depend on the world size), so :meth:`Checkpoint.for_world` moves one to any rank of any
world size, and the new ranks continue the same sequence partitioned over their number.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from collections.abc import Sequence
from pathlib import Path

from ._errors import CheckpointError
from ._stream import Checkpoint

__all__ = ["read_checkpoint", "reshard", "write_atomically"]


def _located(path: Path, message: str) -> CheckpointError:
    error = CheckpointError(f"{path}: {message}")
    error.path = str(path)
    return error


def read_checkpoint(path: Path) -> Checkpoint:
    """The checkpoint in the file ``path``; :class:`CheckpointError` naming the file otherwise."""
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError:
        raise _located(path, "not a checkpoint (not UTF-8 text)") from None
    try:
        return Checkpoint.from_json(text)
    except CheckpointError as error:
        raise _located(path, str(error)) from None


def write_atomically(path: Path, text: str, *, overwrite: bool) -> None:
    """Writes ``text`` to ``path`` all or nothing: a reader sees the old file or the new one.

    The text goes to a temporary file in the same directory, is flushed to disk, and is then
    renamed over ``path`` (``overwrite``) or linked to it, which fails with
    :class:`FileExistsError` when ``path`` exists.
    """
    descriptor, temporary = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(descriptor, "w", encoding="utf-8") as file:
            file.write(text)
            file.flush()
            os.fsync(file.fileno())
        if overwrite:
            os.replace(temporary, path)
        else:
            os.link(temporary, path)
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(temporary)
    directory = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(directory)
    finally:
        os.close(directory)


def reshard(
    files: Sequence[Path], world_size: int, output_dir: Path, name: str, *, overwrite: bool = False
) -> list[Path]:
    """Writes ``output_dir/name.format(rank=r)`` for every rank ``r`` of ``world_size``.

    ``files`` are checkpoints of one run taken after the same local batch (one rank's is
    enough): they must agree on the stream (fingerprint) and the position (segment and next
    batch), or :class:`CheckpointError` names the file that differs. Nothing is written when a
    target exists and ``overwrite`` is false (:class:`FileExistsError` naming it).
    """
    checkpoints = [read_checkpoint(path) for path in files]
    first, reference = checkpoints[0], files[0]
    for path, other in zip(files[1:], checkpoints[1:], strict=True):
        if other.fingerprint != first.fingerprint:
            raise _located(path, f"belongs to another stream than {reference} (fingerprint differs)")
        if (other.next_batch, other.position.segment) != (first.next_batch, first.position.segment):
            raise _located(
                path,
                f"is at global batch {other.next_batch}, {reference} at {first.next_batch}: checkpoints "
                "to reshard must be taken after the same local batch on every rank",
            )
    targets = [output_dir / name.format(rank=rank) for rank in range(world_size)]
    if not overwrite:
        taken = [target for target in targets if target.exists()]
        if taken:
            raise FileExistsError(f"{taken[0]} exists; pass --overwrite to replace it")
    output_dir.mkdir(parents=True, exist_ok=True)
    for rank, target in enumerate(targets):
        write_atomically(target, first.for_world(rank, world_size).to_json(), overwrite=overwrite)
    return targets
