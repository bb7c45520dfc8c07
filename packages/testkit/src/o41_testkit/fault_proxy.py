"""A fault-injecting HTTP/1.1 proxy that sits between an S3 client under test and the local S3 server.

Requests and responses are relayed byte for byte: S3 clients sign the ``Host`` they connect to (the
proxy's) with SigV4 and the server verifies the headers as received, so nothing may be rewritten.
The proxy parses only what it needs to find message boundaries (``Content-Length``, chunked
transfer coding, bodiless responses) so that keep-alive connections work and a fault can strike
mid-body. ``aws-chunked`` uploads are framed by ordinary HTTP framing and pass through untouched.

A test schedules faults, each for a number of matching requests, matched first come first served::

    proxy.add_fault(Fault(kind="reset", after_bytes=1000, method="GET", path_contains="shard-0"))

and reads ``proxy.requests`` afterwards to see how its client recovered (ranges, preconditions).
"""

from __future__ import annotations

import contextlib
import socket
import struct
import threading
import urllib.parse
from collections.abc import Iterator
from dataclasses import dataclass, replace
from io import BufferedReader
from typing import Literal, NamedTuple

__all__ = ["Fault", "FaultProxy", "RequestRecord"]

FaultKind = Literal["reset", "status", "stall", "lose", "delay"]

_CHUNK = 64 * 1024
_REASONS = {
    500: "Internal Server Error",
    502: "Bad Gateway",
    503: "Service Unavailable",
    504: "Gateway Timeout",
}
# The S3 error codes a client sees for the injected statuses (503 is S3's throttling answer).
_ERROR_CODES = {500: "InternalError", 503: "SlowDown"}


@dataclass
class Fault:
    """One scheduled fault, applied to the next ``times`` requests that match it.

    Attributes:
        kind: ``"reset"`` relays the response head and ``after_bytes`` body bytes (the whole body
            if it is shorter), then aborts the client connection with a TCP RST; ``"status"``
            answers ``status`` with an S3 XML error without contacting the server (a request body
            is read and dropped); ``"stall"`` relays the head and ``after_bytes`` body bytes,
            holds the connection silent for ``seconds``, then closes it; ``"lose"`` relays the
            request, so the server does the work, then resets the client connection instead of
            relaying the answer (a response lost in transit); ``"delay"`` holds the request for
            ``seconds`` before relaying it and its answer untouched (a slow link, not a failure).
        after_bytes: Response body bytes relayed before a ``reset`` or ``stall`` (as framed on the
            wire, so chunk headers count for chunked bodies).
        method: Matches only this HTTP method (``GET``, ``PUT``, ...); any method when None.
        path_contains: Matches only request targets (path and query) containing this string.
        status: The status a ``status`` fault answers with.
        seconds: How long a ``stall`` holds the connection, or a ``delay`` the request.
        times: How many matching requests the fault applies to.

    """

    kind: FaultKind
    after_bytes: int = 0
    method: str | None = None
    path_contains: str | None = None
    status: int = 503
    seconds: float = 1.0
    times: int = 1

    def __post_init__(self) -> None:
        if self.kind not in ("reset", "status", "stall", "lose", "delay"):
            raise ValueError(f"unknown fault kind {self.kind!r}")
        if self.times < 1 or self.after_bytes < 0 or self.seconds < 0:
            raise ValueError(f"invalid fault {self!r}")
        if self.kind == "status" and not 400 <= self.status <= 599:
            raise ValueError(f"a status fault needs an error status, not {self.status}")

    def matches(self, method: str, target: str) -> bool:
        """Whether a request with this method and target is one this fault applies to."""
        return (self.method is None or self.method.upper() == method.upper()) and (
            self.path_contains is None or self.path_contains in target
        )


@dataclass(frozen=True)
class RequestRecord:
    """One request the proxy saw, as logged before it was forwarded (or faulted).

    Attributes:
        method: The HTTP method.
        path: The request target: the path and, if any, the query string.
        range: The ``Range`` header, if sent.
        if_match: The ``If-Match`` header, if sent.
        if_none_match: The ``If-None-Match`` header, if sent.
        fault: The kind of fault applied to the request, or None when it was relayed untouched.

    """

    method: str
    path: str
    range: str | None
    if_match: str | None
    if_none_match: str | None
    fault: FaultKind | None


