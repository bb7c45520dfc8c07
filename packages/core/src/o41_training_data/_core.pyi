"""Type stubs for the compiled engine module ``o41_training_data._core``."""

from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, Protocol

import pyarrow as pa

class _ConfigLike(Protocol):
    def to_json(self) -> str: ...

__version__: str

def resolve_config(config_json: str, storage: Storage | None = None) -> str:
    """Resolves a stream config (JSON) and returns the resolved document (JSON)."""

_TracedRow = tuple[int, int, int, int, int, int, str, str, int, bool, bool, bool]
_WindowPiece = tuple[int | None, int, int, int]
_Traced = tuple[list[_TracedRow], list[list[_WindowPiece]]]

def trace_config(
    config_json: str, start: int, end: int, world_size: int, storage: Storage | None = None
) -> _Traced:
    """Rows of global batches ``start..end`` of a stream over a config (JSON), resolved as open does.

    Each row: global batch, rank, slot, stage, source, shard index, shard path and encoding,
    row, padding, whether the row is a token stage's window, and whether its batch is skipped.
    Beside the rows, each row's documents if it is a window: (record or None, start, end,
    position).
    """

def trace_checkpoint(
    checkpoint: Checkpoint, start: int, end: int, world_size: int, storage: Storage | None = None
) -> _Traced:
    """Rows of global batches ``start..end`` of a checkpoint's stream, from its segment on.

    Reads nothing unless a field drops rows (``overflow="drop"``): the traced shards' drop fields
    are then read, to number their rows as the files do.
    """

def split_reference(text: str) -> str | None:
    """The resolved document a split rank file names (``resolved-<fingerprint>.json``), else None."""

def rank_file_name(index: int, count: int, naming: str = "stream") -> str:
    """``stream-rank{index}-of-{count}.json`` (``naming="stream"``) or ``process_{index}-of-{count}.json``."""

def parse_rank_file_name(name: str) -> tuple[int, int] | None:
    """``(index, count)`` of either naming's per-rank file name, else None."""

def check_same_place(stops: list[tuple[str, Position | None]], world_size: int) -> None:
    """Refuses named positions that are not one stream at one place (``CheckpointError``)."""

def check_same_stream(stops: list[tuple[str, Position | None]]) -> None:
    """Refuses named positions of several streams (``CheckpointError``)."""

class RunFiles:
    """The per-rank checkpoint files among one directory's entries (the engine's rules)."""

    def __init__(self, names: list[str], place: str) -> None: ...
    def files(self) -> list[tuple[int, int, str]]:
        """``(index, count, name)`` of every per-rank file."""
    def stale(self, world_size: int | None, fingerprint: str | None) -> list[str]:
        """The names a save of ``world_size`` ranks of stream ``fingerprint`` leaves stale."""
    def restore(
        self,
        read: Callable[[str], str | bytes],
        rank: int,
        world_size: int,
        own: tuple[int, int] | None = None,
        written_by: int | None = None,
    ) -> Checkpoint:
        """The checkpoint rank ``rank`` of ``world_size`` resumes from; ``read(name)`` gives a file's text."""

RUN_STATE_FORMAT: str
"""The ``format`` marker of a :class:`RunState` and a :class:`RunIndex` (``"o41-training-data-lightning"``,
the name its first writer gave it, kept so every state written since reads)."""
RUN_STATE_VERSION: int
"""The version of :class:`RunState` and :class:`RunIndex` documents written (version 1 is read too)."""

