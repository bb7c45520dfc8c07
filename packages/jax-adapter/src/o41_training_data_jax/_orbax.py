"""The Orbax checkpoint handler: one state file per process beside the model state.

``ocp.args.Composite(state=..., data=O41Save(iterator))`` saves the iterator's state, the core's
checkpoint, as ``process_<i>-of-<n>.json`` in the item's directory (the names grain's handler
uses, so either handler reads the other's files). ``O41Restore(iterator)`` restores the state of
this process's rank, moved onto another number of processes when the checkpoint was taken by
another. Which files make a save, and when a move is exact, are the core's rules
(:func:`o41_training_data.restore_run_checkpoint`); this module is Orbax's glue.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax

# orbax-checkpoint ships no type information (no py.typed); its names are Any here.
import orbax.checkpoint as ocp  # type: ignore[import-untyped]
from o41_training_data import (
    PROCESS_FILE,
    Checkpoint,
    rank_file_name,
    restore_run_checkpoint,
    save_run_files,
)

from ._iterator import O41JaxIterator

__all__ = ["STATE_FILE", "O41CheckpointHandler", "O41Restore", "O41Save"]

STATE_FILE = PROCESS_FILE
"""Name of a process's state file: ``index``/``count`` are ``jax.process_index()``/``process_count()``."""


def checkpoint_for(directory: Any, rank: int, world_size: int) -> Checkpoint:
    """The checkpoint rank ``rank`` of ``world_size`` resumes from, out of ``directory``'s files."""
    return restore_run_checkpoint(
        [entry.name for entry in directory.iterdir()],
        lambda name: (directory / name).read_text(),
        rank,
        world_size,
        place=str(directory),
        own=(jax.process_index(), jax.process_count()),
    )


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
        name = rank_file_name(jax.process_index(), jax.process_count(), naming="process")
        save_run_files(
            {name: args.item.checkpoint()},
            lambda file, text: (directory / file).write_text(text),
            # Every process writes the same document: one copy there is enough.
            holds=lambda file, _: (directory / file).exists(),
        )

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
