"""The sharded iterator: each process reads its rows of every global batch into global ``jax.Array``s."""

from __future__ import annotations

import contextlib
import dataclasses
import weakref
from collections.abc import Iterator
from types import TracebackType
from typing import Any, Literal

import jax
import jax.experimental
import numpy as np
from o41_training_data import (
    Batch,
    BatchStream,
    BatchStreamConfig,
    Checkpoint,
    CheckpointError,
    ConfigError,
    Position,
    RankStream,
    StreamClosedError,
    StreamRules,
    TrainingData,
    check_adapter_options,
    checkpoint_from_text,
    switch_point,
)

from ._layout import check_divisible, process_layout
from ._prefetch import End, Failure, Producer

__all__ = ["DEFAULT_PREFETCH", "O41JaxIterator"]

DEFAULT_PREFETCH = 2
"""Batches transferred to the devices ahead of the one the trainer holds."""


# JAX's 64-bit setting as a context manager; releases before jax.enable_x64 kept it in experimental.
_ENABLE_X64: Any = getattr(jax, "enable_x64", None)
if _ENABLE_X64 is None:  # pragma: no cover - older jax releases
    _ENABLE_X64 = jax.experimental.enable_x64  # type: ignore[attr-defined,unused-ignore]


@dataclasses.dataclass(frozen=True)
class _Transfer:
    """Builds a batch's global arrays from this process's rows.

    The prefetch thread holds this, not the iterator, so an iterator dropped without ``close()``
    can still be collected (and its finalizer stop the thread).
    """

    sharding: jax.sharding.Sharding
    world_size: int
    bool_fields: frozenset[str]
    x64: bool | None
    """JAX's 64-bit setting to transfer under; None when no field's dtype depends on it."""
    single_process: bool

    def __call__(self, batch: Batch) -> dict[str, jax.Array]:
        local = {
            name: array.view(np.bool_) if name in self.bool_fields else array
            for name, array in batch.arrays().items()
        }
        with contextlib.nullcontext() if self.x64 is None else _ENABLE_X64(self.x64):
            if self.single_process:
                # What make_array_from_process_local_data does with one process, without its
                # per-call checks of the tree (a tenth of the cost of a small batch).
                placed: dict[str, jax.Array] = jax.device_put(local, self.sharding)
                return placed
            shapes = {name: (a.shape[0] * self.world_size, *a.shape[1:]) for name, a in local.items()}
            # jax leaves this function unannotated; it returns the pytree it was given, of jax.Arrays.
            arrays: dict[str, jax.Array] = jax.make_array_from_process_local_data(  # type: ignore[no-untyped-call]
                self.sharding, local, shapes
            )
        return arrays

    def ready(self, batch: Batch) -> dict[str, jax.Array]:
        """The arrays once on the devices: the prefetch thread waits so the trainer never does."""
        arrays: dict[str, jax.Array] = jax.block_until_ready(self(batch))  # type: ignore[no-untyped-call]
        return arrays


class _Pipeline:
    """The current stream and its prefetch thread: what :meth:`O41JaxIterator.close` stops."""

    def __init__(self, stream: BatchStream) -> None:
        self.stream = stream
        self.producer: Producer[dict[str, jax.Array]] | None = None

    def stop(self) -> None:
        # Closing the stream first wakes a prefetch thread waiting in the engine for a batch.
        self.stream.close()
        if self.producer is not None:
            self.producer.stop()
            self.producer = None