class RunState:
    """A run's place in one document: every rank's position, the world that took them and the
    stream's resolved document (docs/checkpoint.md, "A run in one document").

    For a framework that saves one checkpoint for every rank (the Lightning plugin keeps it in
    the model checkpoint). ``to_dict()`` is plain JSON data, so it loads under
    ``torch.load(weights_only=True)``. States of version 1, which kept each rank's pending
    curriculum switches beside its position in the rank's own batches, are read and their
    switches moved into the positions.

    Examples:
        >>> state = RunState(2, checkpoint, [position0, position1])  # doctest: +SKIP
        >>> read = RunState.from_dict(state.to_dict(), "the state")  # doctest: +SKIP
        >>> read.checkpoint_for(0, 4, "the state")  # rank 0 of 4 ranks  # doctest: +SKIP

    """

    def __init__(
        self,
        world_size: int,
        resolved: Checkpoint | str | Mapping[str, Any] | None,
        positions: Sequence[Position | None],
        source: str = "the run state",
    ) -> None:
        """The state of ``world_size`` ranks; ``positions[r]`` is rank ``r``'s (None: not started).

        ``resolved`` is a checkpoint of the stream or its resolved document (needed once a rank
        has started). Raises :class:`CheckpointError` naming ``source`` unless there is one
        position per rank, each the rank's own.
        """
    @staticmethod
    def from_dict(state: Any, source: str) -> RunState:
        """Reads a state ``to_dict()`` (or an earlier release) wrote; ``source`` names it in errors."""
    def to_dict(self) -> dict[str, Any]:
        """The state as plain JSON data: format, version, world size, resolved document, ranks."""
    @property
    def world_size(self) -> int:
        """The number of ranks that took the positions."""
    @property
    def positions(self) -> list[Position | None]:
        """Each rank's position; None: the rank is at the beginning of the config."""
    @property
    def resolved_json(self) -> str | None:
        """The stream's resolved document (JSON), when the state has one."""
    def checkpoint(self, rank: int) -> Checkpoint | None:
        """Rank ``rank``'s checkpoint in the world that took the state; None at the beginning."""
    def checkpoint_for(self, rank: int, world_size: int, source: str) -> Checkpoint | None:
        """Where rank ``rank`` of ``world_size`` resumes (None: the config's beginning).

        Its own entry on the world that took the state; on another the positions are moved
        (:func:`move_to_world`'s rule), exact only when every old rank stopped at the same place,
        else :class:`CheckpointError` naming ``source``.
        """

class RunIndex:
    """The index beside a directory of per-rank files: the world that wrote them, each rank's file
    (None: not started) and the step the save was taken at (docs/checkpoint.md)."""

    def __init__(self, files: Sequence[str | None], global_step: int | None = None) -> None: ...
    @staticmethod
    def from_json(text: str, source: str) -> RunIndex:
        """Parses an index document; ``source`` names it in errors."""
    def to_json(self) -> str:
        """The index as a document of the current version."""
    @property
    def world_size(self) -> int:
        """The number of ranks that wrote the files."""
    @property
    def global_step(self) -> int | None:
        """The step the save was taken at, when its writer said."""
    def restore(
        self,
        names: Sequence[str],
        place: str,
        read: Callable[[str], str | bytes],
        rank: int,
        world_size: int,
        source: str,
    ) -> Checkpoint | None:
        """Where rank ``rank`` of ``world_size`` resumes from the files among ``names`` (the entries
        of the directory ``place``); ``read(name)`` gives a file's text. None: no rank had started."""

def stage_batch_rows(
    batch_size: int, ramp: tuple[int, int, int] | None, world_size: int
) -> tuple[list[int], int]:
    """A stage's batch rows on ``world_size`` ranks (the engine's ramp rule): every row count a
    rank's batch can have, smallest first, and the global batches one round covers."""

def switch_at(ramped: Sequence[bool], position: Position, stage: int, batches_ahead: int) -> int:
    """The global batch a switch to ``stage`` requested ``batches_ahead`` local batches after
    ``position`` takes effect at (``ramped[s]``: whether stage ``s`` has a ramp)."""

SHARED_SEGMENT_PREFIX: str
"""Shared batch segments are files named ``o41-ring-<worker pid>-<random>``."""

class SlotRing:
    """A worker process's shared-memory batch segments (the engine's ``shared_slots``)."""

    def __init__(self) -> None: ...
    @property
    def pid(self) -> int:
        """The process that created the ring."""
    def put(self, columns: pa.RecordBatch) -> BatchSlot:
        """Copies fixed-shape columns into a free slot, leased while the slot or a view of it lives."""
    def unlink_unreceived(self) -> None:
        """Unlinks the segments no receiver mapped."""

class BatchSlot:
    """A filled slot in a worker."""

    @property
    def index(self) -> int:
        """The slot's number in its segment."""
    @property
    def offsets(self) -> list[int]:
        """Each column's offset in the slot."""
    def view(self) -> pa.Array:
        """The slot's bytes as a uint8 array (no copy)."""
    def handle(self) -> tuple[str, int, int, int, int]:
        """The handle another process receives it by; held until that process's view is gone."""

