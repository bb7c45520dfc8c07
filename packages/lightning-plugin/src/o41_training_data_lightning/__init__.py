"""o41-training-data Lightning plugin: ``Trainer.fit(model, datamodule=O41DataModule(...))``.

:class:`O41DataModule` streams a core batch stream through the PyTorch adapter on every rank,
and makes ``trainer.fit(ckpt_path=...)`` resume each rank exactly where its training step left
off: every rank's position goes into the model checkpoint (Lightning writes rank 0's only, so
they are gathered), and each rank's core checkpoint is written beside it in
``<name>.ckpt.o41/stream-rank{r}-of-{n}.json``. :class:`O41Curriculum` switches curriculum
stages at given global steps. :class:`O41StatsLogger` reports the loader's stats every N steps
(docs/metrics.md). See docs/lightning.md.

Examples:
    >>> from lightning.pytorch import Trainer
    >>> from o41_training_data_lightning import O41DataModule
    >>> trainer = Trainer(max_steps=1000)  # doctest: +SKIP
    >>> trainer.fit(model, datamodule=O41DataModule(config))  # doctest: +SKIP

"""

from o41_training_data import __version__ as core_version
from o41_training_data import rank_file_name as rank_file  # the sidecars' names are the core's

from ._curriculum import O41Curriculum
from ._datamodule import FORMAT, STATE_VERSION, O41DataModule
from ._sidecar import INDEX_FILE, SIDECAR_SUFFIX, SidecarCheckpointIO, sidecar_directory
from ._stats import O41StatsLogger

__all__ = [
    "FORMAT",
    "INDEX_FILE",
    "SIDECAR_SUFFIX",
    "STATE_VERSION",
    "O41Curriculum",
    "O41DataModule",
    "O41StatsLogger",
    "SidecarCheckpointIO",
    "core_version",
    "rank_file",
    "sidecar_directory",
]
