"""The stream's rules every adapter follows, written once (docs/rules.md).

A framework adapter (PyTorch, JAX, Lightning, or your own) needs the same few answers about a
stream: which rank and world size this process has, which columns (names, dtypes, shapes) a
batch delivers, how many rows a rank's batch of a stage can have, at which global batch a
curriculum switch takes effect on every rank, whether checkpoints that several ranks wrote can be
moved onto another number of ranks, and how to name and write a per-rank file so that a crash
never leaves half of one. They are answered here, from the engine's own types where the
engine knows them, so that every adapter applies one rule with one set of error messages.
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, Protocol, TypeVar

from . import _core
from ._core import Checkpoint, Position
from ._errors import CheckpointError, ConfigError
from ._files import create_beside
from ._limits import LIMITS

if TYPE_CHECKING:
    from ._config import BatchStreamConfig

__all__ = [
    "LIMITS",
    "PROCESS_FILE",
    "RANK_FILE",
    "DeliveredField",
    "StageBatches",
    "StreamRules",
    "SwitchPoint",
    "check_adapter_options",
    "check_same_place",
    "check_same_stream",
    "check_stream_of",
    "find_rank_files",
    "move_to_world",
    "observed_ranks",
    "parse_rank_file_name",
    "process_ranks",
    "rank_file_name",
    "rank_files_among",
    "resume_point",
    "switch_point",
    "with_ranks",
    "write_rank_file",
]


@dataclass(frozen=True)
class DeliveredField:
    """One column of every batch: its name, dtype (``"i32"``, ``"bool"``, ...) and per-row shape."""

    name: str
    dtype: str
    shape: tuple[int, ...]


@dataclass(frozen=True)
class StageBatches:
    """The batch sizes of one stage: its global ``batch_size`` and its ramp, if it has one.

    ``ramp`` is ``(start, increment, rows)``: the global batch starts at ``start`` rows and grows
    by ``increment`` until ``batch_size`` over the stage's first ``rows`` rows.
    """

    batch_size: int
    ramp: tuple[int, int, int] | None
    sizes: tuple[int, ...]
    """Every row count a global batch of the stage has, smallest first, as the engine's ramp
    rule gives them (``batch_size`` alone without a ramp)."""

    def global_sizes(self) -> tuple[int, ...]:
        """Every row count a global batch of the stage can have, smallest first."""
        return self.sizes

    def local_batch_rows(self, world_size: int) -> tuple[int, ...]:
        """Every row count one rank's batch of the stage can have.

        Without a ramp each rank receives whole global batches in turn; a ramped stage's global
        batches are shared, each rank receiving ``size / world_size`` rows of every one (a size
        that does not split is refused by the engine at open, naming the stage). The engine's
        rule (``order/ramp.rs``).
        """
        return tuple(_core.stage_batch_rows(self.batch_size, self.ramp, world_size)[0])

    def batches_per_round(self, world_size: int) -> int:
        """Global batches one round of local batches covers: ``world_size``, or 1 in a ramp."""
        return _core.stage_batch_rows(self.batch_size, self.ramp, world_size)[1]


@dataclass(frozen=True)
class StreamRules:
    """What an adapter needs to know of a stream before opening it, read by the engine.

    Build it with :meth:`of` from a config or a checkpoint: the checkpoint's resolved document is
    read where the engine holds it, so its shard list is never materialised in Python.

    Examples:
        >>> rules = StreamRules.of(config)  # doctest: +SKIP
        >>> [(f.name, f.dtype, f.shape) for f in rules.fields]  # doctest: +SKIP
        [('tokens', 'i32', (2048,)), ('valid', 'bool', ())]

    """

    fields: tuple[DeliveredField, ...]
    """Every column a batch delivers, in order: the projected fields, then a validation pass's
    ``valid`` mask."""
    stages: tuple[StageBatches, ...]
    """The stages' batch sizes, in curriculum order."""
    rank: int
    """The rank the config or checkpoint names."""
    world_size: int
    """The world size the config or checkpoint names."""

    @classmethod
    def of(cls, source: BatchStreamConfig | Checkpoint) -> StreamRules:
        """The rules of ``source``, a :class:`BatchStreamConfig` or a :class:`Checkpoint`."""
        from ._config import BatchStreamConfig

        if not isinstance(source, (BatchStreamConfig, Checkpoint)):
            raise ConfigError(
                f"source: expected a BatchStreamConfig or a Checkpoint, got {type(source).__name__}"
            )
        fields, stages, rank, world_size = _core.stream_rules(source)
        return cls(
            fields=tuple(DeliveredField(name, dtype, tuple(shape)) for name, dtype, shape in fields),
            stages=tuple(StageBatches(batch_size, ramp, tuple(sizes)) for batch_size, ramp, sizes in stages),
            rank=rank,
            world_size=world_size,
        )

    def local_batch_rows(self, world_size: int | None = None) -> tuple[int, ...]:
        """Every row count a rank's batch can have over all stages, smallest first."""
        world = self.world_size if world_size is None else world_size
        return tuple(sorted({rows for stage in self.stages for rows in stage.local_batch_rows(world)}))

    def field_names(self, dtype: str | None = None) -> frozenset[str]:
        """The delivered columns' names (of ``dtype`` only, when given)."""
        return frozenset(f.name for f in self.fields if dtype is None or f.dtype == dtype)


