"""``RankStream``: the stream one rank of an adapter reads, with every rule that decides it (docs/rules.md).

An adapter starts a rank's stream from a config or resumes it from a checkpoint, and later takes
checkpoints and accepts states for it. The rules are the same in every framework: the rank and
world size the launcher (or the framework) decided, refused when the config or checkpoint says
otherwise; the stream's resolved document, resolved once; whether a checkpoint belongs to the
stream and the rank; a config's ``skip_batches`` applied to a resumed stream. They are applied here
once, so the PyTorch, JAX and Lightning adapters (and yours) keep only their framework's glue.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any

from ._core import Checkpoint, Position
from ._errors import ConfigError
from ._rules import (
    StreamRules,
    check_adapter_options,
    check_stream_of,
    observed_ranks,
    process_ranks,
    resume_point,
    with_ranks,
)

if TYPE_CHECKING:
    from ._config import BatchStreamConfig
    from ._storage import StorageConfig
    from ._stream import BatchStream
    from ._training_data import TrainingData

__all__ = ["RankStream"]


class RankStream:
    """The stream one rank reads: a config to start from or a checkpoint to resume, and its rules.

    ``ranks`` is the ``(rank, world_size)`` the framework decided (the trainer's, the sharding's),
    named by ``decided_by`` in a refusal; without it the core's rule applies
    (:func:`process_ranks`: ``torch.distributed``, the config, ``RANK``/``WORLD_SIZE``). A config
    or checkpoint that names another rank or world size is refused. Pickles without credentials
    (the :class:`StorageConfig` rule), so a ``DataLoader`` worker can receive it.

    Examples:
        >>> source = RankStream(config, ranks=(trainer.global_rank, trainer.world_size))  # doctest: +SKIP
        >>> stream = source.open()  # doctest: +SKIP
        >>> later = source.accept(checkpoint, "datamodule")  # doctest: +SKIP

    """

    def __init__(
        self,
        source: BatchStreamConfig | Checkpoint,
        training_data: TrainingData | None = None,
        *,
        ranks: tuple[int, int] | None = None,
        decided_by: str = "the launcher",
    ) -> None:
        from ._config import BatchStreamConfig

        check_adapter_options(training_data)
        self.storage: StorageConfig | None = training_data.storage_config if training_data else None
        """The storage every stream of this rank reads through."""
        self.config: BatchStreamConfig | None = None
        """The config, placed at the rank (None when the rank resumes a checkpoint)."""
        self.start: Checkpoint | None = None
        """The checkpoint the rank resumes from (None when it starts from the config)."""
        if isinstance(source, Checkpoint):
            decided = ranks if ranks is not None else observed_ranks()
            if decided is not None:
                source.check(rank=decided[0], world_size=decided[1])
            self.start = source
        elif isinstance(source, BatchStreamConfig):
            if ranks is None:
                rank, world_size = process_ranks((source.rank, source.world_size))
                self.config = dataclasses.replace(source, rank=rank, world_size=world_size)
            else:
                self.config = with_ranks(source, ranks, decided_by)
        else:
            raise ConfigError(
                f"source: expected a BatchStreamConfig or a Checkpoint, got {type(source).__name__}"
            )
        self._resolved: dict[str, Any] | None = None
        self._rules: StreamRules | None = None

    @property
    def rank(self) -> int:
        """The rank whose batches the stream delivers."""
        return self.config.rank if self.config is not None else self._checkpoint.rank

    @property
    def world_size(self) -> int:
        """The number of ranks sharing the global batch sequence."""
        return self.config.world_size if self.config is not None else self._checkpoint.world_size

    @property
    def origin(self) -> BatchStreamConfig | Checkpoint:
        """Where the rank's stream starts: the checkpoint it resumes, else the config at its rank."""
        return self.start if self.start is not None else self._config

    @property
    def _config(self) -> BatchStreamConfig:
        assert self.config is not None
        return self.config

    @property
    def _checkpoint(self) -> Checkpoint:
        assert self.start is not None
        return self.start

    @property
    def rules(self) -> StreamRules:
        """The stream's delivered fields and batch shapes (:class:`StreamRules`), read once."""
        if self._rules is None:
            self._rules = StreamRules.of(self.config if self.config is not None else self._checkpoint)
        return self._rules

    def document(self) -> Checkpoint | dict[str, Any]:
        """The stream's resolved document: the start checkpoint's, or the config's, resolved once."""
        if self.start is not None:
            return self.start
        if self._resolved is None:
            from ._stream import resolve_batch_stream_config

            assert self.config is not None
            self._resolved = resolve_batch_stream_config(self.config, storage=self.storage)
        return self._resolved

    def checkpoint_at(self, position: Position) -> Checkpoint:
        """The checkpoint at ``position`` of this stream (a batch's, from any process)."""
        return Checkpoint.from_position(position, self.document())

    def at_start(self) -> Checkpoint:
        """The checkpoint where this rank's stream starts (the config's beginning, or the start)."""
        return Checkpoint.at_start(self.document())

    def accept(self, checkpoint: Checkpoint, reader: str, *, fingerprint: str | None = None) -> Checkpoint:
        """``checkpoint`` checked for this rank's stream, as a stream resumes it.

        It must be of this stream (against the config, else the start's ``fingerprint`` or the
        given one; ``reader`` names the adapter in the refusal) and of this rank and world size;
        the config's ``skip_batches`` become its own (:func:`resume_point`).
        """
        if fingerprint is None and self.start is not None:
            fingerprint = self.start.fingerprint
        check_stream_of(checkpoint, self.config, fingerprint, reader)
        checkpoint.check(rank=self.rank, world_size=self.world_size)
        return resume_point(checkpoint, self.config)

    def open(self, checkpoint: Checkpoint | None = None, *, share: tuple[int, int] = (0, 1)) -> BatchStream:
        """A stream from ``checkpoint`` (accepted already), else from the start or the config."""
        from ._stream import open_batch_stream, resume_batch_stream

        start = checkpoint if checkpoint is not None else self.start
        if start is not None:
            return resume_batch_stream(start, share=share, storage=self.storage)
        assert self.config is not None
        return open_batch_stream(self.config, share=share, storage=self.storage)
