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
from collections.abc import Callable, Iterable, Mapping, Sequence
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

__all__ = [
    "MAX_RESHARD_FILES",
    "checkpoint_from_text",
    "read_checkpoint",
    "reshard",
    "restore_run_checkpoint",
    "save_run_files",
    "stale_run_files",
    "write_checkpoint",
]


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

    def write(name: str, text: str) -> None:
        # The resolved document: every rank writes the same bytes, each file whole, so replacing
        # another rank's copy (or a foreign file of the name) at any moment leaves the right one.
        write_rank_file(path.parent / name, text, overwrite=overwrite or name != path.name)

    save_run_files({path.name: checkpoint}, write, holds=lambda name, text: _holds(path.parent / name, text))
    return path


def save_run_files(
    files: Mapping[str, Checkpoint],
    write: Callable[[str, str], None],
    *,
    holds: Callable[[str, str], bool] | None = None,
) -> list[str]:
    """Writes a run's checkpoint files, in the split form, through ``write(name, text)``.

    ``files`` maps each file's name (:func:`rank_file_name`, or the JAX handler's process names)
    to the checkpoint it holds. The resolved document a rank file names
    (``resolved-<fingerprint>.json``) is written first, once per stream, so that no rank file is
    ever there without it; ``holds(name, text)``, when given, says whether a file already holds
    exactly ``text`` (then it is not written again). Returns the names written, in order. Any
    file system drives it: ``write`` is the caller's (atomic where the system allows it).

    Examples:
        >>> write = lambda name, text: (folder / name).write_text(text)  # doctest: +SKIP
        >>> save_run_files({rank_file_name(0, 1): checkpoint}, write)  # doctest: +SKIP

    """
    split = {name: checkpoint.to_split() for name, checkpoint in files.items()}
    written: list[str] = []
    for name, checkpoint in files.items():
        shared_name = split[name][1]
        if shared_name in written:
            continue
        document = checkpoint.shared_json()
        if holds is None or not holds(shared_name, document):
            write(shared_name, document)
        written.append(shared_name)
    for name, (rank_json, _) in split.items():
        write(name, rank_json)
        written.append(name)
    return written


def restore_run_checkpoint(
    names: Iterable[str],
    read: Callable[[str], str | bytes],
    rank: int,
    world_size: int,
    *,
    place: str,
    own: tuple[int, int] | None = None,
    written_by: int | None = None,
) -> Checkpoint:
    """The checkpoint rank ``rank`` of ``world_size`` resumes from, out of one directory's files.

    ``names`` are the directory's entries and ``read(name)`` returns a file's text; ``place``
    names the directory in errors. The rules are the engine's (docs/checkpoint.md, "A run's
    files"): the per-rank files (:func:`parse_rank_file_name`) must be one whole save of one
    world, one file per rank; on that world the rank's own file is read (``own``, this process's
    ``(index, count)`` in the file names, first: a JAX process's file is named by its process
    index), on another every old rank's, moved with :func:`move_to_world`'s rule. ``written_by``
    is the world size an index kept beside the files says wrote them, when there is one (a rank
    file it implies and the directory lacks is then named). Each resolved document is read and
    parsed once. :class:`CheckpointError` names the file at fault; an
    exception ``read`` raises propagates as it is.

    Examples:
        >>> read = lambda name: (folder / name).read_text()  # doctest: +SKIP
        >>> restore_run_checkpoint(os.listdir(folder), read, 0, 4, place=str(folder))  # doctest: +SKIP

    """
    rank, world_size = check_world(rank, world_size)
    return _core.RunFiles(list(names), place).restore(read, rank, world_size, own, written_by)


def stale_run_files(
    names: Iterable[str], world_size: int | None, fingerprint: str | None, *, place: str
) -> list[str]:
    """The names among ``names`` a save of ``world_size`` ranks of stream ``fingerprint`` leaves stale.

    Per-rank files of another world and resolved documents of another stream: a checkpoint name
    saved again by another world (``last.ckpt``) must not keep the old ranks' files. ``None``
    for both: the save wrote no rank file (no rank had started), so every one is stale.
    """
    return _core.RunFiles(list(names), place).stale(world_size, fingerprint)


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
