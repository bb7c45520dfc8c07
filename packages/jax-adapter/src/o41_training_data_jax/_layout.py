"""Where a process's rows go: its block of every global batch under a ``jax.sharding.Sharding``.

The core's order function lays out one global sequence of batches; rank ``r`` of ``W`` receives
its local batch ``k`` as global batch ``k*W + r``. A JAX global batch for step ``k`` is the ``W``
local batches of round ``k`` stacked in rank order, so rank ``r``'s rows must be rows
``[r*B, (r+1)*B)`` of the global array (``B`` the stage's ``batch_size``). This module reads that
block off the sharding: the process's rank is the position of its block along the batch axis
(axis 0), and the world size is the number of distinct blocks. For a mesh built with
``jax.make_mesh`` whose batch axis spans the processes, that is ``jax.process_index()`` and
``jax.process_count()``; processes that hold the same rows (a model axis across hosts) share a
rank and read the same rows, as ``jax.make_array_from_process_local_data`` requires.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import jax
from o41_training_data import ConfigError

__all__ = ["Layout", "process_layout"]


@dataclass(frozen=True)
class Layout:
    """A process's block of the batch axis: ``rank`` of ``world_size`` equal blocks."""

    rank: int
    world_size: int


def _row_blocks(sharding: jax.sharding.Sharding, shape: tuple[int, ...]) -> dict[int, list[tuple[int, int]]]:
    """Rows ``[start, stop)`` of axis 0 that each process's devices hold, merged per process."""
    try:
        indices = sharding.devices_indices_map(shape)
    except (ValueError, TypeError) as error:
        raise ConfigError(f"invalid sharding: it cannot lay out an array of shape {shape}: {error}") from None
    spans: dict[int, set[tuple[int, int]]] = {}
    for device, index in indices.items():
        rows = index[0] if index else slice(None)
        start, stop, _ = rows.indices(shape[0])
        # jaxlib's Device stub omits process_index, which every device has.
        process: int = device.process_index  # type: ignore[attr-defined]
        spans.setdefault(process, set()).add((start, stop))
    merged: dict[int, list[tuple[int, int]]] = {}
    for process, found in spans.items():
        blocks: list[tuple[int, int]] = []
        for start, stop in sorted(found):
            if blocks and start <= blocks[-1][1]:
                blocks[-1] = (blocks[-1][0], max(blocks[-1][1], stop))
            else:
                blocks.append((start, stop))
        merged[process] = blocks
    return merged


def process_layout(sharding: jax.sharding.Sharding, field_shape: Sequence[int] = ()) -> Layout:
    """The calling process's block of the batch axis under ``sharding``.

    ``field_shape`` is a field's shape without the batch axis (a sharding may name more axes
    than a scalar field has). Raises :class:`ConfigError` when a process holds no device of the
    sharding, holds rows that are not one contiguous block, or when the processes' blocks are
    not equal, disjoint and covering: then no assignment of local batches to processes gives
    the order function's global sequence.
    """
    # Any split of axis 0 divides the device count, so this many rows splits evenly.
    rows = len(sharding.device_set)
    blocks = _row_blocks(sharding, (rows, *field_shape))
    me = jax.process_index()
    if me not in blocks:
        raise ConfigError(
            f"invalid sharding: process {me} holds none of its devices; every process that iterates "
            "must hold a block of the batch axis"
        )
    for process, spans in sorted(blocks.items()):
        if len(spans) != 1:
            shown = ", ".join(f"{a}:{b}" for a, b in spans)
            raise ConfigError(
                f"invalid sharding: process {process} holds rows {shown} of the batch axis; each process "
                "must hold one contiguous block (put each process's devices next to each other along "
                "the batch axis of the mesh)"
            )
    distinct = sorted({spans[0] for spans in blocks.values()})
    size = distinct[0][1] - distinct[0][0]
    expected = [(i * size, (i + 1) * size) for i in range(rows // size)] if size and rows % size == 0 else []
    if distinct != expected:
        shown = "; ".join(f"process {p}: rows {s[0][0]}:{s[0][1]}" for p, s in sorted(blocks.items()))
        raise ConfigError(
            f"invalid sharding: the processes' blocks of the batch axis overlap or differ in size "
            f"({shown} of {rows}); every process must hold an equal, disjoint block"
        )
    start = blocks[me][0][0]
    return Layout(rank=start // size, world_size=len(distinct))


def check_divisible(
    sharding: jax.sharding.Sharding, layout: Layout, field: str, field_shape: Sequence[int], batch_size: int
) -> None:
    """Raises :class:`ConfigError` when a field's global batch cannot be split over the devices."""
    shape = (batch_size * layout.world_size, *field_shape)
    try:
        sharding.shard_shape(shape)
    except ValueError as error:
        raise ConfigError(
            f"invalid batch_size {batch_size}: field {field!r} has global batches of shape {shape}, "
            f"which the sharding cannot split evenly over its devices: {error}"
        ) from None