def receive_slot(handle: tuple[str, int, int, int, int]) -> pa.Array:
    """The slot a handle names, viewed in this process as a uint8 array (no copy)."""

def shared_segment_of(address: int) -> str | None:
    """The received segment whose memory holds ``address``, if any."""

def shared_segment_directories() -> list[str]:
    """Where segments are created, in order of preference."""

def load_manifest(uri: str, storage: Storage | None = None) -> str:
    """Reads and checks a data manifest (local, or ``s3://`` given ``storage``); returns it as JSON."""

def normalize_location(location: str) -> str:
    """The one spelling of a location: ``s3://`` as it is, a local path made absolute with ``.``
    and ``..`` resolved lexically (symbolic links are not followed)."""

def shard_location(manifest_uri: str, location: str) -> str:
    """Where the shard ``location`` of the manifest at ``manifest_uri`` is."""

def check_manifest(text: str, uri: str) -> str:
    """Checks a data manifest document against the format's rules; returns it as JSON."""

def limits() -> dict[str, int]:
    """The engine's limits by name (``max_world_size``, ``max_seq_len``, ...)."""

def encodings() -> list[str]:
    """Every shard encoding's name, in the engine's order."""

def encoding_suffixes() -> list[tuple[str, str]]:
    """File name suffixes the engine infers encodings from, longest first, with each one's."""

def retry_defaults() -> dict[str, float]:
    """The engine's default retry policy by ``RetryPolicy`` field name (failures as an int)."""

def stream_rules(
    source: Checkpoint | _ConfigLike,
) -> tuple[
    list[tuple[str, str, list[int]]], list[tuple[int, tuple[int, int, int] | None, list[int]]], int, int
]:
    """``(fields, stages, rank, world_size)`` of a config or checkpoint: each delivered column's
    name, dtype and shape (a validation pass's ``valid`` included), and each stage's batch size,
    ramp ``(start, increment, rows)`` and every size its global batches have."""

def planned_rows(source: _ConfigLike) -> tuple[int, int]:
    """``(group_rows, row_bytes)``: the rows a rank of the config plans together (with
    partitions, the windows it reads of a round) and one row's declared bytes."""

def host_memory_bytes() -> int | None:
    """Physical memory of the host in bytes, or None where it cannot be read."""

class Position:
    """A rank's place in a batch stream after some batch: everything a checkpoint holds except
    the resolved config.

    Examples:
        >>> batch.position.next_batch  # doctest: +SKIP
        64
    """

    @staticmethod
    def from_json(text: str) -> Position:
        """Parses a position document; raises ``CheckpointError`` when malformed."""
    def to_json(self) -> str:
        """The position as a small JSON document."""
    @property
    def fingerprint(self) -> str:
        """Fingerprint of the stream the position belongs to."""
    @property
    def rank(self) -> int:
        """The rank the position belongs to."""
    @property
    def world_size(self) -> int:
        """The number of ranks sharing the global batch sequence."""
    @property
    def stage(self) -> int:
        """The active stage."""
    @property
    def segment(self) -> Segment:
        """The active segment."""
    @property
    def next_batch(self) -> int:
        """First global batch of the next round; this rank's next batch is ``next_batch + rank``
        (``next_batch`` itself in a ramped stage, whose batches every rank shares)."""
    @property
    def batches_yielded(self) -> int:
        """Batches this rank has received over the whole run."""
    @property
    def rows_yielded(self) -> int:
        """Rows this rank has received over the whole run."""
    @property
    def epochs(self) -> list[int]:
        """Completed passes over each source of the active stage."""
    @property
    def switches(self) -> list[tuple[int, int]]:
        """Curriculum switches requested and not reached yet, as ``(stage, at)`` pairs by
        increasing ``at`` (a global batch): a stream resumed at this position applies them."""
    def with_switch(self, stage: int, at: int) -> Position:
        """This position with a switch to ``stage`` at global batch ``at`` requested.

        Kept when the position has not reached ``at`` and another stage is in effect there,
        replacing the requests at or after ``at``; otherwise the position comes back unchanged
        (docs/checkpoint.md, "Pending switches").
        """
    def __eq__(self, other: object, /) -> bool: ...

