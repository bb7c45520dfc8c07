"""The Orbax checkpoint handler: one state file per process beside the model state.

``ocp.args.Composite(state=..., data=O41Save(iterator))`` saves the iterator's state, the
core's checkpoint JSON, as ``process_<i>-of-<n>.json`` in the item's directory (the names grain's
handler uses, so either handler reads the other's files). ``O41Restore(iterator)`` restores the
state of this process's rank; when the checkpoint was taken by another number of processes it
moves the position with the core's elastic resume (``Checkpoint.for_world``), after checking
that every old process stopped at the same global batch, which is what makes the move exact.
"""

from __future__ import annotations

import dataclasses
import re
from typing import Any

import jax

# orbax-checkpoint ships no type information (no py.typed); its names are Any here.
import orbax.checkpoint as ocp  # type: ignore[import-untyped]
from o41_training_data import (
    Checkpoint,
    CheckpointError,
    check_same_stream,
    checkpoint_from_text,
    move_to_world,
)

from ._iterator import O41JaxIterator

__all__ = ["STATE_FILE", "O41CheckpointHandler", "O41Restore", "O41Save"]

STATE_FILE = "process_{index}-of-{count}.json"
"""Name of a process's state file: ``index``/``count`` are ``jax.process_index()``/``process_count()``."""

_STATE_NAME = re.compile(r"process_(\d+)-of-(\d+)\.json")


def _read_states(directory: Any) -> dict[tuple[int, int], Checkpoint]:
    """Every process's checkpoint in ``directory``, keyed by ``(index, count)`` of its file."""
    states: dict[tuple[int, int], Checkpoint] = {}
    for path in directory.iterdir():
        match = _STATE_NAME.fullmatch(path.name)
        if match is None:
            continue
        try:
            text = path.read_text()
            states[int(match[1]), int(match[2])] = checkpoint_from_text(
                text, lambda n: (directory / n).read_text()
            )
        except CheckpointError as error:
            raise CheckpointError(f"{path}: {error}") from None
    return states


def checkpoint_for(directory: Any, rank: int, world_size: int) -> Checkpoint:
    """The checkpoint rank ``rank`` of ``world_size`` resumes from, out of ``directory``'s files.

    The one of the same rank and world size when there is one (this process's own file first),
    else the old world's position moved to this one (:func:`o41_training_data.move_to_world`),
    which is refused unless every old process's file is there and all stopped at the same place:
    the same curriculum segment and the same global batch.
    """
    states = _read_states(directory)
    if not states:
        raise CheckpointError(f"checkpoint refused: no process_<i>-of-<n>.json state file in {directory}")
    counts = sorted({count for _, count in states})
    if len(counts) > 1:
        raise CheckpointError(
            f"checkpoint refused: {directory} mixes state files of {', '.join(map(str, counts))} processes"
        )
    count = counts[0]
    missing = [STATE_FILE.format(index=i, count=count) for i in range(count) if (i, count) not in states]
    if missing:
        raise CheckpointError(f"checkpoint refused: {directory} lacks {', '.join(missing)}")
    check_same_stream(_named(states))
    own = states.get((jax.process_index(), jax.process_count()))
    candidates = [own] if own is not None else []
    candidates += [states[key] for key in sorted(states)]
    for state in candidates:
        if (state.rank, state.world_size) == (rank, world_size):
            return state
    # The core's one rule: same stream, same segment, same next global batch, then move.
    return move_to_world(_named(states), rank, world_size)


def _named(states: dict[tuple[int, int], Checkpoint]) -> dict[str, Checkpoint]:
    return {STATE_FILE.format(index=i, count=n): state for (i, n), state in sorted(states.items())}


# Orbax's base classes are untyped (Any), which strict mypy refuses to subclass unless told.
class O41CheckpointHandler(ocp.CheckpointHandler):  # type: ignore[misc]
    """Saves each process's :class:`O41JaxIterator` state beside the model state, and restores it.

    Use it through :class:`O41Save` and :class:`O41Restore` in an ``ocp.args.Composite``; Orbax
    finds the handler from the argument type.
    """

    def save(self, directory: Any, args: O41Save) -> None:
        """Writes this process's state file; the state is read now, at the step being saved.

        In the split form (docs/checkpoint.md): each process's file holds its position, and the
        stream's resolved document is written once into the step's directory, by whichever
        process gets there first.
        """
        name = STATE_FILE.format(index=jax.process_index(), count=jax.process_count())
        checkpoint = args.item.checkpoint()
        rank_json, shared_name = checkpoint.to_split()
        shared = directory / shared_name
        if not shared.exists():
            # Every process writes the same bytes under this name: a race leaves one of them.
            shared.write_text(checkpoint.shared_json())
        (directory / name).write_text(rank_json)

    def restore(self, directory: Any, args: O41Restore) -> O41JaxIterator:
        """Sets the iterator to the saved position of its rank (moved, on another world size)."""
        iterator = args.item
        checkpoint = checkpoint_for(directory, iterator.rank, iterator.world_size)
        iterator.set_state(checkpoint.to_json().encode())
        iterator.start_prefetch()
        return iterator

    def metadata(self, directory: Any) -> None:
        """No metadata: the state files are the whole item."""
        return None


# Registering the argument types lets Orbax find the handler in a Composite from them alone.
@ocp.args.register_with_handler(O41CheckpointHandler, for_save=True)
@dataclasses.dataclass
class O41Save(ocp.args.CheckpointArgs):  # type: ignore[misc]
    """Saves ``item``'s position in an ``ocp.args.Composite``.

    Examples:
        >>> manager.save(step, args=ocp.args.Composite(state=..., data=O41Save(iterator)))  # doctest: +SKIP

    """

    item: O41JaxIterator


@ocp.args.register_with_handler(O41CheckpointHandler, for_restore=True)
@dataclasses.dataclass
class O41Restore(ocp.args.CheckpointArgs):  # type: ignore[misc]
    """Restores ``item`` (an iterator over the same stream) to the saved position.

    Examples:
        >>> args = ocp.args.Composite(state=..., data=O41Restore(iterator))  # doctest: +SKIP
        >>> restored = manager.restore(step, args=args)  # doctest: +SKIP

    """

    item: O41JaxIterator
