"""The datamodule's state: every rank's stream position, as recorded in the model checkpoint.

Lightning writes rank 0's checkpoint dict only and hands that same dict to every rank on resume,
so the state holds every rank's position (gathered when it is taken) and each rank picks its own
when it is loaded. It is plain JSON-compatible data (strings, ints, lists), so it loads under
``torch.load(weights_only=True)``:

```text
{"format": "o41-training-data-lightning", "version": 1, "world_size": 2,
 "resolved": "<the stream's resolved config, JSON>",
 "ranks": [{"position": "<Position JSON>" | null, "switches": [[stage, at], ...]}, ...]}
```

A ``position`` is the rank's place after the last batch a training step consumed (``null``: the
beginning of the config). A switch is a curriculum stage requested with ``O41DataModule.advance``
that starts once the rank has received ``at`` batches in all (its ``batches_yielded``). Those the
position does not reflect yet are kept: Lightning fetches a batch ahead, so a switch can be
requested, or even applied to the stream, before the step that consumes its first batch.
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
    check_same_place,
    resume_point,
)

FORMAT = "o41-training-data-lightning"
"""The ``format`` marker of the state (and of the sidecar index), so it is found among other keys."""
STATE_VERSION = 1
"""Version of the state ``O41DataModule.state_dict()`` returns and of the sidecar index."""


@dataclasses.dataclass(frozen=True)
class Switch:
    """A curriculum switch: ``stage`` starts once the rank has received ``at`` batches in all."""

    stage: int
    at: int


@dataclasses.dataclass(frozen=True)
class RankState:
    """One rank's entry: its position (``None``: the config's beginning) and its pending switches."""

    position: Position | None
    switches: tuple[Switch, ...]

    def to_json(self) -> dict[str, Any]:
        """The entry as stored in the state."""
        return {
            "position": self.position.to_json() if self.position is not None else None,
            "switches": [[switch.stage, switch.at] for switch in self.switches],
        }

    @property
    def done(self) -> int:
        """The batches the rank had received at its position."""
        return self.position.batches_yielded if self.position is not None else 0

    def ahead(self) -> tuple[tuple[int, int], ...]:
        """The switches as ``(stage, batches after the position)``, which do not depend on the world."""
        return tuple((switch.stage, switch.at - self.done) for switch in self.switches)


@dataclasses.dataclass(frozen=True)
class StreamState:
    """Every rank's entry, the world size that wrote them and the stream's resolved config."""

    world_size: int
    resolved: str | None
    ranks: tuple[RankState, ...]

    def to_dict(self) -> dict[str, Any]:
        """The state as ``O41DataModule.state_dict()`` returns it."""
        return {
            "format": FORMAT,
            "version": STATE_VERSION,
            "world_size": self.world_size,
            "resolved": self.resolved,
            "ranks": [rank.to_json() for rank in self.ranks],
        }

    @staticmethod
    def from_dict(state: Any, source: str) -> StreamState:
        """Reads and checks a state; ``source`` names where it came from in errors."""
        world_size, ranks = read_header(state, source)
        resolved = state.get("resolved")
        if resolved is not None and not isinstance(resolved, str):
            raise CheckpointError(f"checkpoint refused: {source}: resolved is not JSON text")
        entries = []
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
            entries.append(RankState(position=position, switches=read_switches(entry, where)))
        if resolved is None and any(entry.position is not None for entry in entries):
            raise CheckpointError(f"checkpoint refused: {source}: positions without the resolved config")
        return StreamState(world_size=world_size, resolved=resolved, ranks=tuple(entries))

    def checkpoint(self, rank: int) -> Checkpoint | None:
        """Rank ``rank``'s stream checkpoint, or ``None`` when it is at the config's beginning."""
        position = self.ranks[rank].position
        if position is None:
            return None
        assert self.resolved is not None  # from_dict and the datamodule guarantee it
        return Checkpoint.from_position(position, self.resolved)

    def start_for(
        self, rank: int, world_size: int, config: BatchStreamConfig, source: str
    ) -> tuple[Checkpoint | None, tuple[Switch, ...]]:
        """Where rank ``rank`` of ``world_size`` resumes: its checkpoint and its pending switches.

        With the world size that wrote the state, each rank takes its own entry. With another,
        the positions are moved with ``Checkpoint.for_world`` (``docs/order.md``, "Elastic
        resume"), which is exact only when every old rank stopped at the same place; otherwise
        the resume is refused. The checkpoint is checked against ``config``: resuming a
        different stream raises a :class:`CheckpointError` that names the first difference.
        """
        if world_size == self.world_size:
            checkpoint, entry = self.checkpoint(rank), self.ranks[rank]
            switches = entry.switches
        else:
            checkpoint, ahead = self._moved(rank, world_size, source)
            done = checkpoint.batches_yielded if checkpoint is not None else 0
            switches = tuple(Switch(stage=stage, at=done + after) for stage, after in ahead)
        if checkpoint is not None:
            checkpoint.check(rank=rank, world_size=world_size)
            # The config's skip_batches apply from here on (the core's rule for every adapter).
            checkpoint = resume_point(checkpoint, config)
        return checkpoint, switches

    def _moved(
        self, rank: int, world_size: int, source: str
    ) -> tuple[Checkpoint | None, tuple[tuple[int, int], ...]]:
        # The core's one rule (the same as `o41 checkpoint reshard` and the JAX handler): every
        # old rank at the same place; then the pending switches must agree too.
        stops = {f"rank {old_rank}": entry.position for old_rank, entry in enumerate(self.ranks)}
        try:
            check_same_place(stops, world_size=world_size)
        except CheckpointError as error:
            raise CheckpointError(
                f"{error} ({source}, written by {self.world_size} ranks; resume with {self.world_size} ranks)"
            ) from None
        first = self.ranks[0]
        if any(entry.ahead() != first.ahead() for entry in self.ranks):
            raise CheckpointError(
                f"checkpoint refused: {source} was written by {self.world_size} ranks and this run has "
                f"{world_size}; an elastic resume needs every old rank at the same place, but their "
                "curriculum switches differ"
            )
        base = self.checkpoint(0)
        return (base.for_world(rank, world_size) if base is not None else None), first.ahead()


def read_header(state: Any, source: str) -> tuple[int, list[Mapping[str, Any]]]:
    """Checks the format, version and world size of a state or sidecar index; its rank entries."""
    if not isinstance(state, Mapping) or state.get("format") != FORMAT:
        raise CheckpointError(f"checkpoint refused: {source} holds no {FORMAT} state")
    if state.get("version") != STATE_VERSION:
        raise CheckpointError(
            f"checkpoint refused: {source} holds {FORMAT} state version {state.get('version')!r}; "
            f"this plugin reads version {STATE_VERSION}"
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
    return world_size, ranks


def read_switches(entry: Mapping[str, Any], where: str) -> tuple[Switch, ...]:
    """The ``switches`` of a rank entry; ``where`` names the entry in errors."""
    switches = entry.get("switches")
    if not isinstance(switches, list) or not all(_is_switch(switch) for switch in switches):
        raise CheckpointError(
            f"checkpoint refused: {where}.switches is {switches!r}, expected [[stage, at], ...]"
        )
    return tuple(Switch(stage=stage, at=at) for stage, at in switches)


def _is_switch(value: Any) -> bool:
    return (
        isinstance(value, Sequence)
        and not isinstance(value, str)
        and len(value) == 2
        and all(type(v) is int and v >= 0 for v in value)
    )
