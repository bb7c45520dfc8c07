"""Type stubs for the compiled engine module ``o41_training_data._core``."""

from typing import Any

import pyarrow as pa

__version__: str

_Segment = tuple[int, int, int, int, int]

def resolve_config(config_json: str, storage: Storage | None = None) -> str:
    """Resolves a stream config (JSON) and returns the resolved document (JSON)."""

def load_manifest(uri: str, storage: Storage | None = None) -> str:
    """Reads and checks a data manifest (local, or ``s3://`` given ``storage``); returns it as JSON."""

def shard_location(manifest_uri: str, location: str) -> str:
    """Where the shard ``location`` of the manifest at ``manifest_uri`` is."""

def check_manifest(text: str, uri: str) -> str:
    """Checks a data manifest document against the format's rules; returns it as JSON."""

def host_memory_bytes() -> int | None:
    """Physical memory of the host in bytes, or None where it cannot be read."""

class Checkpoint:
    """A rank's position in a batch stream: the resolved config (no credentials), the cursor
    and the counters ``stage``, ``batches_yielded``, ``rows_yielded`` and ``epochs``.

    Example:
        >>> text = stream.checkpoint().to_json()  # doctest: +SKIP
        >>> Checkpoint.from_json(text).batches_yielded  # doctest: +SKIP
        1000
    """

    @staticmethod
    def from_json(text: str) -> Checkpoint:
        """Parses a checkpoint; raises ``CheckpointError`` if corrupt, altered or of another version."""
    @staticmethod
    def from_position(resolved_json: str, position_json: str) -> Checkpoint:
        """The checkpoint at a position (``Batch.position()``) of the stream ``resolved_json`` describes."""
    def position_json(self) -> str:
        """The position part (JSON), as ``Batch.position()`` returns it."""
    def to_json(self) -> str:
        """The checkpoint as a JSON document."""
    def for_world(self, rank: int, world_size: int) -> Checkpoint:
        """The same position for another rank and world size (elastic resume)."""
    @property
    def version(self) -> int:
        """Document version."""
    @property
    def fingerprint(self) -> str:
        """Fingerprint of the resolved sources, fields and seed."""
    @property
    def stage(self) -> int:
        """Active stage."""
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
    def rank(self) -> int:
        """The rank this checkpoint belongs to."""
    @property
    def world_size(self) -> int:
        """The world size it was taken in."""
    @property
    def next_batch(self) -> int:
        """First global batch of the next round: every earlier one was consumed."""
    def resolved_json(self) -> str:
        """The resolved config document (JSON) the checkpoint pins."""
    def __eq__(self, other: object) -> bool: ...

class Stream:
    """An open batch stream. Use ``o41_training_data.open_batch_stream``, not this class."""

    def __new__(
        cls, config_json: str, offset: int = 0, stride: int = 1, storage: Storage | None = None
    ) -> Stream: ...
    def position_at(self, consumed: int, segment: _Segment) -> str:
        """The position (JSON, no resolved config) once ``consumed`` local batches are consumed."""
    @staticmethod
    def resume(
        checkpoint: Checkpoint, offset: int = 0, stride: int = 1, storage: Storage | None = None
    ) -> Stream:
        """Re-opens the stream a checkpoint describes; ``offset``/``stride`` select a share."""
    def next_batch(self) -> tuple[pa.RecordBatch, int, int, int, _Segment] | None:
        """The next batch as ``(record_batch, stage, batch_index, local_index, segment)``."""
    def advance(self, stage: int) -> None:
        """Switches stage at the next batch boundary."""
    def advance_at(self, stage: int, at: int) -> None:
        """Switches stage at rank-level local batch ``at``."""
    def checkpoint(self) -> Checkpoint:
        """The checkpoint after the last delivered batch."""
    def checkpoint_at(self, consumed: int, segment: _Segment) -> Checkpoint:
        """The checkpoint once ``consumed`` local batches are consumed, with ``segment`` active."""
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
    def stats(self) -> dict[str, int]:
        """Delivery counters: batches_yielded, rows_yielded, dropped_rows."""
    def memory_bound(self) -> dict[str, Any]:
        """The working-set bound computed at open, by term, in bytes."""

class Storage:
    """Local paths, plus ``s3://`` locations when an endpoint is given; holds credentials."""

    def __new__(
        cls,
        endpoint: str | None = None,
        region: str | None = None,
        access_key_id: str | None = None,
        secret_access_key: str | None = None,
        session_token: str | None = None,
        *,
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

class MsgpackRecords:
    """The records of a framed MessagePack shard, in order, as JSON texts."""

    def __new__(cls, path: str, storage: Storage | None = None) -> MsgpackRecords: ...
    def next_chunk(self, count: int) -> list[str]:
        """The next records, up to ``count``; fewer only at the end of the shard."""
