"""``O41StatsLogger``: the data loader's stats, written to the trainer's loggers every N steps."""

from __future__ import annotations

import time
from typing import Any

from lightning.pytorch import Callback, LightningModule, Trainer
from o41_training_data import ConfigError, StreamStats

from ._datamodule import O41DataModule


class O41StatsLogger(Callback):
    """Logs "is it the data loader?" figures every ``every_n_steps`` training batches.

    Two views, for the window of batches since the last report:

    - the trainer's: ``<prefix>fetch_seconds``, the time between one batch's
      ``on_train_batch_end`` and the next one's ``on_train_batch_start`` (fetching the batch
      and moving it to the device), ``<prefix>step_seconds``, the time between those two hooks
      of one batch (forward, backward, optimizer), and their ratio
      ``<prefix>fetch_fraction = fetch / (fetch + step)``. It works with any dataloader and any
      ``num_workers``.
    - the engine's, when the trainer's datamodule is an :class:`O41DataModule` whose stream runs
      in this process (``num_workers=0``): :meth:`StreamStats.scalars` of the window, among them
      ``<prefix>loader_bound_fraction``, rows and bytes read per source, retries by cause and
      decode time by format.

    Each report goes to every logger of the trainer (``logger.log_metrics(metrics,
    step=trainer.global_step)``; Lightning's loggers write on rank 0) and is kept in
    :attr:`last_metrics`.

    Examples:
        >>> trainer = Trainer(callbacks=[O41StatsLogger(every_n_steps=100)])  # doctest: +SKIP
        >>> trainer.fit(model, datamodule=O41DataModule(config))  # doctest: +SKIP

    """

    def __init__(self, every_n_steps: int = 50, prefix: str = "o41/") -> None:
        if type(every_n_steps) is not int or every_n_steps < 1:
            raise ConfigError(f"every_n_steps: expected an int >= 1, got {every_n_steps!r}")
        if not isinstance(prefix, str):
            raise ConfigError(f"prefix: expected a str, got {type(prefix).__name__}")
        self._every = every_n_steps
        self._prefix = prefix
        self._batches = 0
        self._fetch = 0.0
        self._step = 0.0
        self._started: float | None = None
        self._ended: float | None = None
        self._previous: StreamStats | None = None
        self.last_metrics: dict[str, float] = {}
        """The most recent report's figures."""

    @property
    def every_n_steps(self) -> int:
        """Training batches between reports."""
        return self._every

    def on_train_epoch_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        """The time before an epoch's first batch (loader start-up) is not a fetch."""
        self._ended = None

    def on_train_batch_start(
        self, trainer: Trainer, pl_module: LightningModule, batch: Any, batch_idx: int
    ) -> None:
        """Ends the fetch of this batch, starts its step."""
        now = time.perf_counter()
        if self._ended is not None:
            self._fetch += now - self._ended
        self._started = now

    def on_train_batch_end(
        self, trainer: Trainer, pl_module: LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        """Ends this batch's step; reports every ``every_n_steps`` batches."""
        now = time.perf_counter()
        if self._started is not None:
            self._step += now - self._started
        self._ended = now
        self._batches += 1
        if self._batches % self._every == 0:
            self._report(trainer)

    def _report(self, trainer: Trainer) -> None:
        p = self._prefix
        total = self._fetch + self._step
        metrics = {
            f"{p}fetch_seconds": self._fetch,
            f"{p}step_seconds": self._step,
            f"{p}fetch_fraction": self._fetch / total if total > 0 else 0.0,
        }
        self._fetch = self._step = 0.0
        datamodule = getattr(trainer, "datamodule", None)
        stats = datamodule.stream_stats if isinstance(datamodule, O41DataModule) else None
        if stats is not None:
            previous = self._previous
            # A new pass or a curriculum switch opened a new stream, whose counters restarted.
            fresh = (
                previous is None
                or stats.batches_delivered < previous.batches_delivered
                or len(stats.sources) != len(previous.sources)
            )
            window = stats if fresh or previous is None else stats.since(previous)
            self._previous = stats
            metrics.update(window.scalars(p))
        self.last_metrics = metrics
        for logger in trainer.loggers:
            logger.log_metrics(metrics, step=trainer.global_step)
