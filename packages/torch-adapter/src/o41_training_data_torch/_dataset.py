"""The ``torch.utils.data.IterableDataset`` over a core batch stream."""

from __future__ import annotations

import multiprocessing.context
import multiprocessing.sharedctypes
import os
import warnings
from collections.abc import Iterator, Mapping
from multiprocessing.reduction import ForkingPickler
from typing import Any, Literal

import numpy as np
import torch
from o41_training_data import (
    BatchStream,
    BatchStreamConfig,
    Checkpoint,
    CheckpointError,
    ConfigError,
    Position,
    RankStream,
    StreamStats,
    SwitchPoint,
    TrainingData,
    check_adapter_options,
    switch_point,
)
from torch.utils.data import IterableDataset, get_worker_info
from torch.utils.data._utils.collate import default_collate_fn_map

from . import _ring

__all__ = ["POSITION_KEY", "STATE_VERSION", "WORKERS_KEY", "O41Batch", "O41IterableDataset"]

POSITION_KEY = "o41_position"
"""Key of each batch's :class:`Position` (the rank's place after it): pass the batch to
``dataset.checkpoint(batch)``."""
WORKERS_KEY = "o41_workers"
"""Key of the number of ``DataLoader`` workers that produced the batch (1 without workers)."""
STATE_VERSION = 1
"""Version of the ``state_dict`` this dataset returns."""

# The DataLoader's default prefetch_factor: how many batches each worker may hold ahead.
_DEFAULT_PREFETCH_FACTOR = 2


_WHOLE_BATCHES = (
    "O41IterableDataset yields whole batches (the stage's batch_size rows); "
    "write DataLoader(dataset, batch_size=None, ...) instead of setting a batch_size"
)


def _refuse_collation(batch: Any, *, collate_fn_map: Any = None) -> Any:
    raise ConfigError(_WHOLE_BATCHES)


# A DataLoader with a batch_size collates items; torch's documented extension point maps each
# type to its collate function. Positions are never collated: the map says so with our message.
default_collate_fn_map[Position] = _refuse_collation


class O41Batch(dict[str, Any]):
    """One whole batch: projected fields as tensors plus metadata.

    Keys: the projected fields, ``stage``, ``batch_index``, ``o41_position`` and ``o41_workers``.
    ``DataLoader`` passes it through ``default_convert`` (``batch_size=None``) untouched; a
    ``DataLoader`` with a ``batch_size`` would collate several batches into one, which the
    position's collate function refuses.
    """

    def __copy__(self) -> O41Batch:
        return O41Batch(self)


def _reduce_batch(batch: O41Batch) -> Any:
    # How a worker's item crosses the DataLoader's queue: its slot fields as one ring handle
    # (a few dozen bytes, one lookup in the main process), the metadata as it is.
    split = _ring.split_mapping(batch)
    if split is None:
        return (O41Batch, (dict(batch),))
    return (_rebuild_batch, split)


def _rebuild_batch(handle: Any, others: dict[str, Any]) -> O41Batch:
    return O41Batch(_ring.join_mapping(handle, others))


# Only multiprocessing's pickler, which DataLoader queues use; plain pickle is unchanged.
ForkingPickler.register(O41Batch, _reduce_batch)


# The arrays are read-only views over engine memory that nothing else references; torch warns
# about read-only NumPy arrays, but sharing (not copying) them is the point. The filter matches
# only warnings raised from this module, so users' own warnings are untouched.
warnings.filterwarnings(
    "ignore", message="The given NumPy array is not writable", category=UserWarning, module=__name__
)


def _tensor(array: np.ndarray, as_bool: bool) -> torch.Tensor:
    tensor = torch.from_numpy(array)
    return tensor.view(torch.bool) if as_bool else tensor


