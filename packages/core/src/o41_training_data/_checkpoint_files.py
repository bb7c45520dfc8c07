"""Checkpoint files on local disk (``o41 checkpoint show`` and ``reshard``).

Reading one names the file in every error; resharding writes a run's checkpoints for another
world size.

Resharding uses the engine's position API only: positions are global (the batch sequence does
not depend on the world size), so :meth:`Checkpoint.for_world` moves one to any rank of any
world size, and the new ranks continue the same sequence partitioned over their number.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

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
from ._stream import Checkpoint

__all__ = ["MAX_RESHARD_FILES", "read_checkpoint", "reshard"]


def _located(path: Path, message: str) -> CheckpointError:
    error = CheckpointError(f"{path}: {message}")
    error.path = str(path)
    return error


def read_checkpoint(path: Path) -> Checkpoint:
    """The checkpoint in the file ``path``; :class:`CheckpointError` naming the file otherwise."""
    path = as_path(path)
    text = read_text(path, CheckpointError, "checkpoint")  # bounded, regular files only
    # No depth scan here: only the engine parses it, and serde_json refuses nesting past 128
    # levels itself (a Python scan of a million-shard document costs seconds).
    try:
        return Checkpoint.from_json(text)
    except CheckpointError as error:
        raise _located(path, str(error)) from None


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
        write_rank_file(target, first.for_world(r, world_size).to_json(), overwrite=overwrite)
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
