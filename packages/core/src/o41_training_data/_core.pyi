"""Type stubs for the compiled engine module ``o41_training_data._core``."""

from typing import Any

import pyarrow as pa

__version__: str

def resolve_config(config_json: str) -> str:
    """Resolves a stream config (JSON) and returns the resolved document (JSON)."""

def host_memory_bytes() -> int | None:
    """Physical memory of the host in bytes, or None where it cannot be read."""

class Stream:
    """An open batch stream. Use ``o41_training_data.open_batch_stream``, not this class."""

    def __new__(cls, config_json: str) -> Stream: ...
    def next_batch(self) -> tuple[pa.RecordBatch, int, int] | None:
        """The next batch as ``(record_batch, stage, batch_index)``, or None at the end."""
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