@dataclass(frozen=True)
class SwitchPoint:
    """A curriculum switch every rank agrees on: stage ``stage`` starts at global batch ``at``.

    ``at`` is a global batch number (a position's ``next_batch``): the new stage starts with the
    first round of the stream that begins at or after it, on every rank and in every
    ``DataLoader`` worker that applies it. It is a plain value, so an adapter keeps it and applies
    it to every stream it opens later (a new pass, a worker, a resumed stream) with
    ``stream.advance(point.stage, at=point.at)`` while :meth:`due`. Build it with
    :func:`switch_point`; a negative or non-integer ``stage`` or ``at`` raises
    :class:`ConfigError` naming it.
    """

    stage: int
    """The curriculum stage (an index into the config's ``stages``)."""
    at: int
    """The global batch the stage starts at (the first round at or after it)."""

    def __post_init__(self) -> None:
        for name in ("stage", "at"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ConfigError(f"invalid {name}: expected a whole number >= 0, got {value!r}")

    def due(self, position: Position) -> bool:
        """Whether a stream at ``position`` has not reached the switch yet, so it should apply it.

        A stream past ``at`` (resumed from a checkpoint taken after the switch) already
        reflects it, or never will: applying it there would be refused by the engine.
        """
        return position.next_batch <= self.at


def switch_point(
    source: BatchStreamConfig | Checkpoint | StreamRules,
    position: Position,
    stage: int,
    *,
    batches_ahead: int = 0,
) -> SwitchPoint:
    """Where a switch to ``stage`` requested after ``position`` takes effect, the same on every rank.

    ``source`` is the stream's config or a checkpoint of it (or its :class:`StreamRules`, to
    skip reading them again); ``position`` is the rank's place after the last batch the trainer
    consumed, and ``batches_ahead`` the local batches the loader may already have produced past it
    (``DataLoader`` workers' prefetch). The switch lands on the round after those batches: a
    position's ``next_batch`` is the same on every rank after the same number of local batches,
    and each local batch ahead is one round, ``world_size`` global batches (one in a ramped
    stage, whose global batches the ranks share: :meth:`StageBatches.batches_per_round`).

    A ``stage`` that is not one of the stream's, or a negative ``batches_ahead``, raises
    :class:`ConfigError` naming the argument.

    Examples:
        >>> point = switch_point(config, batch.position, 1, batches_ahead=4)  # doctest: +SKIP
        >>> stream.advance(point.stage, at=point.at)  # doctest: +SKIP

    """
    rules = source if isinstance(source, StreamRules) else StreamRules.of(source)
    count = len(rules.stages)
    if isinstance(stage, bool) or not isinstance(stage, int) or not 0 <= stage < count:
        raise ConfigError(f"invalid stage: there is no stage {stage!r}; the stream has {count} stages")
    if (
        isinstance(batches_ahead, bool)
        or not isinstance(batches_ahead, int)
        or not 0 <= batches_ahead < 1 << 64
    ):
        raise ConfigError(f"invalid batches_ahead: expected a whole number >= 0, got {batches_ahead!r}")
    if not isinstance(position, Position):
        raise ConfigError(f"invalid position: expected a Position, got {type(position).__name__}")
    ramped = [batches.ramp is not None for batches in rules.stages]
    return SwitchPoint(stage=stage, at=_core.switch_at(ramped, position, stage, batches_ahead))


def _whole(name: str, value: object, *, minimum: int, maximum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ConfigError(f"invalid {name}: expected an integer, got {value!r}")
    if not minimum <= value <= maximum:
        raise ConfigError(f"invalid {name}: must be between {minimum} and {maximum}, got {value}")
    return value


def check_adapter_options(training_data: object, bool_as: object = "bool") -> None:
    """Checks the options every framework adapter takes, one way for all of them.

    ``training_data`` is a :class:`TrainingData` or ``None``; ``bool_as`` is ``"bool"`` or
    ``"uint8"``. Anything else raises :class:`ConfigError` naming the option.

    Examples:
        >>> check_adapter_options(None, "uint8")

    """
    from ._training_data import TrainingData

    if training_data is not None and not isinstance(training_data, TrainingData):
        raise ConfigError(
            f"invalid training_data: expected a TrainingData, got {type(training_data).__name__}"
        )
    if bool_as not in ("bool", "uint8"):
        raise ConfigError(f"invalid bool_as: {bool_as!r}; expected 'bool' or 'uint8'")


def with_ranks(config: BatchStreamConfig, ranks: tuple[int, int], decided_by: str) -> BatchStreamConfig:
    """Places ``config`` at ``ranks`` (``(rank, world_size)``), as ``decided_by`` chose them.

    ``decided_by`` names the framework that decides: ``"the trainer"``, ``"the sharding"``,
    ``"torch.distributed"``.

    A config may leave its rank and world size unset (``(0, 1)``) or name the same pair; one
    that names another is refused, both pairs named, rather than silently overridden.

    Examples:
        >>> with_ranks(config, (1, 4), "the trainer").rank  # doctest: +SKIP
        1

    """
    import dataclasses

    explicit = (config.rank, config.world_size)
    if explicit not in ((0, 1), ranks):
        raise ConfigError(
            f"rank/world_size: the config says rank {config.rank} of {config.world_size}, "
            f"{decided_by} says rank {ranks[0]} of {ranks[1]}; leave them unset"
        )
    return dataclasses.replace(config, rank=ranks[0], world_size=ranks[1])


def check_world(rank: object, world_size: object) -> tuple[int, int]:
    """``(rank, world_size)`` checked: a world of 1 to ``max_world_size`` ranks, a rank below it."""
    world = _whole("world_size", world_size, minimum=1, maximum=LIMITS["max_world_size"])
    return _whole("rank", rank, minimum=0, maximum=world - 1), world


def _environment() -> tuple[int, int] | None:
    if "RANK" not in os.environ or "WORLD_SIZE" not in os.environ:
        return None
    values = []
    for variable in ("RANK", "WORLD_SIZE"):
        text = os.environ[variable]
        try:
            values.append(int(text))
        except ValueError:
            raise ConfigError(
                f"invalid {variable} environment variable: expected an integer, got {text!r}"
            ) from None
    try:
        rank, world = check_world(values[0], values[1])
    except ConfigError as error:
        raise ConfigError(f"the RANK and WORLD_SIZE environment variables: {error}") from None
    return rank, world


def _torch_distributed() -> tuple[int, int] | None:
    # Only where the program imported it: the core never imports a framework.
    distributed = sys.modules.get("torch.distributed")
    if distributed is not None and distributed.is_available() and distributed.is_initialized():
        return int(distributed.get_rank()), int(distributed.get_world_size())
    return None


def observed_ranks() -> tuple[int, int] | None:
    """The ``(rank, world_size)`` the process's launcher set up, if any.

    ``torch.distributed`` when the program initialised it, else the ``RANK`` and ``WORLD_SIZE``
    environment variables (malformed ones raise :class:`ConfigError` naming them), else ``None``.
    """
    return _torch_distributed() or _environment()


def process_ranks(configured: tuple[int, int] | None = None) -> tuple[int, int]:
    """The ``(rank, world_size)`` of this process.

    ``torch.distributed`` decides when the program initialised it: a ``configured`` pair (a
    config's or checkpoint's explicit rank and world size) that disagrees is refused. Otherwise
    the ``configured`` pair, then the ``RANK`` and ``WORLD_SIZE`` environment variables (as
    ``torchrun`` and most launchers set them), then a single rank ``(0, 1)``. A configured
    ``(0, 1)`` counts as not configured. Malformed values raise :class:`ConfigError` naming them.

    Examples:
        >>> process_ranks()  # doctest: +SKIP
        (0, 1)

    """
    if configured is not None:
        configured = check_world(*configured)
        if configured == (0, 1):
            configured = None
    distributed = _torch_distributed()
    if distributed is not None:
        if configured is not None and configured != distributed:
            raise ConfigError(
                f"rank/world_size: the config says rank {configured[0]} of {configured[1]}, "
                f"torch.distributed says rank {distributed[0]} of {distributed[1]}; leave them unset"
            )
        return distributed
    if configured is not None:
        return configured
    return _environment() or (0, 1)


def resume_point(checkpoint: Checkpoint, config: BatchStreamConfig | None) -> Checkpoint:
    """The checkpoint a stream over ``config`` resumes from: the rule every adapter applies.

    ``config`` must describe ``checkpoint``'s stream (:meth:`Checkpoint.check` names the first
    difference), and its ``skip_batches`` become the stream's: ranges the checkpoint skips are
    kept, ranges it adds start at or after its position (docs/order.md, "Skipping batches").
    ``None`` (a stream rebuilt from a checkpoint alone) resumes the checkpoint as it is.

    Examples:
        >>> stream = resume_batch_stream(resume_point(checkpoint, config))  # doctest: +SKIP

    """
    if config is None:
        return checkpoint
    checkpoint.check(config=config)
    return checkpoint.with_skipped_batches(config.skip_batches)


def _named(stops: Mapping[str, Position | Checkpoint | None]) -> list[tuple[str, Position | None]]:
    return [(str(name), stop) for name, stop in stops.items()]


def check_same_stream(stops: Mapping[str, Position | Checkpoint | None]) -> None:
    """Refuses ``stops`` (named positions or checkpoints; ``None``: not started) of several streams.

    Their fingerprints must agree: files of another run, or of the same run with other shards,
    fields or seed, are not one stream's ranks. :class:`CheckpointError` names two that differ.
    The engine's rule (``checkpoint/run.rs``), which every adapter and the CLI apply.
    """
    _core.check_same_stream(_named(stops))


def check_stream_of(
    checkpoint: Checkpoint, config: BatchStreamConfig | None, fingerprint: str | None, reader: str
) -> None:
    """Refuses ``checkpoint`` unless it is of the stream ``reader`` reads (a ``"dataset"``, ...).

    Against ``config`` when the reader has one (:meth:`Checkpoint.check` names the first
    difference), else by the stream's ``fingerprint`` (``None``: not started, anything goes).
    """
    if config is not None:
        checkpoint.check(config=config)
    elif fingerprint is not None and checkpoint.fingerprint != fingerprint:
        raise CheckpointError(
            f"checkpoint refused: it belongs to stream {checkpoint.fingerprint}, another stream "
            f"than this {reader} reads ({fingerprint})"
        )


def check_same_place(stops: Mapping[str, Position | Checkpoint | None], *, world_size: int) -> None:
    """Refuses to move ``stops`` onto ``world_size`` ranks unless they are all at one place.

    ``stops`` are the old ranks' positions or checkpoints, each named as errors should name it
    (a file, ``rank 3``); ``None`` is a rank that has not started. Positions are global, so
    moving them is exact only when every old rank belongs to the same stream (fingerprint),
    stopped in the same curriculum segment and before the same global batch, with the same
    pending curriculum switches; otherwise some batches would be delivered twice or never, and
    :class:`CheckpointError` names two that differ. Used by ``o41 checkpoint reshard``, the JAX
    Orbax handler and the Lightning plugin.
    """
    _core.check_same_place(_named(stops), world_size)


def move_to_world(
    stops: Mapping[str, Checkpoint | Position | None],
    rank: int,
    world_size: int,
    *,
    resolved: Checkpoint | str | Mapping[str, Any] | None = None,
) -> Checkpoint:
    """The checkpoint for rank ``rank`` of ``world_size``, moved from the old ranks' ``stops``.

    :func:`check_same_place` first, then :meth:`Checkpoint.for_world` on any of them (they are
    equal but for their rank). ``stops`` maps a name for errors to each old rank's checkpoint,
    or its position with ``resolved`` (a checkpoint of the stream, or its resolved document)
    saying which stream it is in; ``None`` is a rank that had not started, refused unless no
    rank had (then there is nothing to move: :class:`CheckpointError`).
    """
    rank, world_size = check_world(rank, world_size)
    check_same_place(stops, world_size=world_size)
    first = next((stop for stop in stops.values() if stop is not None), None)
    if first is None:
        raise CheckpointError("checkpoint refused: no old rank had started, so there is no position to move")
    if not isinstance(first, Checkpoint):
        if resolved is None:
            raise ConfigError(
                "move_to_world: positions need resolved=, a checkpoint or document of their stream"
            )
        first = Checkpoint.from_position(first, resolved)
    return first.for_world(rank, world_size)


RANK_FILE = "stream-rank{rank}-of-{world_size}.json"
"""The name of every per-rank file the packages write (:func:`rank_file_name` fills it in)."""
PROCESS_FILE = "process_{index}-of-{count}.json"
"""The JAX Orbax handler's per-process file name, grain's (``rank_file_name(..., naming="process")``)."""


def rank_file_name(rank: int, world_size: int, *, naming: Literal["stream", "process"] = "stream") -> str:
    """The name of rank ``rank`` of ``world_size``'s file: ``stream-rank{rank}-of-{world_size}.json``.

    ``o41 checkpoint reshard``, the core's :func:`write_checkpoint` and the Lightning plugin's
    sidecars name their per-rank files so. ``naming="process"`` gives the JAX Orbax handler's
    names, ``process_{index}-of-{count}.json`` by JAX process index and count, which grain's
    handler reads too. A bad rank or world size raises :class:`ConfigError`.
    """
    rank, world_size = check_world(rank, world_size)
    if naming not in ("stream", "process"):
        raise ConfigError(f"invalid naming: {naming!r}; expected 'stream' or 'process'")
    return _core.rank_file_name(rank, world_size, naming)


def parse_rank_file_name(name: str) -> tuple[int, int] | None:
    """``(rank, world_size)`` of a per-rank file's name, or ``None`` for any other name.

    Reads :data:`RANK_FILE`'s names and the JAX Orbax handler's (``process_{i}-of-{n}.json``),
    written as their writers write them (no sign, no leading zero, an index below the count).
    """
    return _core.parse_rank_file_name(name)


def rank_files_among(names: Iterable[str], where: object) -> dict[tuple[int, int], str]:
    """The per-rank files among ``names`` (a directory's entries), keyed by ``(rank, world_size)``.

    Other names are skipped. Two names for the same rank of the same world (``process_0-of-2.json``
    beside ``stream-rank0-of-2.json``) leave it unclear which holds the rank's position, so
    :class:`CheckpointError` names both and ``where`` (the directory).
    """
    files = _core.RunFiles(list(names), str(where)).files()
    return {(index, count): name for index, count, name in files}


class _Entry(Protocol):
    @property
    def name(self) -> str: ...


_Dir = TypeVar("_Dir", bound="_Directory")


class _Directory(_Entry, Protocol):
    def iterdir(self: _Dir) -> Iterator[_Dir]: ...


def find_rank_files(directory: _Dir) -> dict[tuple[int, int], _Dir]:
    """The per-rank files in ``directory``, keyed by ``(rank, world_size)``: see :func:`rank_files_among`.

    ``directory`` is a :class:`pathlib.Path` or any path type with ``iterdir()`` and ``name``
    (Orbax's ``epath.Path``); the values are its entries.
    """
    entries = {entry.name: entry for entry in directory.iterdir()}
    return {key: entries[name] for key, name in rank_files_among(entries, directory).items()}


def write_rank_file(path: Path, text: str, *, overwrite: bool) -> None:
    """Writes ``text`` to ``path`` all or nothing: a reader sees the old file or the new one.

    The text goes to a temporary file in the same directory and is flushed to disk, then renamed
    over ``path`` (``overwrite``) or linked to it, which fails with :class:`FileExistsError` when
    ``path`` exists; the directory is flushed too, so the new name survives a crash. The file
    gets the mode a plain ``open(path, "w")`` gives (``0o666`` less the umask), like the model
    checkpoint beside it.
    """
    descriptor, temporary = create_beside(path)
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