class O41JaxIterator(Iterator[dict[str, jax.Array]]):
    """Global batches as dicts of globally sharded ``jax.Array``s, one per projected field.

    ``source`` is a :class:`BatchStreamConfig` (start fresh) or a :class:`Checkpoint` (resume
    right after it). ``sharding`` places the batch axis (axis 0 of every field), typically
    ``NamedSharding(mesh, PartitionSpec("data"))``.

    - **Rows**: each process reads only its own rows. Its rank is the position of its block
      of the batch axis under ``sharding`` and the world size the number of blocks, which is
      ``jax.process_index()`` and ``jax.process_count()`` for a mesh from ``jax.make_mesh``. At
      step ``k`` (counted from the stream's origin), rank ``r`` of ``W`` contributes its local
      batch ``k``, the core's global batch ``k*W + r``, as rows ``[r*B, (r+1)*B)`` of a global
      batch of ``B*W`` rows (``B`` the stage's ``batch_size``), so the global array's rows are
      the order function's sequence; ``jax.make_array_from_process_local_data`` then splits the
      process's ``B`` rows over its devices in device order along the batch axis. A config that
      names another rank or world size is refused.
    - **Prefetch**: a background thread transfers up to ``prefetch`` batches (default 2) to the
      devices ahead of the trainer, in order; ``prefetch=0`` transfers each batch in ``next``.
      The state reported (:meth:`get_state`, :meth:`checkpoint`, :attr:`position`) is always
      that of the last batch handed out, whatever was prefetched. :meth:`close` stops the
      thread and the stream.
    - **Steps**: every process yields the same number of batches with the same shapes (the
      core drops a finite stage's final round that cannot be filled on every rank), so no
      process waits in a collective for a batch another one never gets.
    - **Ramps**: in a ramped stage (``Stage(ramp=...)``) the processes share each global batch
      (rank ``r`` holds rows ``[r*b/W, (r+1)*b/W)`` of a ``b``-row batch), so step ``k`` is the
      core's global batch ``k`` and its global array has the batch's own ``b`` rows. Each ramp
      step is a new shape, which a ``jax.jit`` step function compiles once more for: one
      compilation per ramp size, none after the ramp. Every ramp size must split over the
      processes and their devices (checked here and at open).
    - **Validation passes** (``validation_pass=True``): the final round is padded with zero
      rows, and the ``valid`` field (``bool``) marks the real ones; weight a score by it.
    - **State**: :meth:`get_state`/:meth:`set_state`/:meth:`start_prefetch` carry the core's
      checkpoint JSON, so ``grain.checkpoint.CheckpointSave(iterator)`` works in an Orbax
      ``Composite``, as do this package's :class:`O41Save`/:class:`O41Restore`, which also
      restore onto another number of processes.
    - **Fields**: ``bool`` fields arrive as ``bool`` arrays (``bool_as="uint8"`` keeps 0/1
      ``uint8``), the others in their projected dtype as JAX canonicalises it: with
      ``jax_enable_x64`` off (JAX's default) ``f64`` becomes ``float32``, and an ``i64`` field is
      refused rather than wrapped silently to ``int32``. The setting in effect at construction
      holds for the iterator's life.

    Examples:
        >>> mesh = jax.make_mesh((jax.device_count(),), ("data",))  # doctest: +SKIP
        >>> sharding = NamedSharding(mesh, PartitionSpec("data"))  # doctest: +SKIP
        >>> with O41JaxIterator(config, sharding) as batches:  # doctest: +SKIP
        ...     for batch in batches:
        ...         state = train_step(state, batch)  # batch["tokens"]: (batch_size * W, 2048)

    """

    def __init__(
        self,
        source: BatchStreamConfig | Checkpoint,
        sharding: jax.sharding.Sharding,
        training_data: TrainingData | None = None,
        *,
        prefetch: int = DEFAULT_PREFETCH,
        bool_as: Literal["bool", "uint8"] = "bool",
    ) -> None:
        if not isinstance(sharding, jax.sharding.Sharding):
            raise ConfigError(
                f"invalid sharding: expected a jax.sharding.Sharding, got {type(sharding).__name__}"
            )
        check_adapter_options(training_data, bool_as)
        if isinstance(prefetch, bool) or not isinstance(prefetch, int) or prefetch < 0:
            raise ConfigError(f"invalid prefetch: expected a whole number of batches >= 0, got {prefetch!r}")
        self._sharding = sharding
        self._prefetch = prefetch
        # The engine's schema (a validation pass's `valid` mask included) and batch shapes.
        rules = StreamRules.of(source)
        fields = [(f.name, f.dtype, f.shape) for f in rules.fields]
        self._layout = process_layout(sharding, fields[0][2] if fields else ())
        local_rows = rules.local_batch_rows(self._layout.world_size)
        for name, _, shape in fields:
            for rows in local_rows:
                check_divisible(sharding, self._layout, name, shape, rows)
        # Fixed now: the prefetch thread does not see a jax.enable_x64 context of this thread.
        x64 = jax.dtypes.canonicalize_dtype(np.int64) == np.dtype(np.int64)
        wide = [name for name, dtype, _ in fields if dtype == "i64"]
        if wide and not x64:
            raise ConfigError(
                f"invalid field {wide[0]!r}: it is i64, but jax_enable_x64 is off, so JAX would wrap "
                "values beyond int32 silently; project it as i32, or turn 64-bit types on with "
                "jax.config.update('jax_enable_x64', True)"
            )
        self._rules = rules
        self._transfer = _Transfer(
            sharding,
            self._layout.world_size,
            frozenset(n for n, dtype, _ in fields if dtype == "bool" and bool_as == "bool"),
            x64 if any(dtype in ("i64", "f64") for _, dtype, _ in fields) else None,
            jax.process_count() == 1,
        )
        # The process's block of the batch axis is its rank (see _layout).
        ranks = (self._layout.rank, self._layout.world_size)
        decided_by = "the sharding (its block of the batch axis)"
        self._source = RankStream(source, training_data, ranks=ranks, decided_by=decided_by)
        stream = self._source.open()
        self._closed = False
        self._finalizer: weakref.finalize[[], O41JaxIterator] | None = None
        self._install(stream)

    def _install(self, stream: BatchStream) -> None:
        """Makes ``stream`` current and its position the one reported.

        The previous stream is closed and what was prefetched from it dropped.
        """
        if self._finalizer is not None:
            self._finalizer()
        self._pipeline = _Pipeline(stream)
        self._position: Position = stream.position
        # An iterator dropped without close() still stops its thread (at GC or interpreter exit).
        self._finalizer = weakref.finalize(self, self._pipeline.stop)

    @property
    def rank(self) -> int:
        """The block of the batch axis this process holds (the core rank it reads)."""
        return self._layout.rank

    @property
    def world_size(self) -> int:
        """The number of blocks of the batch axis (the core world size)."""
        return self._layout.world_size

    @property
    def sharding(self) -> jax.sharding.Sharding:
        """The sharding of every field's global array."""
        return self._sharding

    @property
    def position(self) -> Position:
        """The position after the last batch handed out (the start before the first one)."""
        return self._position

    @property
    def closed(self) -> bool:
        """True once :meth:`close` has run."""
        return self._closed

    def start_prefetch(self) -> None:
        """Starts transferring batches ahead now rather than at the first ``next``. Idempotent."""
        self._check_open("start_prefetch")
        pipeline = self._pipeline
        if self._prefetch and pipeline.producer is None:
            pipeline.producer = Producer(pipeline.stream, self._transfer.ready, self._prefetch)

    def __iter__(self) -> O41JaxIterator:
        return self

    def __next__(self) -> dict[str, jax.Array]:
        self._check_open("next")
        pipeline = self._pipeline
        if not self._prefetch:
            batch = next(pipeline.stream)
            arrays = self._transfer(batch)
            self._position = batch.position
            return arrays
        if pipeline.producer is None:
            self.start_prefetch()
        assert pipeline.producer is not None
        item = pipeline.producer.get()
        if isinstance(item, End):
            raise StopIteration
        if isinstance(item, Failure):
            raise item.error
        arrays, self._position = item
        return arrays

    def checkpoint(self) -> Checkpoint:
        """The checkpoint after the last batch handed out; it also works after :meth:`close`."""
        return self._pipeline.stream.checkpoint(self._position)

    def get_state(self) -> bytes:
        """The core's checkpoint JSON after the last batch handed out (grain's iterator protocol)."""
        return self.checkpoint().to_json().encode()

    def set_state(self, state: bytes) -> None:
        """Continues right after the batch ``state`` (from :meth:`get_state`) describes.

        Refuses, with :class:`CheckpointError`, a state that is not a checkpoint, one of another
        stream, and one of another rank or world size (restore through :class:`O41Restore` to
        move onto another number of processes). What was prefetched is dropped; the next batch
        comes from the restored position, and prefetching resumes at :meth:`start_prefetch` or
        the next ``next``.
        """
        self._check_open("set_state")
        if not isinstance(state, (bytes, bytearray)):
            raise CheckpointError(
                f"state refused: expected bytes from get_state(), got {type(state).__name__}"
            )
        try:
            text = bytes(state).decode()
        except UnicodeDecodeError:
            raise CheckpointError("state refused: not UTF-8 text; expected bytes from get_state()") from None
        # A split-form process file (what O41Save writes, which grain's CheckpointRestore hands
        # over as it is) names the stream's resolved document: this iterator's own stream's,
        # when it is the same stream (the fingerprint decides).
        checkpoint = checkpoint_from_text(text, lambda _name: self.checkpoint().shared_json())
        # The core's rules: this stream, this rank; the config's skip_batches apply from here on.
        self._install(self._source.open(self._source.accept(checkpoint, "iterator")))

    def advance(self, stage: int) -> None:
        """Switches to curriculum ``stage`` from the next batch handed out.

        The new stage starts at the round after the last batch handed out, so every process
        that calls this after the same step switches at the same global batch, and a state
        taken right after the call resumes in the new stage. Batches already prefetched from
        the old stage are dropped and the stream re-opens at the last handed-out position (its
        shards are counted again), since the engine has already delivered them. A same-stage
        advance is a no-op. The switch is the core's ``switch_point`` (docs/rules.md).
        """
        self._check_open("advance")
        # The core's switch point: the round after the last batch handed out, on every process.
        point = switch_point(self._rules, self._position, stage)
        if stage == self._position.stage:
            return
        pipeline = self._pipeline
        if pipeline.producer is None:
            # Nothing was taken from the stream beyond what was handed out.
            pipeline.stream.advance(point.stage, at=point.at)
            self._position = pipeline.stream.position
            return
        stream = self._source.open(self.checkpoint())
        try:
            stream.advance(point.stage, at=point.at)
        except BaseException:
            stream.close()
            raise
        self._install(stream)
        self.start_prefetch()

    def close(self) -> None:
        """Stops the prefetch thread and the stream. Idempotent; the state stays readable."""
        self._closed = True
        if self._finalizer is not None:
            self._finalizer()

    def _check_open(self, verb: str) -> None:
        if self._closed:
            raise StreamClosedError(f"O41JaxIterator.{verb}: the iterator was closed")

    def __enter__(self) -> O41JaxIterator:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def __repr__(self) -> str:
        position = self._position
        return (
            f"O41JaxIterator(rank={self.rank}, world_size={self.world_size}, "
            f"next_batch={position.next_batch}, stage={position.stage}, prefetch={self._prefetch})"
        )
