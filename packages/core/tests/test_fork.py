"""A stream used in a forked child raises at once instead of waiting forever for engine threads
that exist only in the parent."""

from __future__ import annotations

import os
import sys

import pytest
from o41_testkit import ShardWriter, config_for
from o41_training_data import FileSource, ProjectedField, StreamClosedError, open_batch_stream


@pytest.mark.skipif(sys.platform == "win32", reason="os.fork is POSIX")
def test_a_stream_used_in_a_forked_child_raises_at_once(shard: ShardWriter) -> None:
    path = shard("jsonl", [{"v": i} for i in range(100)])
    config = config_for([FileSource([path])], [ProjectedField("v", "v", "i64")], batch_size=4)
    with open_batch_stream(config) as stream:
        first = next(stream).arrays()["v"].tolist()
        read, write = os.pipe()
        pid = os.fork()
        if pid == 0:  # the child: report what happened through the pipe, then leave at once
            try:
                next(stream)
                outcome = b"delivered"
            except StreamClosedError as error:
                outcome = b"refused:" + str(error).encode()
            except BaseException as error:
                outcome = b"other:" + repr(error).encode()
            stream.close()  # a no-op in the child, never a wait on the parent's threads
            os.write(write, outcome)
            os._exit(0)
        os.close(write)
        _, status = os.waitpid(pid, 0)
        reported = os.read(read, 4096).decode()
        os.close(read)
        assert os.waitstatus_to_exitcode(status) == 0
        assert reported.startswith("refused:"), reported
        assert "open a new stream in the child" in reported
        # The parent's stream goes on as if nothing happened.
        assert next(stream).arrays()["v"].tolist() != first
