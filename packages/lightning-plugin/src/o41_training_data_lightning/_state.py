"""The datamodule's state: every rank's stream position, as recorded in the model checkpoint.

Lightning writes rank 0's checkpoint dict only and hands that same dict to every rank on resume,
so the state holds every rank's position (gathered when it is taken) and each rank picks its own
when it is loaded. It is plain JSON-compatible data (strings, ints, lists), so it loads under
``torch.load(weights_only=True)``:

```text
{"format": "o41-training-data-lightning", "version": 2, "world_size": 2,
 "resolved": "<the stream's resolved config, JSON>",
 "ranks": [{"position": "<Position JSON>" | null}, ...]}
```

A ``position`` is the rank's place after the last batch a training step consumed (``null``: the
beginning of the config), with the curriculum switches requested and not reached yet: they are
the core's (``Position.switches``, counted in global batches), so a state moves to another world
and to another adapter as the core moves positions. Version 1 states, which kept each rank's
switches beside its position counted in its own batches, are still read.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

from o41_training_data import (
    BatchStreamConfig,
    Checkpoint,
    CheckpointError,
    Position,
    StreamRules,
    move_to_world,
    resume_point,
    switch_point,
)

FORMAT = "o41-training-data-lightning"
"""The ``format`` marker of the state (and of the sidecar index), so it is found among other keys."""
STATE_VERSION = 2
"""Version of the state ``O41DataModule.state_dict()`` returns and of the sidecar index."""
READ_VERSIONS = (1, 2)
"""The versions this plugin reads: version 1 kept pending switches beside each position."""


@dataclasses.dataclass(frozen=True)
class StreamState:
    """Every rank's position, the world size that wrote them and the stream's resolved config."""

    world_size: int
    resolved: str | None
    positions: tuple[Position | None, ...]

    def to_dict(self) -> dict[str, Any]:
        """The state as ``O41DataModule.state_dict()`` returns it."""
        return {
            "format": FORMAT,
            "version": STATE_VERSION,
            "world_size": self.world_size,
            "resolved": self.resolved,
            "ranks": [{"position": p.to_json() if p is not None else None} for p in self.positions],
        }

    @staticmethod
    def from_dict(state: Any, source: str) -> StreamState:
        """Reads and checks a state; ``source`` names where it came from in errors."""
        world_size, ranks, version = read_header(state, source)
        resolved = state.get("resolved")
        if resolved is not None and not isinstance(resolved, str):
            raise CheckpointError(f"checkpoint refused: {source}: resolved is not JSON text")
        positions = []
        for rank, entry in enumerate(ranks):
            where = f"{source}: ranks[{rank}]"
            text = entry.get("position")
            if text is not None and not isinstance(text, str):
                raise CheckpointError(f"checkpoint refused: {where}.position is not JSON text")
            position = Position.from_json(text) if text is not None else None
            if position is not None and (position.rank, position.world_size) != (rank, world_size):
                raise CheckpointError(
                    f"checkpoint refused: {where} holds the position of rank {position.rank} of "
                    f"{position.world_size}"
                )
            positions.append(position)
        if resolved is None and any(position is not None for position in positions):
            raise CheckpointError(f"checkpoint refused: {source}: positions without the resolved config")
        read = StreamState(world_size=world_size, resolved=resolved, positions=tuple(positions))
        if version == 1:
            legacy = [read_legacy_switches(entry, f"{source}: ranks[{r}]") for r, entry in enumerate(ranks)]
            return read.with_legacy_switches(legacy, source)
        return read

    def with_legacy_switches(self, switches: Sequence[Sequence[tuple[int, int]]], source: str) -> StreamState:
        """The state with version 1's per-rank ``switches`` moved into the positions.

        Version 1 counted a switch in the rank's own batches (``[stage, batches_yielded]``): the
        core's ``switch_point`` turns the batches ahead of the position into a global batch.
        """
        if not any(switches):
            return self
        if self.resolved is None:
            raise CheckpointError(
                f"checkpoint refused: {source}: a version-1 state whose ranks had not started "
                "holds a curriculum switch but no resolved config to place it in; call advance() "
                "again before trainer.fit"
            )
        start = Checkpoint.at_start(self.resolved)  # the document, parsed once
        rules = StreamRules.of(start)
        positions = []
        for rank, (position, pending) in enumerate(zip(self.positions, switches, strict=True)):
            for stage, at in pending:
                if position is None:
                    position = start.for_world(rank, self.world_size).position
                ahead = at - position.batches_yielded
                if ahead >= 0:
                    point = switch_point(rules, position, stage, batches_ahead=ahead)
                    position = position.with_switch(point.stage, point.at)
            positions.append(position)
        return dataclasses.replace(self, positions=tuple(positions))

    def checkpoint(self, rank: int) -> Checkpoint | None:
        """Rank ``rank``'s stream checkpoint, or ``None`` when it is at the config's beginning."""
        position = self.positions[rank]
        if position is None:
            return None
        assert self.resolved is not None  # from_dict and the datamodule guarantee it
        return Checkpoint.from_position(position, self.resolved)

    def checkpoint_for(self, rank: int, world_size: int, source: str) -> Checkpoint | None:
        """Where rank ``rank`` of ``world_size`` resumes (``None``: the config's beginning).

        With the world size that wrote the state, each rank takes its own entry. With another,
        the positions are moved with the core's rule (:func:`o41_training_data.move_to_world`:
        docs/order.md, "Elastic resume"), exact only when every old rank stopped at the same
        place with the same pending switches; ``source`` names the state in its refusal.
        """
        if world_size == self.world_size:
            return self.checkpoint(rank)
        if all(position is None for position in self.positions):
            return None  # no rank had started: the new ones start at the config's beginning
        stops = {f"rank {old_rank}": position for old_rank, position in enumerate(self.positions)}
        try:
            return move_to_world(stops, rank, world_size, resolved=self.resolved)
        except CheckpointError as error:
            raise CheckpointError(
                f"{error} ({source}, written by {self.world_size} ranks; resume with {self.world_size} ranks)"
            ) from None


def resumed(
    checkpoint: Checkpoint | None, rank: int, world_size: int, config: BatchStreamConfig
) -> Checkpoint | None:
    """``checkpoint`` checked for rank ``rank`` of ``world_size`` of ``config``'s stream.

    The config's ``skip_batches`` become the stream's (the core's
    :func:`~o41_training_data.resume_point`).
    """
    if checkpoint is None:
        return None
    checkpoint.check(rank=rank, world_size=world_size)
    return resume_point(checkpoint, config)


def read_header(state: Any, source: str) -> tuple[int, list[Mapping[str, Any]], int]:
    """Checks the format, version and world size of a state or sidecar index.

    Returns the world size, the rank entries and the version (1 or 2).
    """
    if not isinstance(state, Mapping) or state.get("format") != FORMAT:
        raise CheckpointError(f"checkpoint refused: {source} holds no {FORMAT} state")
    version = state.get("version")
    if version not in READ_VERSIONS or type(version) is not int:
        raise CheckpointError(
            f"checkpoint refused: {source} holds {FORMAT} state version {version!r}; "
            f"this plugin reads versions {', '.join(map(str, READ_VERSIONS))}"
        )
    world_size, ranks = state.get("world_size"), state.get("ranks")
    if type(world_size) is not int or world_size < 1:
        raise CheckpointError(f"checkpoint refused: {source}: world_size is {world_size!r}")
    if not isinstance(ranks, list) or len(ranks) != world_size:
        found = len(ranks) if isinstance(ranks, list) else repr(ranks)
        raise CheckpointError(
            f"checkpoint refused: {source}: expected {world_size} rank entries, found {found}"
        )
    for rank, entry in enumerate(ranks):
        if not isinstance(entry, Mapping):
            raise CheckpointError(f"checkpoint refused: {source}: ranks[{rank}] is {entry!r}")
    return world_size, ranks, version


def read_legacy_switches(entry: Mapping[str, Any], where: str) -> tuple[tuple[int, int], ...]:
    """The ``switches`` of a version-1 rank entry; ``where`` names the entry in errors."""
    switches = entry.get("switches")
    if not isinstance(switches, list) or not all(_is_switch(switch) for switch in switches):
        raise CheckpointError(
            f"checkpoint refused: {where}.switches is {switches!r}, expected [[stage, at], ...]"
        )
    return tuple((stage, at) for stage, at in switches)


def _is_switch(value: Any) -> bool:
    return (
        isinstance(value, Sequence)
        and not isinstance(value, str)
        and len(value) == 2
        and all(type(v) is int and v >= 0 for v in value)
    )