class _Scheduled(NamedTuple):
    fault: Fault
    remaining: int


class _DisconnectedError(Exception):
    """A peer closed its connection mid-message; the exchange is abandoned."""


@dataclass
class _Head:
    """A parsed message head, with its raw bytes to relay unchanged."""

    raw: bytes
    start: list[str]
    headers: dict[str, str]  # lower-cased names; repeated headers joined with ", "

    def header(self, name: str) -> str | None:
        return self.headers.get(name)

    def tokens(self, name: str) -> set[str]:
        value = self.headers.get(name, "")
        return {t.strip().lower() for t in value.split(",") if t.strip()}


def _read_head(reader: BufferedReader) -> _Head | None:
    """Reads one message head; None on a clean end of stream before it starts."""
    lines: list[bytes] = []
    while True:
        line = reader.readline(_CHUNK)
        if not line:
            if not lines:
                return None
            raise _DisconnectedError("end of stream inside a message head")
        if not lines and line in (b"\r\n", b"\n"):  # stray CRLF between messages (RFC 9112 2.2)
            continue
        lines.append(line)
        if line in (b"\r\n", b"\n"):
            break
    start = lines[0].decode("latin-1").split(None, 2)
    headers: dict[str, str] = {}
    for raw_line in lines[1:-1]:
        name, _, value = raw_line.decode("latin-1").partition(":")
        key = name.strip().lower()
        headers[key] = f"{headers[key]}, {value.strip()}" if key in headers else value.strip()
    return _Head(b"".join(lines), start, headers)


def _body_pieces(reader: BufferedReader, head: _Head, *, until_close: bool) -> Iterator[bytes]:
    """Yields a message body as raw wire bytes (chunk framing included), ending where it ends."""
    if "chunked" in head.tokens("transfer-encoding"):
        while True:
            size_line = reader.readline(_CHUNK)
            if not size_line.endswith(b"\n"):
                raise _DisconnectedError("end of stream inside a chunk size")
            yield size_line
            size = int(size_line.split(b";", 1)[0].strip(), 16)
            if size == 0:
                while True:  # trailer fields, then the final empty line
                    trailer = reader.readline(_CHUNK)
                    if not trailer:
                        raise _DisconnectedError("end of stream inside a trailer")
                    yield trailer
                    if trailer in (b"\r\n", b"\n"):
                        return
            yield from _exactly(reader, size + 2)  # data and its CRLF
    elif head.header("content-length") is not None:
        yield from _exactly(reader, int(head.headers["content-length"].split(",")[0]))
    elif until_close:
        while piece := reader.read1(_CHUNK):
            yield piece


def _exactly(reader: BufferedReader, count: int) -> Iterator[bytes]:
    while count > 0:
        piece = reader.read1(min(count, _CHUNK))
        if not piece:
            raise _DisconnectedError("end of stream inside a body")
        count -= len(piece)
        yield piece


