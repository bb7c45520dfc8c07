"""The device prefetch thread: a bounded number of transferred batches ahead, in order."""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Generic, TypeVar

from o41_training_data import Batch, BatchStream, Position

__all__ = ["End", "Failure", "Producer"]

T = TypeVar("T")


@dataclass(frozen=True)
class End:
    """The stream ended: a finite stage ran out."""


@dataclass(frozen=True)
class Failure:
    """Reading or transferring the next batch raised ``error``; the batches before it came first."""

    error: BaseException


class Producer(Generic[T]):
    """Takes batches from ``stream``, transfers them with ``transfer`` and queues them in order.

    At most ``slots`` batches are taken from the stream and not yet handed out (by :meth:`get`),
    so the core never runs further ahead of the trainer than that, and each queued item carries
    the position after its batch. Stopping it does not close the stream; the owner closes the
    stream first when the thread may be waiting for a batch.
    """

    def __init__(self, stream: BatchStream, transfer: Callable[[Batch], T], slots: int) -> None:
        self._stream = stream
        self._transfer = transfer
        self._queue: queue.SimpleQueue[tuple[T, Position] | End | Failure] = queue.SimpleQueue()
        # One token per batch the thread may take ahead. A SimpleQueue rather than a Semaphore:
        # its blocking get waits in C, which costs less per batch than threading's Condition.
        self._slots: queue.SimpleQueue[None] = queue.SimpleQueue()
        for _ in range(slots):
            self._slots.put(None)
        self._stopping = threading.Event()
        self._terminal: End | Failure | None = None
        self._thread = threading.Thread(target=self._run, name="o41-jax-prefetch", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            while True:
                self._slots.get()
                if self._stopping.is_set():
                    return
                batch = next(self._stream, None)
                if batch is None:
                    self._queue.put(End())
                    return
                self._queue.put((self._transfer(batch), batch.position))
                del batch  # the engine's buffers go back once the transfer no longer needs them
        except BaseException as error:
            # After stop() the stream was closed under the thread on purpose; nobody waits.
            if not self._stopping.is_set():
                self._queue.put(Failure(error))

    def get(self) -> tuple[T, Position] | End | Failure:
        """The next item in stream order; the end or a failure repeats on every later call."""
        if self._terminal is not None:
            return self._terminal
        item = self._queue.get()
        if isinstance(item, (End, Failure)):
            self._terminal = item
            return item
        self._slots.put(None)
        return item

    def stop(self) -> None:
        """Stops the thread and drops what it had queued. Idempotent."""
        self._stopping.set()
        self._slots.put(None)  # wakes a thread waiting for room
        self._thread.join()
        while True:
            try:
                self._queue.get_nowait()
            except queue.Empty:
                break
