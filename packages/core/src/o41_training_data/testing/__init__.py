"""Test helpers for users of o41_training_data.

:func:`assert_resumable` checks, for your own config, the property the library promises:
stopping after any batch and resuming from the checkpoint yields exactly the batches an
uninterrupted stream would have yielded.
"""

from __future__ import annotations

import numpy as np

from .._config import BatchStreamConfig
from .._core import Checkpoint
from .._stream import open_batch_stream, resume_batch_stream

__all__ = ["assert_resumable"]


def _snapshot(batch_arrays: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    return {name: array.copy() for name, array in batch_arrays.items()}


def assert_resumable(config: BatchStreamConfig, *, batches: int = 20, through_json: bool = True) -> None:
    """Asserts that resuming after each of the first ``batches`` batches continues exactly.

    Runs ``config`` uninterrupted for ``batches + 1`` batches (fewer if a finite stage ends),
    then for every stop point ``k`` resumes from the checkpoint taken after ``k`` batches
    (serialised to JSON and back when ``through_json``) and compares every following batch,
    its ``batch_index`` and ``stage`` with the uninterrupted run. Raises ``AssertionError``
    naming the first difference.

    Examples:
        >>> from o41_training_data.testing import assert_resumable
        >>> assert_resumable(config, batches=10)  # doctest: +SKIP

    """
    reference: list[tuple[int, int, dict[str, np.ndarray]]] = []
    checkpoints: list[Checkpoint] = []
    with open_batch_stream(config) as stream:
        checkpoints.append(stream.checkpoint())
        for batch in stream:
            reference.append((batch.batch_index, batch.stage, _snapshot(batch.arrays())))
            checkpoints.append(stream.checkpoint())
            if len(reference) > batches:
                break
    ended = len(reference) <= batches  # the uninterrupted stream ran out on its own
    for k, checkpoint in enumerate(checkpoints[:-1]):
        if through_json:
            checkpoint = Checkpoint.from_json(checkpoint.to_json())
        with resume_batch_stream(checkpoint) as resumed:
            seen = k
            for batch in resumed:
                if seen == len(reference):
                    assert not ended, f"resumed after batch {k}: a batch beyond the stream's end"
                    break
                index, stage, arrays = reference[seen]
                where = f"resumed after batch {k}, batch {seen}"
                assert batch.batch_index == index, f"{where}: batch_index {batch.batch_index} != {index}"
                assert batch.stage == stage, f"{where}: stage {batch.stage} != {stage}"
                for name, expected in arrays.items():
                    if not np.array_equal(batch.arrays()[name], expected):
                        raise AssertionError(f"{where}: field '{name}' differs from the uninterrupted run")
                seen += 1
            assert seen == len(reference), (
                f"resumed after batch {k}: the stream ended after batch {seen}, "
                f"the uninterrupted one after {len(reference)}"
            )