class FaultProxy:
    """An HTTP/1.1 proxy on 127.0.0.1 that relays to ``upstream`` and injects scheduled faults.

    Use as a context manager, or :meth:`start` then :meth:`stop`. Each client connection gets its
    own upstream connection and daemon thread; :meth:`stop` closes every socket.
    """

    def __init__(self, upstream: str) -> None:
        parsed = urllib.parse.urlsplit(upstream)
        if parsed.scheme != "http" or parsed.hostname is None or parsed.port is None:
            raise ValueError(f"upstream must be http://HOST:PORT, not {upstream!r}")
        self._upstream = (parsed.hostname, parsed.port)
        self._lock = threading.Lock()
        # Scheduled faults with how many more requests each applies to; the callers' Fault objects
        # stay as they made them.
        self._faults: list[_Scheduled] = []
        self._log: list[RequestRecord] = []
        self._sockets: set[socket.socket] = set()
        self._threads: set[threading.Thread] = set()
        self._stopping = threading.Event()
        self._listener: socket.socket | None = None
        self._acceptor: threading.Thread | None = None

    @property
    def endpoint_url(self) -> str:
        """The proxy's URL, ``http://127.0.0.1:PORT``, to give the client under test."""
        if self._listener is None:
            raise RuntimeError("the proxy is not running")
        return f"http://127.0.0.1:{self._listener.getsockname()[1]}"

    @property
    def requests(self) -> list[RequestRecord]:
        """A snapshot of every request seen so far, in arrival order."""
        with self._lock:
            return list(self._log)

    @property
    def pending_faults(self) -> list[Fault]:
        """The faults not yet used up, in order, each with ``times`` set to what remains of it."""
        with self._lock:
            return [replace(fault, times=remaining) for fault, remaining in self._faults]

    def add_fault(self, fault: Fault) -> None:
        """Schedules ``fault`` after those already scheduled."""
        with self._lock:
            self._faults.append(_Scheduled(fault, fault.times))

    def clear(self) -> None:
        """Drops every scheduled fault and the request log."""
        with self._lock:
            self._faults.clear()
            self._log.clear()

    def start(self) -> None:
        """Starts listening on a free port of 127.0.0.1."""
        if self._listener is not None:
            return
        self._stopping.clear()
        listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        listener.bind(("127.0.0.1", 0))
        listener.listen(64)
        # accept() wakes up now and then so that stop() is noticed without relying on close().
        listener.settimeout(0.1)
        self._listener = listener
        self._acceptor = threading.Thread(target=self._accept_loop, name="fault-proxy-accept", daemon=True)
        self._acceptor.start()

    def stop(self) -> None:
        """Stops accepting, closes every connection and waits for the threads; idempotent."""
        if self._listener is None:
            return
        self._stopping.set()
        if self._acceptor is not None:
            self._acceptor.join()
        self._listener.close()
        self._listener = None
        with self._lock:
            sockets, threads = list(self._sockets), list(self._threads)
        for sock in sockets:
            # shutdown() wakes a thread blocked in recv(); the thread then closes its own socket.
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
        for thread in threads:
            thread.join(timeout=5)

    def __enter__(self) -> FaultProxy:
        self.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    # -- internals ------------------------------------------------------------------------------

    def _accept_loop(self) -> None:
        assert self._listener is not None
        while not self._stopping.is_set():
            try:
                client, _ = self._listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            client.settimeout(None)
            thread = threading.Thread(
                target=self._serve, args=(client,), name="fault-proxy-conn", daemon=True
            )
            with self._lock:
                self._sockets.add(client)
                self._threads.add(thread)
            thread.start()

    def _track(self, sock: socket.socket, *, add: bool) -> None:
        with self._lock:
            if add:
                self._sockets.add(sock)
            else:
                self._sockets.discard(sock)

    def _next_fault(self, method: str, target: str) -> Fault | None:
        with self._lock:
            for i, (fault, remaining) in enumerate(self._faults):
                if fault.matches(method, target):
                    if remaining == 1:
                        del self._faults[i]
                    else:
                        self._faults[i] = _Scheduled(fault, remaining - 1)
                    return fault
        return None

    def _serve(self, client: socket.socket) -> None:
        """Serves one client connection, request after request, until either side closes it."""
        upstream: socket.socket | None = None
        up_reader: BufferedReader | None = None
        reader: BufferedReader = client.makefile("rb")
        abort = False
        try:
            while not self._stopping.is_set():
                head = _read_head(reader)
                if head is None or len(head.start) < 3:
                    return
                method, target = head.start[0].upper(), head.start[1]
                fault = self._next_fault(method, target)
                with self._lock:
                    self._log.append(
                        RequestRecord(
                            method=method,
                            path=target,
                            range=head.header("range"),
                            if_match=head.header("if-match"),
                            if_none_match=head.header("if-none-match"),
                            fault=None if fault is None else fault.kind,
                        )
                    )
                if fault is not None and fault.kind == "status":
                    if not self._answer_status(client, reader, head, method, target, fault.status):
                        return
                    continue
                if fault is not None and fault.kind == "delay":
                    self._stopping.wait(fault.seconds)
                    fault = None  # then relayed as if nothing happened
                if upstream is None:
                    upstream = socket.create_connection(self._upstream)
                    self._track(upstream, add=True)
                    up_reader = upstream.makefile("rb")
                assert up_reader is not None
                outcome = self._exchange(client, reader, upstream, up_reader, head, method, fault)
                if outcome == "reset":
                    abort = True
                    return
                if outcome == "close":
                    return
        except (_DisconnectedError, OSError, ValueError):
            return  # a peer went away or sent garbage: drop the connection, as a real proxy would
        finally:
            if upstream is not None:
                self._close(upstream, up_reader)
            if abort:
                # SO_LINGER with a zero timeout turns close() into an abortive close: an RST.
                with contextlib.suppress(OSError):
                    client.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            self._close(client, reader)
            with self._lock:
                self._threads.discard(threading.current_thread())

    def _close(self, sock: socket.socket, reader: BufferedReader | None) -> None:
        self._track(sock, add=False)
        if reader is not None:
            reader.close()
        sock.close()

    def _answer_status(
        self,
        client: socket.socket,
        reader: BufferedReader,
        head: _Head,
        method: str,
        target: str,
        status: int,
    ) -> bool:
        """Answers with an injected S3 error; returns whether the connection can carry on."""
        # A client waiting for 100-continue has not sent its body and may never: close after.
        keep_alive = "100-continue" not in head.tokens("expect")
        if keep_alive:
            for _ in _body_pieces(reader, head, until_close=False):
                pass  # unread request bytes would make close() send an RST before the answer
        code = _ERROR_CODES.get(status, "InjectedFault")
        resource = target.split("?", 1)[0]
        body = (
            '<?xml version="1.0" encoding="UTF-8"?>\n'
            f"<Error><Code>{code}</Code><Message>injected by the test fault proxy</Message>"
            f"<Resource>{resource}</Resource><RequestId>fault-proxy</RequestId></Error>"
        ).encode()
        response = (
            f"HTTP/1.1 {status} {_REASONS.get(status, 'Error')}\r\n"
            "Content-Type: application/xml\r\n"
            f"Content-Length: {len(body)}\r\n"
            "x-amz-request-id: fault-proxy\r\n"
            f"Connection: {'keep-alive' if keep_alive else 'close'}\r\n\r\n"
        ).encode()
        client.sendall(response if method == "HEAD" else response + body)
        return keep_alive

    def _exchange(
        self,
        client: socket.socket,
        reader: BufferedReader,
        upstream: socket.socket,
        up_reader: BufferedReader,
        head: _Head,
        method: str,
        fault: Fault | None,
    ) -> Literal["keep", "close", "reset"]:
        """Relays one request and its response, applying a reset or stall fault to the response."""
        upstream.sendall(head.raw)
        expects_continue = "100-continue" in head.tokens("expect")
        body_sent = False
        if not expects_continue:
            for piece in _body_pieces(reader, head, until_close=False):
                upstream.sendall(piece)
            body_sent = True
        while True:
            response = _read_head(up_reader)
            if response is None:
                raise _DisconnectedError("the server closed the connection without answering")
            status = int(response.start[1])
            if 100 <= status < 200 and status != 101:
                client.sendall(response.raw)  # interim answer, the final one follows
                if status == 100 and not body_sent:
                    for piece in _body_pieces(reader, head, until_close=False):
                        upstream.sendall(piece)
                    body_sent = True
                continue
            break
        if fault is not None and fault.kind == "lose":
            return "reset"  # the server did the work; its answer never reaches the client
        client.sendall(response.raw)
        bodiless = method == "HEAD" or status in (204, 304)
        framed = "chunked" in response.tokens("transfer-encoding") or response.header("content-length")
        pieces = iter(()) if bodiless else _body_pieces(up_reader, response, until_close=True)
        limit = fault.after_bytes if fault is not None else None
        relayed = 0
        for piece in pieces:
            if limit is not None and relayed + len(piece) >= limit:
                client.sendall(piece[: limit - relayed])
                break
            client.sendall(piece)
            relayed += len(piece)
        if fault is not None:
            if fault.kind == "stall":
                self._stopping.wait(fault.seconds)
                return "close"
            return "reset"
        if not body_sent:
            return "close"  # the server answered before the body: the client's next bytes are unknown
        if not bodiless and not framed:
            return "close"  # the body ended with the server's close
        if "close" in response.tokens("connection") or "close" in head.tokens("connection"):
            return "close"
        return "keep"
