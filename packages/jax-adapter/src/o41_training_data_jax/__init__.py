"""o41-training-data JAX adapter: globally sharded ``jax.Array`` batches for multi-host meshes.

:class:`O41JaxIterator` reads each process's rows of every global batch and assembles global
``jax.Array``s with ``jax.make_array_from_process_local_data``, prefetching them to the devices
on a background thread. Its state is the core's checkpoint JSON, which grain's Orbax handler
takes unchanged.

Example:
    >>> from jax.sharding import NamedSharding, PartitionSpec
    >>> from o41_training_data_jax import O41JaxIterator
    >>> mesh = jax.make_mesh((jax.device_count(),), ("data",))  # doctest: +SKIP
    >>> batches = O41JaxIterator(config, NamedSharding(mesh, PartitionSpec("data")))  # doctest: +SKIP

"""

from __future__ import annotations

from o41_training_data import __version__ as core_version

from ._iterator import DEFAULT_PREFETCH, O41JaxIterator

__all__ = ["DEFAULT_PREFETCH", "O41JaxIterator", "core_version"]