class Checkpoint(Position):
    """A rank's position in a batch stream together with the resolved config (no credentials)
    it is a position in. It is a ``Position``: the cursor and the counters ``stage``,
    ``batches_yielded``, ``rows_yielded`` and ``epochs`` are read as on one.

    Examples:
        >>> text = stream.checkpoint().to_json()  # doctest: +SKIP
        >>> Checkpoint.from_json(text).batches_yielded  # doctest: +SKIP
        1000
    """

    @staticmethod
    def from_json(text: str) -> Checkpoint:
        """Parses a checkpoint; raises ``CheckpointError`` if corrupt, altered or of another version."""
    @staticmethod
    def from_position(position: Position, resolved: Checkpoint | str | Mapping[str, Any]) -> Checkpoint:
        """The checkpoint at ``position`` of the stream ``resolved`` (a checkpoint of it, or its
        resolved config document as a dict or JSON text) describes."""
    @staticmethod
    def at_start(resolved: Checkpoint | str | Mapping[str, Any]) -> Checkpoint:
        """The checkpoint at the beginning of the stream ``resolved`` describes (a checkpoint of
        it, or its resolved config as a dict or JSON text): where a stream opened from its config
        starts. With ``Position.with_switch`` it places a switch before the first batch."""
    def check(
        self, *, rank: int | None = None, world_size: int | None = None, config: _ConfigLike | None = None
    ) -> None:
        """Raises ``CheckpointError`` naming what differs from this process's rank, world size or config."""
    @property
    def position(self) -> Position:
        """The position part as a plain ``Position``: everything but the resolved config."""
    def to_json(self) -> str:
        """The checkpoint as a JSON document."""
    def for_world(self, rank: int, world_size: int) -> Checkpoint:
        """The same position for another rank and world size (elastic resume)."""
    @staticmethod
    def from_split(rank_text: str, shared_text: str) -> Checkpoint:
        """The checkpoint a split rank file (version 2, or 4 with pending switches) and the
        resolved document it names describe."""
    def to_split(self) -> tuple[str, str]:
        """The split form's rank file and the shared document's name: ``(rank_json, shared_name)``."""
    def shared_json(self) -> str:
        """The split form's shared document: the resolved document, the same bytes from every rank."""
    def with_skipped_batches(self, ranges: Iterable[tuple[int, int] | range]) -> Checkpoint:
        """This checkpoint with ``ranges`` as the global batches its stream skips.

        Every range it already skips is kept; new ones start at or after its next global batch.
        """
    @property
    def version(self) -> int:
        """The version the document is written in: 3 when it holds pending switches, else 1."""
    def resolved_json(self) -> str:
        """The resolved config document (JSON) the checkpoint pins."""
    def resolved_config(self) -> dict[str, Any]:
        """The resolved config document the checkpoint pins, as a dict."""
    def __eq__(self, other: object, /) -> bool: ...

class Segment:
    """The stretch of a stream between two stage switches."""

    @property
    def stage(self) -> int:
        """The active stage."""
    @property
    def start_batch(self) -> int:
        """First global batch of the segment."""
    @property
    def drain(self) -> Drain | None:
        """Rows of the previous stage delivered first, or None."""
    def __eq__(self, other: object, /) -> bool: ...

class Drain:
    """Output positions of a previous stage still in its shuffle window at a stage switch."""

    @property
    def stage(self) -> int:
        """The stage the rows belong to."""
    @property
    def start(self) -> int:
        """First output position still to deliver."""
    @property
    def end(self) -> int:
        """End of the drained range."""
    def __eq__(self, other: object, /) -> bool: ...

