"""``O41DataModule``: a ``LightningDataModule`` whose resume is exact on every rank."""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from typing import Any, Literal

import torch
from lightning.pytorch import LightningDataModule, Trainer
from lightning.pytorch.utilities.model_helpers import is_overridden
from lightning.pytorch.utilities.signature_utils import is_param_in_hook_signature
from o41_training_data import (
    RUN_STATE_FORMAT,
    RUN_STATE_VERSION,
    BatchStreamConfig,
    Checkpoint,
    CheckpointError,
    ConfigError,
    Position,
    RankStream,
    RunState,
    StreamStats,
    SwitchPoint,
    TrainingData,
    check_adapter_options,
    process_ranks,
    switch_point,
)
from o41_training_data_torch import POSITION_KEY, O41Batch, O41IterableDataset
from torch.utils.data import DataLoader

from . import _sidecar

FORMAT = RUN_STATE_FORMAT
"""The ``format`` marker of the state (the core's ``RunState``) and of the sidecar index."""
STATE_VERSION = RUN_STATE_VERSION
"""Version of the state ``O41DataModule.state_dict()`` returns and of the sidecar index."""

# What Lightning's own loader state holds for the train loader (see _TrainLoader.state_dict).
_LOADER_STATE = {"format": FORMAT, "version": STATE_VERSION, "positions": "in the O41DataModule state"}


