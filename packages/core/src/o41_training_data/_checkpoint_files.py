"""Checkpoint files on local disk (``o41 checkpoint show`` and ``reshard``).

Reading one names the file in every error; resharding writes a run's checkpoints for another
world size.

Resharding uses the engine's position API only: positions are global (the batch sequence does
not depend on the world size), so :meth:`Checkpoint.for_world` moves one to any rank of any
world size, and the new ranks continue the same sequence partitioned over their number.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Callable, Sequence
from pathlib import Path

from . import _core
from ._core import Checkpoint
from ._errors import CheckpointError, ConfigError
from ._files import as_path, read_text
from ._rules import (
    RANK_FILE,
    check_same_place,
    check_world,
    parse_rank_file_name,
    rank_files_among,
    write_rank_file,
)

__all__ = ["MAX_RESHARD_FILES", "checkpoint_from_text", "read_checkpoint", "reshard", "write_checkpoint"]


def _located(path: Path, message: str) -> CheckpointError:
    error = CheckpointError(f"{path}: {message}")
    error.path = str(path)
    return error


def read_checkpoint(path: str | os.PathLike[str]) -> Checkpoint:
    """The checkpoint in the file ``path``, in either form (docs/checkpoint.md).

    A self-contained checkpoint (version 1) is read alone; a rank file of the split form
    (version 2) with the resolved document it names, ``resolved-<fingerprint>.json`` in the same
    directory. :class:`CheckpointError` names the file at fault.

    Examples:
        >>> checkpoint = read_checkpoint("checkpoints/stream-rank0-of-8.json")  # doctest: +SKIP

    """
    path = as_path(path)
    text = read_text(path, CheckpointError, "checkpoint")  # bounded, regular files only
    # No depth scan here: only the engine parses it, and serde_json refuses nesting past 128
    # levels itself (a Python scan of a million-shard document costs seconds).

    def beside(name: str) -> str:
        shared = path.parent / name
        if not shared.exists():
            raise CheckpointError(f"it names its resolved document {name}, which is not beside it ({shared})")
        return read_text(shared, CheckpointError, "resolved document")

    try:
        return checkpoint_from_text(text, beside)
    except CheckpointError as error:
        raise _located(path, str(error)) from None


def checkpoint_from_text(text: str, shared: Callable[[str], str]) -> Checkpoint:
    """The checkpoint a file's ``text`` holds, in either form, wherever the file is.

    A self-contained checkpoint (version 1) is parsed alone; for a rank file of the split form
    (version 2), ``shared(name)`` returns the text of the resolved document it names (the file
    ``name`` beside it, on whatever file system holds it). The name is checked first: one plain
    file name, ``resolved-<fingerprint>.json``. Adapters that store checkpoints on other file
    systems read them through this.

    Examples:
        >>> checkpoint = checkpoint_from_text(text, lambda n: (folder / n).read_text())  # doctest: +SKIP

    """
    name = _core.split_reference(text)
    if name is None:
        return Checkpoint.from_json(text)
    return Checkpoint.from_split(text, shared(name))


def write_checkpoint(
    checkpoint: Checkpoint, path: str | os.PathLike[str], *, split: bool = True, overwrite: bool = True
) -> Path:
    """Writes ``checkpoint`` to the file ``path``, each file whole or not at all; returns ``path``.

    The split form (default, version 2): ``path`` holds the rank's position and counters (a few
    hundred bytes at any corpus size), and the run's resolved document goes once beside it, as
    ``resolved-<fingerprint>.json``, written by whichever rank gets there first (its name is the
    stream's fingerprint, so every rank writes the same bytes). A file of that name already
    there is checked, byte for byte, and replaced when it holds anything else (a foreign or
    damaged file would otherwise be trusted until a resume failed on it). With ``split=False``,
    the self-contained form (version 1), as ``checkpoint.to_json()``.
    :func:`read_checkpoint` reads both.

    Examples:
        >>> write_checkpoint(stream.checkpoint(), f"ckpt/{rank_file_name(rank, world)}")  # doctest: +SKIP

    """
    path = as_path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    if not split:
        write_rank_file(path, checkpoint.to_json(), overwrite=overwrite)
        return path
    rank_json, shared_name = checkpoint.to_split()
    shared = path.parent / shared_name
    document = checkpoint.shared_json()
    if not _holds(shared, document):
        # Every rank writes the same bytes, each file whole: replacing another rank's copy (or a
        # foreign file of the name) at any moment leaves the right document there.
        write_rank_file(shared, document, overwrite=True)
    write_rank_file(path, rank_json, overwrite=overwrite)
    return path


def _holds(path: Path, text: str) -> bool:
    """Whether the file ``path`` holds exactly ``text``, read no further than its length.

    It is never opened unless it is a regular file: a FIFO would block the open.
    """
    expected = text.encode()
    try:
        status = path.lstat()
    except FileNotFoundError:
        return False
    if not stat.S_ISREG(status.st_mode):
        raise CheckpointError(f"{path}: not a regular file; a checkpoint's resolved document goes there")
    if status.st_size != len(expected):
        return False
    with path.open("rb") as file:
        return file.read(len(expected) + 1) == expected


MAX_RESHARD_FILES = 4096
"""Most files one ``reshard`` writes: a larger world writes one rank's file at a time (``rank=``)."""


def reshard(
    files: Sequence[Path],
    world_size: int,
    output_dir: Path,
    name: str = RANK_FILE,
    *,
    overwrite: bool = False,
    rank: int | None = None,
) -> list[Path]:
    """Writes ``output_dir/name.format(rank=r, world_size=world_size)`` for each rank ``r`` (or ``rank``).

    ``name`` defaults to the one per-rank file name, ``stream-rank{rank}-of-{world_size}.json``
    (docs/rules.md). ``files`` are checkpoints of one run taken after the same local batch (one
    rank's is enough, whatever its name): they must agree on the stream (fingerprint) and the
    position (segment and next batch), or :class:`CheckpointError` names the files that differ
    (the one rule of :func:`check_same_place`). Nothing is written when a target exists and
    ``overwrite`` is false (:class:`FileExistsError` naming it), nor when ``output_dir`` holds
    another file for a target's rank under another per-rank name (``process_0-of-2.json`` beside
    ``stream-rank0-of-2.json``: :class:`CheckpointError` naming both). A world of more than
    :data:`MAX_RESHARD_FILES` ranks is written one rank at a time, with ``rank``.
    """
    if rank is None:
        _, world_size = check_world(0, world_size)
        if world_size > MAX_RESHARD_FILES:
            raise ConfigError(
                f"invalid world_size: {world_size} ranks would write {world_size} files, more than the "
                f"{MAX_RESHARD_FILES} one reshard writes; write each rank's file with --rank"
            )
        ranks = range(world_size)
    else:
        rank, world_size = check_world(rank, world_size)
        ranks = range(rank, rank + 1)
    stops = {str(path): read_checkpoint(path) for path in files}
    check_same_place(stops, world_size=world_size)
    first = next(iter(stops.values()))
    targets = {r: output_dir / name.format(rank=r, world_size=world_size) for r in ranks}
    _check_one_name_per_rank(output_dir, targets, world_size)
    if not overwrite:
        taken = [target for target in targets.values() if target.exists()]
        if taken:
            raise FileExistsError(f"{taken[0]} exists; pass --overwrite to replace it")
    output_dir.mkdir(parents=True, exist_ok=True)
    for r, target in targets.items():
        write_checkpoint(first.for_world(r, world_size), target, overwrite=overwrite)
    return list(targets.values())


def _check_one_name_per_rank(output_dir: Path, targets: dict[int, Path], world_size: int) -> None:
    """Refuses targets that would sit beside another file of their rank under another name."""
    if not output_dir.is_dir() or not any(parse_rank_file_name(t.name) for t in targets.values()):
        return
    existing = rank_files_among((entry.name for entry in output_dir.iterdir()), output_dir)
    for r, target in targets.items():
        other = existing.get((r, world_size))
        if other is not None and other != target.name and parse_rank_file_name(target.name) is not None:
            raise CheckpointError(
                f"checkpoint refused: {output_dir} holds {other} for rank {r} of {world_size}; "
                f"writing {target.name} beside it would leave two files for one rank"
            )
