"""``O41Curriculum``: curriculum stage switches at given global steps, on every rank."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from lightning.pytorch import Callback, LightningModule, Trainer
from o41_training_data import ConfigError

from ._datamodule import O41DataModule


class O41Curriculum(Callback):
    """Advances an :class:`O41DataModule` to a curriculum stage at given global steps.

    ``schedule`` maps a global step to a stage: when the trainer starts a batch at that global
    step, every rank calls ``datamodule.advance(stage)``. The global step is the same on every
    rank, so they all switch at the same batch. Lightning has already fetched the next batch by
    then, so the new stage starts with the batch after it: with ``accumulate_grad_batches=1``,
    the batch trained at global step ``step + 2`` (schedule ``step - 2`` to switch at ``step``).
    The request is part of the datamodule's state, so a resume from any checkpoint switches at
    the same batch. To start a run in another stage, call ``datamodule.advance(stage)`` before
    ``trainer.fit``.

    Examples:
        >>> trainer = Trainer(callbacks=[O41Curriculum({10_000: 1, 50_000: 2})])  # doctest: +SKIP

    """

    def __init__(self, schedule: Mapping[int, int]) -> None:
        if not isinstance(schedule, Mapping):
            raise ConfigError(
                f"schedule: expected a mapping of global step to stage, got {type(schedule).__name__}"
            )
        for step, stage in schedule.items():
            if type(step) is not int or step < 0 or type(stage) is not int or stage < 0:
                raise ConfigError(
                    f"schedule: {step!r}: {stage!r} is not a global step (int >= 0) and a stage (int >= 0)"
                )
        self._schedule = dict(schedule)

    @property
    def schedule(self) -> dict[int, int]:
        """The global step at which each switch is requested, and its stage."""
        return dict(self._schedule)

    def on_train_batch_start(
        self, trainer: Trainer, pl_module: LightningModule, batch: Any, batch_idx: int
    ) -> None:
        """Requests the switch scheduled at the current global step, if any."""
        stage = self._schedule.get(trainer.global_step)
        if stage is None:
            return
        datamodule = trainer.datamodule  # type: ignore[attr-defined]  # set by Trainer, undeclared
        if not isinstance(datamodule, O41DataModule):
            raise ConfigError(
                "O41Curriculum: the trainer's datamodule is "
                f"{type(datamodule).__name__ if datamodule is not None else 'None'}; use "
                "trainer.fit(model, datamodule=O41DataModule(...))"
            )
        datamodule.advance(stage)
