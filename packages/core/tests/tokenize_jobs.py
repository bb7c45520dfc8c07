"""``o41 tokenize`` in a child process that SIGKILLs itself mid-save, for the restart tests.

    python tests/tokenize_jobs.py N -- ARGS...

runs ``o41 ARGS...`` and kills the process with SIGKILL right before the N-th completion
descriptor is published, that is after that shard's data object was written: the worst moment
for a crash, since a data object without its descriptor is left behind.
"""

from __future__ import annotations

import os
import signal
import sys
from typing import Any

import o41_training_data._saver as saver_module
from o41_training_data._cli import main


def die_before_descriptor(n: int) -> None:
    real = saver_module._publish_descriptor
    published = 0

    def publish(store: Any, uri: str, document: bytes) -> None:
        nonlocal published
        published += 1
        if published == n:
            os.kill(os.getpid(), signal.SIGKILL)
        real(store, uri, document)

    saver_module._publish_descriptor = publish


if __name__ == "__main__":
    die_before_descriptor(int(sys.argv[1]))
    assert sys.argv[2] == "--"
    sys.exit(main(sys.argv[3:]))