class Stream:
    """An open batch stream. Use ``o41_training_data.open_batch_stream``, not this class."""

    def __new__(
        cls, config_json: str, offset: int = 0, stride: int = 1, storage: Storage | None = None
    ) -> Stream: ...
    @staticmethod
    def resume(
        checkpoint: Checkpoint,
        offset: int = 0,
        stride: int = 1,
        storage: Storage | None = None,
        *,
        rank: int | None = None,
        world_size: int | None = None,
        config: _ConfigLike | None = None,
    ) -> Stream:
        """Re-opens the stream a checkpoint describes after checking it; ``offset``/``stride``: a share."""
    def next_batch(self) -> tuple[pa.RecordBatch, int, int, int, Position] | None:
        """The next batch as ``(record_batch, stage, batch_index, local_index, position)``."""
    def advance(self, stage: int, at: int | None = None) -> None:
        """Switches stage at the next batch boundary, or at global batch ``at``."""
    def position(self) -> Position:
        """The position after the last delivered batch."""
    def checkpoint(self, position: Position | None = None) -> Checkpoint:
        """The checkpoint after the last delivered batch, or at ``position``."""
    @property
    def stage(self) -> int:
        """The active stage."""
    def close(self) -> None:
        """Stops the stream's threads, waiting for reads in flight. Idempotent."""
    @property
    def closed(self) -> bool:
        """True once closed."""
    def resolved_json(self) -> str:
        """The resolved config document (JSON)."""
    def stats(self) -> dict[str, Any]:
        """Counters and timings: batches_yielded, rows_yielded, dropped_rows, batches_delivered,
        batches_waited, consumer_wait_seconds, consumer_seconds, prefetch_depth,
        prefetch_capacity, sources (a list of dicts with stage, source, bytes_read,
        read_wait_seconds, rows_read, shards_opened, retries), open (the same keys) and decode
        (encoding name to (rows, seconds))."""
    def token_stats(self) -> list[dict[str, Any] | None]:
        """Per stage, a token stage's tokens, windows, row_tokens and padding_fraction."""
    def memory_bound(self) -> dict[str, Any]:
        """The working-set bound computed at open, by term, in bytes."""

class Storage:
    """Local paths, plus ``s3://`` locations when an endpoint is given or ``aws`` is set."""

    def __new__(
        cls,
        endpoint: str | None = None,
        region: str | None = None,
        access_key_id: str | None = None,
        secret_access_key: str | None = None,
        session_token: str | None = None,
        *,
        aws: bool = False,
        profile: str | None = None,
        credential_provider: Callable[[], tuple[str, str, str | None, float | None]] | None = None,
        ca_bundle: bytes | None = None,
        max_consecutive_failures: int = 64,
        no_progress_timeout_s: float = 900.0,
        read_timeout_s: float = 60.0,
        connect_timeout_s: float = 10.0,
        initial_backoff_s: float = 0.1,
        max_backoff_s: float = 15.0,
    ) -> Storage: ...
    def read(self, uri: str) -> bytes:
        """The whole content of ``uri``."""
    def open(self, uri: str) -> StorageObject:
        """Opens ``uri`` for ranged reads pinned to its current version."""
    def write(self, uri: str, data: bytes, *, create_only: bool = True) -> bool:
        """Writes ``data``; True when written, False when an equal object was already there."""
    def write_file(self, uri: str, source: str, sha256: str, *, create_only: bool = True) -> bool:
        """Writes the local file ``source`` to ``uri``, as ``write``."""
    def checksum(self, uri: str) -> str:
        """Hex SHA-256 of ``uri``."""
    def content_sha256(self, uri: str) -> str:
        """Hex SHA-256 computed from the content of ``uri`` (never from stored metadata)."""
    def describe_shard(self, uri: str, encoding: str) -> tuple[str, int, int, str]:
        """Location (a Megatron dataset's ``.bin``), record count, size in bytes and content
        SHA-256 of the shard at ``uri``."""
    def list(self, prefix: str) -> list[str]:
        """Every object under the directory ``prefix``, sorted."""

class StorageObject:
    """One object opened by ``Storage.open``."""

    @property
    def uri(self) -> str:
        """Location the object was opened from."""
    @property
    def size(self) -> int:
        """Size in bytes."""
    def read_range(self, start: int, end: int) -> bytes:
        """Bytes ``start..end`` of the version seen at open."""

class ShardRecords:
    """The records of one shard, in order, in chunks, decoded by the engine."""

    def __new__(
        cls, path: str, encoding: str, storage: Storage | None = None, chunk_rows: int = 1024
    ) -> ShardRecords: ...
    def next_chunk(self, max_rows: int) -> list[dict[str, Any]] | pa.RecordBatch | None:
        """The next records: dicts (JSON Lines, MessagePack) or a RecordBatch (Parquet); None at the end."""

def write_shard(
    path: str,
    encoding: str,
    *,
    records: Iterable[Mapping[str, Any]] | None = None,
    table: pa.Table | None = None,
    name: str | None = None,
) -> tuple[int, str]:
    """Writes a local shard file from records or an Arrow table; returns (bytes, sha256 hex)."""