class O41IterableDataset(IterableDataset[O41Batch]):
    """A ``torch.utils.data.IterableDataset`` yielding one core batch per item.

    ``source`` is a :class:`BatchStreamConfig` (start fresh) or a :class:`Checkpoint` (resume
    right after it). Use it as ``DataLoader(dataset, batch_size=None, ...)``.

    - **Ranks** come from ``torch.distributed`` when it is initialised, else from the config
      (when it sets them), else from ``RANK``/``WORLD_SIZE``; a config or checkpoint whose explicit
      rank or world size disagrees with ``torch.distributed`` is refused.
    - **Workers** add no decoding parallelism (the engine's ``threads`` do that): by default the
      first ``DataLoader`` worker streams all of the rank's batches and the others end at once,
      so ``num_workers=N`` yields exactly the sequence of ``num_workers=0`` and decodes it once.
      With ``split_workers=True``, worker ``w`` of ``N`` runs its own engine over the rank's
      local batches ``k`` with ``k % N == w`` instead, and the ``DataLoader``'s in-order round
      robin yields the same sequence (useful when a ``collate_fn`` does heavy CPU work per
      batch). Engine threads start lazily inside each worker (never across a fork).
    - **Fields** become tensors sharing memory with the batch (``torch.from_numpy``); ``bool``
      fields are ``torch.bool`` views (``bool_as="bool"``) or ``uint8`` (``bool_as="uint8"``).
      A ``DataLoader`` worker copies each batch once into a shared-memory slot and only a small
      handle crosses its queue; the main process's tensors view the slot, which is reused only
      once they are all gone.
    - **Ramps and validation passes**: a ramped stage (``Stage(ramp=...)``) yields batches whose
      row count grows step by step (each rank's share of the global batch); a validation pass
      (``validation_pass=True``) adds the ``valid`` mask, a bool field like the declared ones.
    - **Curriculum**: :meth:`advance` switches stage at a :class:`SwitchPoint` (the core's
      ``switch_point``), which the dataset keeps: every stream it opens later (a new pass over
      ``iter()``, each ``DataLoader`` worker, a resumed stream) switches at the same global
      batch. ``switch=`` starts the dataset with a switch already placed.
    - **State**: ``state_dict()``/``load_state_dict()`` follow the
      ``torchdata.stateful_dataloader`` protocol; the state is the core checkpoint JSON. To
      resume with another ``num_workers``, keep ``dataset.checkpoint(batch)`` of the last batch
      the model consumed and build a new dataset from it.

    Examples:
        >>> dataset = O41IterableDataset(config)  # doctest: +SKIP
        >>> for batch in DataLoader(dataset, batch_size=None, num_workers=2):  # doctest: +SKIP
        ...     tokens = batch["tokens"]  # torch.int32 (batch_size, 2048)

    """

    def __init__(
        self,
        source: BatchStreamConfig | Checkpoint,
        training_data: TrainingData | None = None,
        *,
        bool_as: Literal["bool", "uint8"] = "bool",
        split_workers: bool = False,
        switch: SwitchPoint | None = None,
    ) -> None:
        check_adapter_options(training_data, bool_as)
        self._bool_as = bool_as
        if not isinstance(split_workers, bool):
            raise ConfigError(f"invalid split_workers: expected a bool, got {split_workers!r}")
        self._split_workers = split_workers
        if switch is not None and not isinstance(switch, SwitchPoint):
            raise ConfigError(f"invalid switch: expected a SwitchPoint, got {type(switch).__name__}")
        # The rank's stream and its rules (pickled into DataLoader workers without credentials).
        self._source = RankStream(source, training_data)
        # The engine's schema and batch shapes (the `valid` mask of a validation pass included).
        self._rules = self._source.rules
        self._bool_fields = self._rules.field_names("bool")
        if switch is not None and not 0 <= switch.stage < len(self._rules.stages):
            raise ConfigError(
                f"invalid switch: there is no stage {switch.stage}; the stream has "
                f"{len(self._rules.stages)} stages"
            )
        # The latest curriculum switch, applied to every stream this dataset opens (see __iter__).
        self._switch = switch
        # The latest switch as (stage, global batch, request number), shared with worker
        # processes as they start, so persistent workers see later requests too. Lock-free so it
        # crosses fork, spawn and forkserver alike: one writer (the main process) bumps the
        # request number last, readers re-check it (see _read_request).
        self._requests: Any = multiprocessing.sharedctypes.RawArray("q", 3)
        self._seen_request = 0  # the request number this process's stream has applied
        if switch is not None:
            self._publish(switch)
        self._stream: BatchStream | None = None
        self._stream_pid = 0  # a forked worker inherits the parent's stream object, not its threads
        self._last_position: Position | None = None
        self._loaded: dict[str, Any] | None = None

    @property
    def rank(self) -> int:
        """The rank whose batches the dataset yields."""
        return self._source.rank

    @property
    def world_size(self) -> int:
        """The number of ranks sharing the global batch sequence."""
        return self._source.world_size

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["_stream"] = None  # engine threads never cross a process boundary
        if multiprocessing.context.get_spawning_popen() is None:
            # Shared memory travels only to processes being started; a plain pickle drops it.
            state["_requests"] = None
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)

    def _worker_share(self) -> tuple[int, int, int]:
        """The share of the rank's batches this process yields: ``(offset, stride, workers)``.

        ``stride`` is 0 for a worker that yields nothing (every worker but the first, unless
        ``split_workers``).
        """
        info = get_worker_info()
        if info is None:
            return 0, 1, 1
        if self._split_workers:
            return info.id, info.num_workers, info.num_workers
        return 0, (1 if info.id == 0 else 0), info.num_workers

    def _start_checkpoint(self) -> tuple[Checkpoint | None, int, int]:
        """The checkpoint this process's stream starts from, and its share (offset, stride).

        The checkpoint is None when the stream starts at the config's beginning.
        """
        offset, stride, _ = self._worker_share()
        if self._loaded is not None:
            loaded = self._loaded
            return loaded["checkpoint"], int(loaded["offset"]), int(loaded["stride"])
        return self._source.start, offset, stride

    def _open(self) -> BatchStream | None:
        """The stream of this process's share, or None for a worker that yields nothing."""
        _, _, workers = self._worker_share()
        if self._loaded is not None and self._loaded["workers"] != workers:
            raise CheckpointError(
                f"checkpoint refused: the state was taken with {self._loaded['workers']} workers, this "
                f"loader has {workers}; build the dataset from dataset.checkpoint(batch) to change "
                "num_workers"
            )
        checkpoint, offset, stride = self._start_checkpoint()
        if stride == 0:
            return None
        return self._source.open(checkpoint, share=(offset, stride))

    def __iter__(self) -> Iterator[O41Batch]:
        _, _, workers = self._worker_share()
        if self._stream is not None and self._stream_pid == os.getpid():
            self._stream.close()
        stream = self._open()
        if stream is None:
            return  # the first worker streams the rank's batches; this one has none
        self._stream, self._stream_pid = stream, os.getpid()
        try:
            # The latest switch persists: a new pass, a worker, a resumed stream all take it.
            latest, self._seen_request = self._latest_switch()
            if latest is not None and latest.due(stream.position):
                stream.advance(latest.stage, at=latest.at)
        except BaseException:
            stream.close()
            raise
        # In a DataLoader worker, batches go through the shared-memory ring so that only small
        # handles cross the DataLoader's queue (see _ring); in-process, tensors view the engine's
        # buffers directly.
        ring = _ring.worker_ring() if get_worker_info() is not None else None
        bool_fields = self._bool_fields if self._bool_as == "bool" else frozenset()
        try:
            while True:
                if self._requests is not None and self._requests[2] != self._seen_request:
                    stage, switch, self._seen_request = self._read_request()
                    stream.advance(stage, at=switch)
                batch = next(stream, None)
                if batch is None:
                    return
                self._last_position = batch.position
                arrays = batch.arrays()
                if ring is not None:
                    fields = ring.put(batch.columns, arrays, bool_fields)
                else:
                    fields = {name: _tensor(array, name in bool_fields) for name, array in arrays.items()}
                metadata = {"stage": batch.stage, "batch_index": batch.batch_index, WORKERS_KEY: workers}
                item = O41Batch(fields, **metadata, **{POSITION_KEY: self._last_position})
                # Nothing here keeps the batch alive while the consumer holds it: with the ring,
                # the engine's buffers go back as soon as they are copied, and the slot is
                # released as soon as the item's tensors are gone.
                del arrays, fields, batch
                yield item
                del item
        finally:
            stream.close()  # its counters stay readable (stats)

    @property
    def stats(self) -> StreamStats | None:
        """The :class:`StreamStats` of the stream running in this process, or None.

        Without ``DataLoader`` workers (``num_workers=0``) the stream runs in the trainer's
        process while it is iterated, so its ``consumer_wait_seconds`` is the time the training
        loop waited for data and ``loader_bound_fraction`` answers "is it the data loader?"
        directly. With workers, each worker's stream and its counters stay in that worker's
        process, and this is None in the main process: time the loop's fetches instead (the
        Lightning plugin's ``O41StatsLogger`` does both, see docs/metrics.md). A new pass
        (``iter()``) opens a new stream, whose counters start at zero. Once a pass ends, or the
        loop breaks out of it, this is the counters that stream ended with, until the next pass.
        """
        stream = self._stream
        return stream.stats if stream is not None and self._stream_pid == os.getpid() else None

    def _checkpoint_at(self, position: Position) -> Checkpoint:
        """The checkpoint at ``position`` with the curriculum switches it has not reached.

        This process's stream knows every switch it was asked for; without one (the main
        process of a loader with workers), the latest request goes into the position.
        """
        if self._stream is not None and self._stream_pid == os.getpid() and not self._stream.closed:
            return self._stream.checkpoint(position)
        return self._with_latest(self._source.checkpoint_at(position))

    def _with_latest(self, checkpoint: Checkpoint) -> Checkpoint:
        """``checkpoint`` with the latest switch this dataset placed (the engine keeps it if due)."""
        latest = self._latest_switch()[0]
        if latest is None:
            return checkpoint
        return Checkpoint.from_position(checkpoint.position.with_switch(latest.stage, latest.at), checkpoint)

    def checkpoint(self, batch: Mapping[str, Any]) -> Checkpoint:
        """The rank's position right after ``batch`` (an item this dataset yielded).

        Works in the main process whatever ``num_workers`` is; a dataset built from the result
        resumes exactly after that batch with any number of workers.
        """
        return self._checkpoint_at(batch[POSITION_KEY])

    def advance(
        self, stage: int, after: Mapping[str, Any] | None = None, *, prefetch_factor: int | None = None
    ) -> None:
        """Switches to curriculum ``stage``.

        Without workers (``num_workers=0``) the switch happens at the next batch. With workers,
        pass ``after``, the last batch the trainer consumed: each worker may already hold up to
        ``prefetch_factor`` batches (the ``DataLoader``'s, default 2), so the switch happens
        right after those, at the same global batch on every rank that calls this after the same
        batch. Persistent workers receive the request too.

        The switch is the core's :class:`SwitchPoint` (``switch_point``), and the dataset keeps
        the latest one: every stream it opens later (a new pass, a worker started later, a
        resumed stream that has not reached it) switches at the same global batch. A stage the
        stream does not have raises :class:`ConfigError`.
        """
        running = self._stream
        if running is not None and self._stream_pid == os.getpid() and get_worker_info() is None:
            point = switch_point(self._rules, running.position, stage)
            running.advance(point.stage, at=point.at)
            self._switch = point
            if self._requests is not None:
                self._seen_request = self._publish(point)  # applied already
            return
        if after is None:
            raise ConfigError(
                "advance: pass after=<the last batch the trainer consumed> when DataLoader workers "
                "produce the batches"
            )
        if self._requests is None:
            raise ConfigError("advance: this dataset copy was pickled without its worker channel")
        workers = int(after[WORKERS_KEY])
        ahead = workers * (prefetch_factor or _DEFAULT_PREFETCH_FACTOR)
        point = switch_point(self._rules, after[POSITION_KEY], stage, batches_ahead=ahead)
        self._switch = point
        self._publish(point)

    @property
    def switch(self) -> SwitchPoint | None:
        """The latest curriculum switch, which every stream the dataset opens applies; or None."""
        return self._latest_switch()[0]

    def _publish(self, point: SwitchPoint) -> int:
        """Puts ``point`` in the worker channel; its request number."""
        self._requests[0] = point.stage
        self._requests[1] = point.at
        self._requests[2] += 1
        return int(self._requests[2])

    def _latest_switch(self) -> tuple[SwitchPoint | None, int]:
        """The latest switch and its request number.

        The worker channel's when it has one, which a persistent worker sees change, else the one
        this copy was pickled with.
        """
        if self._requests is not None and self._requests[2] != 0:
            stage, at, number = self._read_request()
            return SwitchPoint(stage=stage, at=at), number
        return self._switch, 0

    def _read_request(self) -> tuple[int, int, int]:
        while True:
            number = self._requests[2]
            stage, switch = self._requests[0], self._requests[1]
            if self._requests[2] == number:
                return int(stage), int(switch), int(number)

    @staticmethod
    def _loaded_share(state: Mapping[str, Any]) -> dict[str, int]:
        """The state's ``offset``, ``stride`` and ``workers``, checked: a share a loader makes."""
        values = {}
        for key in ("offset", "stride"):
            if key not in state:
                raise CheckpointError(f"state refused: it has no {key!r}")
            values[key] = state[key]
        # States of the first releases have no "workers": their stride was the count.
        values["workers"] = state.get("workers", values["stride"])
        for key, value in values.items():
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise CheckpointError(f"state refused: its {key} is {value!r}, not a whole number")
        offset, stride, workers = values["offset"], values["stride"], values["workers"]
        # Shares a loader makes: the whole sequence (1), one of `workers` split ones, or none
        # (stride 0: a worker other than the first when the workers do not split the batches).
        idle = stride == 0 and offset == 0 and workers >= 2
        if workers < 1 or not (idle or (stride in (1, workers) and offset < stride)):
            raise CheckpointError(
                f"state refused: offset {offset}, stride {stride} with {workers} workers is not a "
                "share a DataLoader makes (stride 1 or the worker count with the offset below it, "
                "or 0 for an idle worker)"
            )
        return values

    def state_dict(self) -> dict[str, Any]:
        """The position after the last batch this process yielded.

        It is the core checkpoint JSON, plus which share of the rank's batches this worker
        resumes with and how many workers the loader had.
        """
        offset, stride, workers = self._worker_share()
        if self._last_position is not None:
            checkpoint = self._checkpoint_at(self._last_position).to_json()
            # This worker's next local batch is `stride` after the one it yielded; counted from
            # the position after that batch, it is `stride - 1` ahead.
            return {
                "version": STATE_VERSION,
                "checkpoint": checkpoint,
                "offset": stride - 1,
                "stride": stride,
                "workers": workers,
            }
        start, offset, stride = self._start_checkpoint()
        share = {"offset": offset, "stride": stride, "workers": workers}
        config = self._source.config
        if start is None and self._latest_switch()[0] is None and config is not None:
            return {"version": STATE_VERSION, "config": config.to_json(), **share}
        if start is None:
            start = self._source.at_start()
        return {"version": STATE_VERSION, "checkpoint": self._with_latest(start).to_json(), **share}

    @staticmethod
    def _legacy_switch(checkpoint: Checkpoint, switch: object) -> Checkpoint:
        """``checkpoint`` with the ``switch`` entry of a state an earlier release wrote."""
        if not isinstance(switch, (list, tuple)) or len(switch) != 2:
            raise CheckpointError(f"state refused: its switch {switch!r} is not a [stage, at] pair")
        try:
            point = SwitchPoint(stage=switch[0], at=switch[1])
        except ConfigError as error:
            raise CheckpointError(f"state refused: its switch: {error}") from None
        return Checkpoint.from_position(checkpoint.position.with_switch(point.stage, point.at), checkpoint)

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Continues from ``state`` (from :meth:`state_dict`) at the next iteration.

        The state must be this dataset's stream's (its fingerprint, or its config when it is at
        the start) and its share of the rank's batches must be one a loader produces: anything
        else raises :class:`CheckpointError` naming what is wrong, never a silent skip.
        """
        if not isinstance(state, Mapping):
            raise CheckpointError(f"state refused: expected the mapping state_dict() returns, got {state!r}")
        if state.get("version") != STATE_VERSION:
            raise CheckpointError(
                f"state refused: version {state.get('version')!r}, expected {STATE_VERSION}"
            )
        share = self._loaded_share(state)
        if "checkpoint" in state:
            if not isinstance(state["checkpoint"], str):
                raise CheckpointError("state refused: its checkpoint is not checkpoint JSON text")
            # The core's rules: this stream, this rank; the config's skip_batches apply from here on.
            checkpoint = self._source.accept(Checkpoint.from_json(state["checkpoint"]), "dataset")
        else:
            if "config" not in state:
                raise CheckpointError("state refused: it has neither a 'checkpoint' nor a 'config'")
            config = self._source.config
            if config is None or state["config"] != config.to_json():
                raise CheckpointError(
                    "state refused: it is the start of another stream than this dataset's "
                    "(its config differs)"
                )
            checkpoint = None
        if state.get("switch") is not None:
            # Earlier releases kept a pending switch beside the checkpoint; it is the position's now.
            checkpoint = self._legacy_switch(checkpoint or self._source.at_start(), state["switch"])
        self._loaded = None
        if checkpoint is not None:
            self._loaded = {"checkpoint": checkpoint, **share}
        self._last_position = None
