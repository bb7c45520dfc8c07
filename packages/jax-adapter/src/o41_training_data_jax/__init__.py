"""o41-training-data JAX adapter: globally sharded ``jax.Array`` batches for multi-host meshes.

:class:`O41JaxIterator` reads each process's rows of every global batch and assembles global
``jax.Array``s with ``jax.make_array_from_process_local_data``, prefetching them to the devices
on a background thread. Its state is the core's checkpoint JSON: it fits grain's Orbax handler
unchanged, and :class:`O41Save`/:class:`O41Restore` (the ``orbax`` extra) save one file per
process beside the model state and restore onto another number of processes. See docs/jax.md.

Examples:
    >>> from jax.sharding import NamedSharding, PartitionSpec
    >>> from o41_training_data_jax import O41JaxIterator
    >>> mesh = jax.make_mesh((jax.device_count(),), ("data",))  # doctest: +SKIP
    >>> batches = O41JaxIterator(config, NamedSharding(mesh, PartitionSpec("data")))  # doctest: +SKIP

"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from o41_training_data import __version__ as core_version

from ._iterator import DEFAULT_PREFETCH, O41JaxIterator

if TYPE_CHECKING:
    from ._orbax import STATE_FILE, O41CheckpointHandler, O41Restore, O41Save

__all__ = [
    "DEFAULT_PREFETCH",
    "STATE_FILE",
    "O41CheckpointHandler",
    "O41JaxIterator",
    "O41Restore",
    "O41Save",
    "core_version",
]

_ORBAX_NAMES = frozenset({"STATE_FILE", "O41CheckpointHandler", "O41Restore", "O41Save"})


def __getattr__(name: str) -> Any:
    # The Orbax handler needs orbax-checkpoint, an optional extra: import it only when asked for.
    if name in _ORBAX_NAMES:
        try:
            from . import _orbax
        except ImportError as error:
            if error.name is None or not error.name.startswith("orbax"):
                raise
            raise ImportError(
                f"o41_training_data_jax.{name} needs orbax-checkpoint: "
                "pip install 'o41-training-data-jax[orbax]'",
                name=error.name,
            ) from error
        return getattr(_orbax, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
