"""moto's S3 server on 127.0.0.1, a second S3 implementation beside SeaweedFS.

A storage behaviour that holds on one server only may rest on that server's defaults rather
than on the protocol: the conformance suite runs every check on both (and on local disk).
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from types import TracebackType

__all__ = ["MotoServer"]


class MotoServer:
    """``python -m moto.server`` on a free port of 127.0.0.1, over plain HTTP.

    moto accepts any credentials; the bucket must be created (``boto3_client_for`` then
    ``create_bucket``). Stop it with :meth:`stop` or a ``with`` block.
    """

    region = "us-east-1"
    access_key_id = "O41MOTOTEST"
    secret_access_key = "o41-moto-test-secret"

    def __init__(self, log_dir: Path) -> None:
        self._log_path = log_dir / "moto.log"
        self._process: subprocess.Popen[bytes] | None = None
        self.endpoint_url = ""

    def start(self) -> None:
        """Starts the server and waits until it answers (60 s at most)."""
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            port = probe.getsockname()[1]
        environment = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
        with self._log_path.open("wb") as log:
            self._process = subprocess.Popen(
                [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env=environment,
            )
        self.endpoint_url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 60
        while True:
            try:
                urllib.request.urlopen(f"{self.endpoint_url}/moto-api/", timeout=2).read()
                return
            except OSError:
                if time.monotonic() > deadline or self._process.poll() is not None:
                    self.stop()
                    raise RuntimeError(f"moto did not start: {self._log_path.read_text()}") from None
                time.sleep(0.2)

    def stop(self) -> None:
        """Stops the server (and waits for it)."""
        process, self._process = self._process, None
        if process is not None:
            process.terminate()
            try:
                process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()

    def __enter__(self) -> MotoServer:
        self.start()
        return self

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, trace: TracebackType | None
    ) -> None:
        self.stop()