class _TrainLoader:
    """What ``train_dataloader()`` returns: a new pass over the rank's stream at each ``iter()``.

    Each pass continues right after the last batch a training step consumed, so an epoch cut
    short (``limit_train_batches``, ``max_steps``) loses nothing and the batch Lightning had
    fetched ahead is delivered again. A pass that would start at the end of a finite stream
    starts over from the config instead, as a new pass over a ``DataLoader`` does.

    It is not a ``DataLoader``, so Lightning does not advise more workers for it (the engine
    decodes on its own threads; see docs/torch.md). It is stateful in Lightning's sense, so a
    mid-epoch resume counts as resumable, but what Lightning saves for it is a constant: rank
    0's loader state goes to every rank, so the positions travel in the datamodule's state.
    """

    def __init__(self, module: O41DataModule) -> None:
        self._module = module
        self.delivered = False  # whether any pass handed Lightning a batch
        self.checked_resume = False

    def __iter__(self) -> Iterator[O41Batch]:
        return self._module._passes(self)

    def state_dict(self) -> dict[str, Any]:
        """A constant: the positions are in the datamodule's state, rank by rank."""
        return dict(_LOADER_STATE)

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Ignores the state: the datamodule's ``load_state_dict`` restored this rank's position."""


class _EvalLoader:
    """What ``val_dataloader()`` returns: the whole finite validation stream at each ``iter()``."""

    def __init__(self, loader: DataLoader[O41Batch]) -> None:
        self._loader = loader

    def __iter__(self) -> Iterator[O41Batch]:
        # A generator, so that Lightning's iterability check starts no stream and no worker.
        yield from self._loader


def _checkpoint_step(trainer: Trainer) -> int:
    """The global step of the checkpoint the trainer is restoring.

    While Lightning restores (a train loader set up from ``configure_optimizers``), its loops
    are not restored yet but the loaded checkpoint is at hand; afterwards the loops hold it.
    """
    connector = getattr(trainer, "_checkpoint_connector", None)
    loaded = getattr(connector, "_loaded_checkpoint", None)
    if isinstance(loaded, Mapping) and isinstance(loaded.get("global_step"), int):
        return int(loaded["global_step"])
    return int(trainer.global_step)


class O41DataModule(LightningDataModule):
    """A ``LightningDataModule`` over an o41 batch stream: ``Trainer.fit(model, datamodule=...)``.

    ``train_dataloader()`` streams ``config`` with the PyTorch adapter, each rank its own share
    (the trainer's rank and world size). ``val_config``, when given, must be finite: each
    validation run reads all of it. Every item is one whole batch (an ``O41Batch``: a dict of
    tensors plus ``stage``, ``batch_index`` and the position).

    With ``val_config.validation_pass=True`` each validation run scores every row exactly once
    over the ranks: the final round is padded instead of dropped and each batch carries a
    ``valid`` bool tensor to mask the padding with. A ramped training stage
    (``Stage(ramp=...)``) yields its growing batches as they come.

    Resume is exact: ``state_dict()`` gathers every rank's position after the last batch its
    training step consumed into the model checkpoint, and ``trainer.fit(ckpt_path=...)`` puts
    each rank back at its own (or, on another number of ranks, moves them, when every rank
    stopped at the same place). Each rank's core checkpoint is also written beside the model
    checkpoint, in ``<name>.ckpt.o41/``. See docs/lightning.md.

    ``num_workers`` defaults to 0: the engine decodes on its own threads, and ``DataLoader``
    workers only add copies (0.62x of the core stream's speed, measured).

    Examples:
        >>> datamodule = O41DataModule(config, val_config=val_config)  # doctest: +SKIP
        >>> checkpoints = ModelCheckpoint(every_n_train_steps=100, save_last=True)  # doctest: +SKIP
        >>> trainer = Trainer(max_steps=1000, callbacks=[checkpoints])  # doctest: +SKIP
        >>> trainer.fit(model, datamodule=datamodule)  # doctest: +SKIP
        >>> trainer.fit(model, datamodule=datamodule, ckpt_path="last")  # after a restart  # doctest: +SKIP

    """

    def __init__(
        self,
        config: BatchStreamConfig,
        training_data: TrainingData | None = None,
        val_config: BatchStreamConfig | None = None,
        *,
        num_workers: int = 0,
        bool_as: Literal["bool", "uint8"] = "bool",
    ) -> None:
        super().__init__()
        if not isinstance(config, BatchStreamConfig):
            raise ConfigError(f"config: expected a BatchStreamConfig, got {type(config).__name__}")
        check_adapter_options(training_data, bool_as)
        if val_config is not None:
            if not isinstance(val_config, BatchStreamConfig):
                raise ConfigError(
                    f"val_config: expected a BatchStreamConfig, got {type(val_config).__name__}"
                )
            for i, stage in enumerate(val_config.stages):
                if stage.infinite:
                    raise ConfigError(
                        f"val_config.stages[{i}].infinite is True; a validation stream must end"
                    )
        if type(num_workers) is not int or num_workers < 0:
            raise ConfigError(f"num_workers: expected an int >= 0, got {num_workers!r}")
        self._config = config
        self._training_data = training_data
        self._val_config = val_config
        self._num_workers = num_workers
        self._bool_as: Literal["bool", "uint8"] = bool_as
        # After the last batch a training step consumed, with the switches it has not reached.
        self._consumed: Position | None = None
        self._anchor: Checkpoint | None = None  # any checkpoint of the stream: its pinned resolved config
        # Switches requested since the running pass started: batches it handed out before a
        # request do not carry it, so the consumed position takes it from here.
        self._requested: list[SwitchPoint] = []
        # (pass, the position after the last batch it handed to Lightning): where a switch lands.
        self._handed: tuple[object, Position | None] | None = None
        self._loader: _TrainLoader | None = None
        self._restored_from: Any = None  # the ckpt_path whose state this rank resumed from
        self._train_dataset: O41IterableDataset | None = None  # the running pass's, for stats
        if val_config is not None:
            # Only a datamodule with a validation stream may look as if it overrides the hook:
            # Lightning warns about a val_dataloader without a validation_step.
            self.val_dataloader = self._val_dataloader  # type: ignore[method-assign]

    @property
    def stream_stats(self) -> StreamStats | None:
        """The training stream's :class:`StreamStats` in this process, or None.

        Available from a training pass's first batch with ``num_workers=0`` (the default), and
        after the pass its last counters stay until the next one; with ``DataLoader`` workers
        the engine's counters stay in the workers (see ``O41IterableDataset.stats``). Each pass
        opens a new stream whose counters start at zero; a curriculum switch starts a new pass.
        """
        dataset = self._train_dataset
        return dataset.stats if dataset is not None else None

    @property
    def config(self) -> BatchStreamConfig:
        """The training stream's config."""
        return self._config

    @property
    def val_config(self) -> BatchStreamConfig | None:
        """The validation stream's config, if any."""
        return self._val_config

    # -- Lightning's hooks.

    def train_dataloader(self) -> Iterable[O41Batch]:
        """The training batches of this rank: an iterable that starts a new pass at each ``iter()``.

        Under a trainer it also installs the ``CheckpointIO`` wrapper that writes the stream
        checkpoints beside each model checkpoint, and, when the trainer resumes from a
        checkpoint that carries no ``O41DataModule`` state, restores from those files.
        """
        trainer = self.trainer
        if trainer is not None:
            model = trainer.lightning_module
            if is_param_in_hook_signature(model.training_step, "dataloader_iter", explicit=True):
                raise ConfigError(
                    "O41DataModule: training_step(dataloader_iter) fetches batches out of Lightning's "
                    "sight, so the position of the batch a step consumed is unknown; take the batch "
                    "argument instead"
                )
            _sidecar.install(trainer.strategy)
            ckpt_path = trainer.ckpt_path
            if ckpt_path and ckpt_path != self._restored_from:
                rank, world_size = self._rank_world()
                step = _checkpoint_step(trainer)
                start = _sidecar.read_sidecars(ckpt_path, rank, world_size, step)
                self._restore(start, f"the sidecars of {ckpt_path}")
                self._restored_from = ckpt_path
        self._loader = _TrainLoader(self)
        return self._loader

    def _val_dataloader(self) -> Iterable[O41Batch]:
        assert self._val_config is not None
        dataset = O41IterableDataset(
            self._rank_stream(self._val_config).origin, self._training_data, bool_as=self._bool_as
        )
        return _EvalLoader(DataLoader(dataset, batch_size=None, num_workers=self._num_workers))

    def on_before_batch_transfer(self, batch: Any, dataloader_idx: int) -> Any:
        """Records the position of the batch a training step is about to consume.

        Lightning fetches one batch ahead of the step, so the last batch fetched is not the
        last one consumed; this hook sees the consumed one. A ``LightningModule`` that
        overrides this hook too has its own called after (Lightning calls only this one and
        warns about it).
        """
        trainer = self.trainer
        if trainer is not None and trainer.training and isinstance(batch, Mapping):
            position = batch.get(POSITION_KEY)
            if isinstance(position, Position):
                self._consumed_batch(position)
        model = trainer.lightning_module if trainer is not None else None
        if model is not None and is_overridden("on_before_batch_transfer", model):
            return model.on_before_batch_transfer(batch, dataloader_idx)
        return batch

    def state_dict(self) -> dict[str, Any]:
        """Every rank's position (and pending curriculum switches), for the model checkpoint.

        Lightning calls this on every rank and writes rank 0's result only, so the ranks'
        entries are gathered here with ``torch.distributed.all_gather_object``: call it on every
        rank at once, as ``trainer.save_checkpoint`` requires anyway.
        """
        _, world_size = self._rank_world()
        mine = self._consumed.to_json() if self._consumed is not None else None
        positions = [Position.from_json(p) if p is not None else None for p in self._gather(mine, world_size)]
        resolved: Checkpoint | dict[str, Any] | None = self._anchor
        if resolved is None and any(p is not None for p in positions):
            resolved = self._rank_stream().document()  # this rank has not started
        return RunState(world_size, resolved, positions).to_dict()

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Puts this rank back at its own position from ``state_dict`` (see :meth:`state_dict`).

        Raises :class:`CheckpointError` when the state is of another version or stream, or was
        written by another number of ranks that did not all stop at the same place.
        """
        trainer = self.trainer
        ckpt_path = trainer.ckpt_path if trainer is not None else None
        source = f"the checkpoint {ckpt_path}" if ckpt_path else "the O41DataModule state"
        rank, world_size = self._rank_world()
        self._restore(RunState.from_dict(state_dict, source).checkpoint_for(rank, world_size, source), source)
        self._restored_from = ckpt_path

    # -- Curriculum and positions.

    def advance(self, stage: int) -> None:
        """Switches the training stream to curriculum ``stage``, on this rank.

        The new stage starts with the first batch not yet handed to Lightning: Lightning
        fetches one batch ahead, so called during a training step, the step after the next one
        trains on the first batch of ``stage``. Call it on every rank at the same step (as
        :class:`O41Curriculum` does); the switch is part of the state, so a resume from a
        checkpoint taken in between switches at the same batch. Switching to the stage already
        in effect (or requested) does nothing. The switch is the core's (``switch_point``, kept in
        the position as ``Position.switches``); in a partitioned stream the engine moves it to the
        first round where every partition has read the same rows (docs/order.md).
        """
        handed = self._handed[1] if self._handed is not None else None
        consumed = self._consumed or self._start_checkpoint().position
        # The core's switch point: the round after the last batch handed out, on every rank.
        point = switch_point(self._anchor or self._rank_stream().rules, handed or consumed, stage)
        self._consumed = consumed.with_switch(point.stage, point.at)
        if self._handed is not None and handed is not None:
            placed = handed.with_switch(point.stage, point.at)
            if placed.switches != handed.switches:  # not the stage already in effect there
                self._requested.append(point)
                self._handed = (self._handed[0], placed)

    def checkpoint(self) -> Checkpoint | None:
        """The rank's stream checkpoint after the last batch a training step consumed.

        ``None`` while the rank is at the beginning of the config.
        """
        if self._consumed is None:
            return None
        assert self._anchor is not None
        return Checkpoint.from_position(self._consumed, self._anchor)

    def _start_checkpoint(self) -> Checkpoint:
        """The checkpoint at the config's beginning, which becomes the anchor when there is none."""
        if self._anchor is None:
            self._anchor = self._rank_stream().at_start()
        return Checkpoint.at_start(self._anchor)

    # -- Internals.

    def _rank_world(self) -> tuple[int, int]:
        trainer = self.trainer
        if trainer is not None:
            return trainer.global_rank, trainer.world_size
        # Outside a trainer, the core's rule: torch.distributed, then RANK and WORLD_SIZE.
        return process_ranks()

    def _rank_stream(self, config: BatchStreamConfig | None = None) -> RankStream:
        """The training stream of this rank (or ``config``'s) under the core's rules, trainer's ranks."""
        ranks = self._rank_world()
        config = config if config is not None else self._config
        return RankStream(config, self._training_data, ranks=ranks, decided_by="the trainer")

    def _gather(self, mine: str | None, world_size: int) -> list[str | None]:
        if world_size == 1:
            return [mine]
        if not (torch.distributed.is_available() and torch.distributed.is_initialized()):
            raise ConfigError(
                f"O41DataModule.state_dict: the run has {world_size} ranks but torch.distributed "
                "is not initialised, so their positions cannot be gathered"
            )
        entries: list[Any] = [None] * world_size
        torch.distributed.all_gather_object(entries, mine)
        return entries

    def _restore(self, start: Checkpoint | None, source: str) -> None:
        trainer = self.trainer
        loader = self._loader
        if (
            loader is not None
            and loader.delivered
            and trainer is not None
            and trainer.train_dataloader is loader
        ):
            raise CheckpointError(
                f"checkpoint refused: {source} arrived after this fit's train loader had started "
                "(a strategy that restores after setup, with trainer.estimated_stepping_batches "
                "read in configure_optimizers, fetches a batch first); set max_steps and leave "
                "max_epochs unset, or read it after the restore"
            )
        if start is not None:
            # The core's rules: this stream, this rank; the config's skip_batches become the stream's.
            start = self._rank_stream().accept(start, "datamodule")
        self._consumed = start.position if start is not None else None
        self._anchor = start
        self._requested = []

    def _consumed_batch(self, position: Position) -> None:
        loader, trainer = self._loader, self.trainer
        if loader is not None and not loader.checked_resume and trainer is not None:
            loader.checked_resume = True
            if trainer.ckpt_path and trainer.ckpt_path != self._restored_from:
                raise CheckpointError(
                    f"checkpoint refused: the trainer resumed from {trainer.ckpt_path}, but this rank's "
                    "stream position was not restored before training started"
                )
        # A batch handed out before a request does not carry it: the engine places it.
        self._requested = [point for point in self._requested if point.due(position)]
        for point in self._requested:
            position = position.with_switch(point.stage, point.at)
        self._consumed = position

    def _passes(self, loader: _TrainLoader) -> Iterator[O41Batch]:
        token = object()
        start = self.checkpoint()
        restarted = False
        self._requested = []  # the start holds them
        try:
            while True:
                # A pass starts at a checkpoint holding every switch requested so far: its stream
                # (or each worker's) applies them (the engine's rule), so no stream of our own.
                self._handed = (token, start.position if start is not None else None)
                source = start if start is not None else self._rank_stream().origin
                dataset = O41IterableDataset(source, self._training_data, bool_as=self._bool_as)
                self._train_dataset = dataset
                batches = iter(DataLoader(dataset, batch_size=None, num_workers=self._num_workers))
                delivered = 0
                switched: Position | None = None
                try:
                    for batch in batches:
                        if self._anchor is None:
                            self._anchor = dataset.checkpoint(batch)
                        delivered += 1
                        loader.delivered = True
                        handed = (token, batch[POSITION_KEY])
                        self._handed = handed
                        yield batch
                        if self._handed is not handed:  # advance() placed a switch after this batch
                            switched = self._handed[1]
                            break
                finally:
                    # Stop the workers and the engine now, not whenever the iterator is collected.
                    del batches
                if switched is not None:
                    assert self._anchor is not None
                    start = Checkpoint.from_position(switched, self._anchor)
                    continue
                if delivered == 0 and start is not None and not restarted:
                    # The pass began where a finite stream ends: start over, and a switch
                    # requested for the next batch applies to the first one.
                    restarted, self._requested = True, []
                    pending = start.position.switches[-1:]
                    start = None
                    if pending:
                        beginning = self._start_checkpoint()
                        start = Checkpoint.from_position(
                            beginning.position.with_switch(pending[0][0], 0), beginning
                        )
                    continue
                return
        finally:
            if self._handed is not None and self._handed[0] is token:
                self._handed = None
