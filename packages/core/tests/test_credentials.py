"""Credentials that expire or are replaced under a running stream, the AWS chain, and AWS itself.

The keys are a SeaweedFS user's, rotated and revoked through the server's IAM API while a
stream reads; every stream here must deliver exactly what a stream with fixed keys delivers.
"""

from __future__ import annotations

import datetime
import json
import os
import socket
import sys
import threading
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from o41_testkit import QUICK, SUFFIX, LocalS3Server, data_for, upload, write_shard
from o41_testkit.identity import RotatingUser, StsStandIn, self_signed_certificate
from o41_training_data import (
    AccessDeniedError,
    BatchStreamConfig,
    ConfigError,
    FileSource,
    ProjectedField,
    RetryPolicy,
    Shuffle,
    Stage,
    StorageError,
    TemporaryCredentials,
    TrainingData,
)

V = ProjectedField("v", "v", "i64")
# The environment of the test process must not hand the chain other credentials.
_CHAIN_VARIABLES = (
    "AWS_ACCESS_KEY_ID",
    "AWS_SECRET_ACCESS_KEY",
    "AWS_SESSION_TOKEN",
    "AWS_PROFILE",
    "AWS_WEB_IDENTITY_TOKEN_FILE",
    "AWS_ROLE_ARN",
    "AWS_ENDPOINT_URL",
    "AWS_ENDPOINT_URL_S3",
    "AWS_ENDPOINT_URL_STS",
    "AWS_CONTAINER_CREDENTIALS_RELATIVE_URI",
    "AWS_CONTAINER_CREDENTIALS_FULL_URI",
    "AWS_CONTAINER_AUTHORIZATION_TOKEN_FILE",
    "AWS_CONFIG_FILE",
    "AWS_SHARED_CREDENTIALS_FILE",
    "AWS_CA_BUNDLE",
)


@pytest.fixture
def bare_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> pytest.MonkeyPatch:
    """No AWS settings in the environment, an empty home, and no instance metadata to ask."""
    for name in _CHAIN_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    return monkeypatch


@pytest.fixture
def user(s3_server: LocalS3Server, request: pytest.FixtureRequest) -> Iterator[RotatingUser]:
    name = "u" + str(abs(hash(request.node.name)))[:12]
    rotating = RotatingUser(s3_server, name)
    try:
        yield rotating
    finally:
        rotating.close()


def shards(tmp_path: Path, client: Any, prefix: str, count: int = 12, rows: int = 200) -> list[str]:
    remote = []
    for k in range(count):
        path = write_shard(
            tmp_path / f"part-{k}{SUFFIX['parquet']}",
            "parquet",
            [{"v": k * 10_000 + i} for i in range(rows)],
            row_group_rows=32,
        )
        remote.append(upload(client, path, f"{prefix}part-{k}.parquet"))
    return remote


def config(remote: list[str]) -> BatchStreamConfig:
    return BatchStreamConfig(
        fields=[V],
        stages=[
            Stage(sources=[FileSource(remote)], batch_size=16, shuffle=Shuffle(buffer_rows=64, unit_rows=4))
        ],
        seed=11,
        threads=1,
        # Little read-ahead keeps requests going for the whole stream, after every rotation.
        prefetch_batches=1,
    )


def read_all(
    data: TrainingData, remote: list[str], between: Callable[[int], None] | None = None
) -> list[list[int]]:
    out = []
    with data.batch_stream(config(remote)) as stream:
        for index, batch in enumerate(stream):
            out.append(batch.arrays()["v"].tolist())
            if between is not None:
                between(index)
    return out


@pytest.fixture
def remote(tmp_path: Path, boto3_client: Any, s3_prefix: str) -> list[str]:
    return shards(tmp_path, boto3_client, s3_prefix)


@pytest.fixture
def reference(s3_server: LocalS3Server, remote: list[str]) -> list[list[int]]:
    return read_all(data_for(s3_server), remote)


def test_a_credential_provider_continues_exactly_when_its_keys_are_replaced_and_revoked(
    s3_server: LocalS3Server, user: RotatingUser, remote: list[str], reference: list[list[int]]
) -> None:
    asked: list[str] = []

    def provider() -> TemporaryCredentials:
        key, secret = user.current
        asked.append(key)
        # Far from expiry: only the refusal of the revoked key can make the engine ask again.
        expiry = datetime.datetime.now(datetime.timezone.utc) + datetime.timedelta(hours=1)
        return TemporaryCredentials(key, secret, expiry=expiry)

    data = TrainingData(
        s3_base_url=s3_server.endpoint_url, region=s3_server.region, credential_provider=provider, retry=QUICK
    )

    def rotate(index: int) -> None:
        if index in (2, 8):
            user.rotate()

    got = read_all(data, remote, rotate)
    assert got == reference
    # Asked once at the start and once after each revocation: the refused requests were retried
    # with the new keys, and nothing else asked.
    assert len(asked) == 3, asked
    assert asked[1] == user.revoked[0] or asked[1] != asked[0]
    assert len(set(asked)) == 3
    assert "credential_provider" in repr(data)


def test_credentials_are_fetched_again_before_they_expire(
    s3_server: LocalS3Server, user: RotatingUser, remote: list[str], reference: list[list[int]]
) -> None:
    import time

    asked: list[float] = []

    def provider() -> TemporaryCredentials:
        key, secret = user.current
        asked.append(time.monotonic())
        # Two seconds of life: asked again after one, with the same (still valid) keys.
        expiry = datetime.datetime.now(datetime.timezone.utc) + datetime.timedelta(seconds=2)
        return TemporaryCredentials(key, secret, "", expiry=expiry)

    data = TrainingData(
        s3_base_url=s3_server.endpoint_url, region=s3_server.region, credential_provider=provider, retry=QUICK
    )
    got = read_all(data, remote, lambda index: time.sleep(0.6) if index in (1, 2, 3) else None)
    assert got == reference
    assert len(asked) >= 2, "credentials were not fetched again before they expired"
    assert not user.revoked


def test_a_web_identity_token_file_continues_exactly_when_token_and_keys_rotate(
    tmp_path: Path,
    bare_env: pytest.MonkeyPatch,
    s3_server: LocalS3Server,
    user: RotatingUser,
    remote: list[str],
    reference: list[list[int]],
) -> None:
    token = tmp_path / "token"
    token.write_text("web-identity-token-1")
    certificate = self_signed_certificate(tmp_path)
    role = "arn:aws:iam::123456789012:role/trainer"
    with StsStandIn(user, token, certificate) as sts:
        bare_env.setenv("AWS_WEB_IDENTITY_TOKEN_FILE", str(token))
        bare_env.setenv("AWS_ROLE_ARN", role)
        bare_env.setenv("AWS_ENDPOINT_URL_STS", sts.endpoint_url)
        bare_env.setenv("AWS_CA_BUNDLE", str(certificate[0]))
        data = TrainingData(s3_base_url=s3_server.endpoint_url, region=s3_server.region, retry=QUICK)
        assert "AWS chain" in repr(data)

        def rotate(index: int) -> None:
            if index == 3:
                # The projected token is renewed and the role's keys change; the old ones stop working.
                token.write_text("web-identity-token-2")
                user.rotate()

        got = read_all(data, remote, rotate)
    assert got == reference
    assert sts.calls == 2, (sts.calls, sts.refused)
    assert sts.refused == 0
    assert sts.roles == [role, role]


def test_container_credentials_from_the_chain(
    tmp_path: Path,
    bare_env: pytest.MonkeyPatch,
    s3_server: LocalS3Server,
    user: RotatingUser,
    remote: list[str],
    reference: list[list[int]],
) -> None:
    authorization = tmp_path / "authorization"
    authorization.write_text("pod-token")
    seen: list[str | None] = []

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            seen.append(self.headers.get("Authorization"))
            key, secret = user.current
            expiry = datetime.datetime.now(datetime.timezone.utc) + datetime.timedelta(hours=1)
            body = json.dumps(
                {
                    "AccessKeyId": key,
                    "SecretAccessKey": secret,
                    "Token": "",
                    "Expiration": expiry.strftime("%Y-%m-%dT%H:%M:%SZ"),
                }
            ).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        bare_env.setenv(
            "AWS_CONTAINER_CREDENTIALS_FULL_URI", f"http://127.0.0.1:{server.server_address[1]}/v1"
        )
        bare_env.setenv("AWS_CONTAINER_AUTHORIZATION_TOKEN_FILE", str(authorization))
        data = TrainingData(s3_base_url=s3_server.endpoint_url, region=s3_server.region, retry=QUICK)
        assert read_all(data, remote) == reference
    finally:
        server.shutdown()
        server.server_close()
    assert seen
    assert set(seen) == {"pod-token"}


def test_profiles_of_the_shared_files(
    tmp_path: Path,
    bare_env: pytest.MonkeyPatch,
    s3_server: LocalS3Server,
    user: RotatingUser,
    remote: list[str],
    reference: list[list[int]],
) -> None:
    aws = Path(os.environ["HOME"]) / ".aws"
    aws.mkdir()
    key, secret = user.current
    (aws / "credentials").write_text(
        f"[default]\naws_access_key_id = WRONGKEY\naws_secret_access_key = wrong\n\n"
        f"[train]\naws_access_key_id = {key}\naws_secret_access_key = {secret}\n"
    )
    # credential_process: a program printing version 1 credential JSON.
    program = tmp_path / "print-credentials.py"
    program.write_text(
        "import json, pathlib, sys\n"
        "key, secret = pathlib.Path(sys.argv[1]).read_text().split()\n"
        "print(json.dumps({'Version': 1, 'AccessKeyId': key, 'SecretAccessKey': secret,\n"
        "                  'Expiration': '2099-01-01T00:00:00Z'}))\n"
    )
    keys_file = tmp_path / "current-keys"
    keys_file.write_text(f"{key} {secret}")
    (aws / "config").write_text(
        f"[profile process]\ncredential_process = {sys.executable} {program} {keys_file}\n"
        "[profile single-sign-on]\nsso_session = corp\n"
    )
    endpoint = {"s3_base_url": s3_server.endpoint_url, "region": s3_server.region, "retry": QUICK}
    assert read_all(TrainingData(profile="train", **endpoint), remote) == reference
    bare_env.setenv("AWS_PROFILE", "train")
    assert read_all(TrainingData(**endpoint), remote) == reference
    bare_env.delenv("AWS_PROFILE")
    assert read_all(TrainingData(profile="process", **endpoint), remote) == reference
    # The default profile's keys are wrong: refused, naming nothing secret.
    with pytest.raises(AccessDeniedError) as refused:
        read_all(TrainingData(**endpoint), remote)
    assert "WRONGKEY" not in str(refused.value)
    with pytest.raises(AccessDeniedError, match="sso_session.*credential_provider"):
        read_all(TrainingData(profile="single-sign-on", **endpoint), remote)
    with pytest.raises(AccessDeniedError, match="profile 'absent' is in neither"):
        read_all(TrainingData(profile="absent", **endpoint), remote)


def test_without_any_credentials_the_first_request_names_the_chain(
    bare_env: pytest.MonkeyPatch, s3_prefix: str
) -> None:
    data = TrainingData(s3_base_url="https://sk-SECRETTOKEN.example", retry=QUICK)
    with pytest.raises(AccessDeniedError, match="no AWS credentials found") as info:
        read_all(data, [f"{s3_prefix}part-0.parquet"])
    assert "SECRETTOKEN" not in str(info.value)


def test_revoked_keys_are_retried_once_and_never_shown(
    s3_server: LocalS3Server, user: RotatingUser, remote: list[str]
) -> None:
    key, secret = user.current
    user.rotate()  # the provider keeps handing out the revoked key
    asked = []

    def provider() -> TemporaryCredentials:
        asked.append(1)
        return TemporaryCredentials(key, secret, "a-session-token")

    data = TrainingData(
        s3_base_url=s3_server.endpoint_url, region=s3_server.region, credential_provider=provider, retry=QUICK
    )
    with pytest.raises(AccessDeniedError) as info:
        read_all(data, remote)
    # The protocol: a refused request is retried once, with credentials fetched anew unless a
    # refusal since it was signed fetched them already. Open inspects the shards concurrently, so
    # how many refusals overlap depends on timing: at least one fetch after the first, and at
    # most one per request in flight (one per shard), never a loop.
    assert 2 <= len(asked) <= 1 + len(remote)
    for secret_text in (key, secret, "a-session-token"):
        assert secret_text not in str(info.value)
        assert secret_text not in repr(data)


def test_a_failing_provider_fails_the_open_naming_it(s3_server: LocalS3Server, remote: list[str]) -> None:
    def provider() -> TemporaryCredentials:
        raise RuntimeError("the vault is sealed")

    data = TrainingData(
        s3_base_url=s3_server.endpoint_url, region=s3_server.region, credential_provider=provider, retry=QUICK
    )
    with pytest.raises(AccessDeniedError, match="credential provider failed.*the vault is sealed"):
        read_all(data, remote)

    def wrong() -> Any:
        return ("key", "secret")

    data = TrainingData(
        s3_base_url=s3_server.endpoint_url, region=s3_server.region, credential_provider=wrong, retry=QUICK
    )
    with pytest.raises(AccessDeniedError, match="expected TemporaryCredentials"):
        read_all(data, remote)


def test_a_spawned_process_is_told_a_provider_does_not_travel(tmp_path: Path) -> None:
    import pickle
    import subprocess

    data = TrainingData(
        s3_base_url="http://127.0.0.1:9", credential_provider=lambda: TemporaryCredentials("a", "b")
    )
    pickled = tmp_path / "storage.pickle"
    pickled.write_bytes(pickle.dumps(data.storage_config))
    child = (
        "import pickle, sys\n"
        "from o41_training_data import ConfigError\n"
        "try:\n"
        "    pickle.loads(open(sys.argv[1], 'rb').read()).core()\n"
        "except ConfigError as err:\n"
        "    print(err)\n"
    )
    # Keys in the worker's environment do not stand in for the provider, nor are they offered.
    env = {**os.environ, "AWS_ACCESS_KEY_ID": "k", "AWS_SECRET_ACCESS_KEY": "s"}
    out = subprocess.run(
        [sys.executable, "-c", child, str(pickled)], env=env, capture_output=True, text=True, check=True
    ).stdout
    assert "the credential_provider for http://127.0.0.1:9 does not travel in pickles" in out
    assert "AWS_ACCESS_KEY_ID" not in out


def test_credential_settings_are_checked_when_given() -> None:
    with pytest.raises(ConfigError, match="secret_access_key"):
        TrainingData(access_key_id="AKIA")
    with pytest.raises(ConfigError, match="one source of credentials"):
        TrainingData(profile="p", credential_provider=lambda: TemporaryCredentials("a", "b"))
    with pytest.raises(ConfigError, match="credential_provider"):
        TrainingData(credential_provider="not callable")  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="timezone-aware"):
        TemporaryCredentials("a", "b", expiry=datetime.datetime(2030, 1, 1))
    with pytest.raises(ConfigError, match="ca_bundle"):
        TrainingData(ca_bundle="/nonexistent/ca.pem")
    assert "secret" not in repr(TemporaryCredentials("AKIA", "secret", "token"))


class _ConnectRecorder:
    """An HTTP proxy that records the target of each CONNECT and refuses it."""

    def __init__(self) -> None:
        self.targets: list[str] = []
        self._sock = socket.create_server(("127.0.0.1", 0))
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._sock.getsockname()[1]}"

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self._sock.accept()
            except OSError:
                return
            with conn:
                line = conn.makefile("rb").readline().decode(errors="replace").split()
                if len(line) >= 2 and line[0] == "CONNECT":
                    self.targets.append(line[1])
                conn.sendall(b"HTTP/1.1 403 Forbidden\r\nContent-Length: 0\r\n\r\n")

    def close(self) -> None:
        self._sock.close()


def test_without_an_endpoint_s3_is_aws_in_the_region_with_virtual_hosted_names(
    bare_env: pytest.MonkeyPatch,
) -> None:
    proxy = _ConnectRecorder()
    bare_env.setenv("HTTPS_PROXY", proxy.url)
    bare_env.delenv("NO_PROXY", raising=False)
    bare_env.delenv("no_proxy", raising=False)
    try:
        data = TrainingData(
            region="eu-west-1",
            access_key_id="AKIAEXAMPLE",
            secret_access_key="example",
            retry=RetryPolicy(max_consecutive_failures=1, initial_backoff_s=0, max_backoff_s=0),
        )
        assert repr(data).startswith("TrainingData(s3=AWS, region='eu-west-1'")
        for uri in ("s3://training-corpus/a.parquet", "s3://corpus.with.dots/a.parquet"):
            with pytest.raises(Exception):  # noqa: B017, PT011 (the proxy refuses; only the target matters)
                read_all(data, [uri])
    finally:
        proxy.close()
    assert proxy.targets[0] == "training-corpus.s3.eu-west-1.amazonaws.com:443"
    assert proxy.targets[-1] == "s3.eu-west-1.amazonaws.com:443"


@pytest.fixture
def moto_https(tmp_path: Path) -> Iterator[tuple[str, Path]]:
    """moto (another S3 server, and an STS) on https://127.0.0.1:PORT; yields (url, CA file)."""
    import ssl
    import subprocess
    import time
    import urllib.request

    ca, cert, key = self_signed_certificate(tmp_path)
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
    log = (tmp_path / "moto.log").open("wb")
    server = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "moto.server",
            "-H",
            "127.0.0.1",
            "-p",
            str(port),
            "-c",
            str(cert),
            "-k",
            str(key),
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
        env=env,
    )
    url = f"https://127.0.0.1:{port}"
    context = ssl.create_default_context(cafile=str(ca))
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                urllib.request.urlopen(f"{url}/moto-api/", context=context, timeout=2).read()
                break
            except OSError:
                if time.monotonic() > deadline or server.poll() is not None:
                    raise RuntimeError(f"moto did not start: {(tmp_path / 'moto.log').read_text()}") from None
                time.sleep(0.2)
        yield url, ca
    finally:
        server.terminate()
        server.wait(timeout=10)
        log.close()


def test_moto_over_https_with_a_private_ca_and_temporary_credentials(
    tmp_path: Path, bare_env: pytest.MonkeyPatch, moto_https: tuple[str, Path]
) -> None:
    """Another S3 server, over TLS a private CA signed, read with credentials that carry a session token.

    (moto's STS is not the web identity test's stand-in: moto 5 routes an unsigned STS request
    by an ``Action`` in a form body only, and the web identity provider sends it in the query
    string, which AWS STS also accepts.)
    """
    import boto3

    url, ca = moto_https
    client = boto3.client(
        "s3",
        endpoint_url=url,
        region_name="us-east-1",
        aws_access_key_id="moto",
        aws_secret_access_key="moto",
        verify=str(ca),
    )
    client.create_bucket(Bucket="corpus")
    local = []
    for k in range(3):
        path = write_shard(
            tmp_path / f"m-{k}.parquet",
            "parquet",
            [{"v": k * 1000 + i} for i in range(100)],
            row_group_rows=32,
        )
        local.append(str(path))
        client.upload_file(str(path), "corpus", f"m-{k}.parquet")
    client.close()
    remote = [f"s3://corpus/m-{k}.parquet" for k in range(3)]

    def provider() -> TemporaryCredentials:
        expiry = datetime.datetime.now(datetime.timezone.utc) + datetime.timedelta(hours=1)
        return TemporaryCredentials("ASIAMOTOEXAMPLE", "moto-secret", "moto-session-token", expiry=expiry)

    bare_env.setenv("AWS_CA_BUNDLE", str(ca))
    data = TrainingData(s3_base_url=url, credential_provider=provider, retry=QUICK)
    assert read_all(data, remote) == read_all(TrainingData(), local)
    # Without the CA the server's certificate is not trusted: refused, not retried for long.
    bare_env.delenv("AWS_CA_BUNDLE")
    untrusted = TrainingData(
        s3_base_url=url,
        credential_provider=provider,
        retry=RetryPolicy(max_consecutive_failures=2, initial_backoff_s=0, max_backoff_s=0),
    )
    with pytest.raises(StorageError, match="certificate|UnknownIssuer|error sending request"):
        read_all(untrusted, remote)


def test_a_redirect_to_another_region_fails_at_once_naming_region(bare_env: pytest.MonkeyPatch) -> None:
    requests: list[str] = []

    class Redirect(BaseHTTPRequestHandler):
        def answer(self) -> None:
            requests.append(self.command)
            # As AWS answers a request for a bucket of another region: 301, no Location header.
            body = b"<Error><Code>PermanentRedirect</Code><Endpoint>b.s3.eu-west-1.amazonaws.com</Endpoint>"
            self.send_response(301)
            self.send_header("Content-Length", str(len(body)) if self.command != "HEAD" else "0")
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(body)

        do_GET = do_HEAD = answer  # noqa: N815 (the standard library's names)

        def log_message(self, format: str, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Redirect)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        data = TrainingData(
            s3_base_url=f"http://127.0.0.1:{server.server_address[1]}",
            access_key_id="AKIAEXAMPLE",
            secret_access_key="example",
        )
        with pytest.raises(StorageError, match="set region to the bucket's"):
            read_all(data, ["s3://b/a.parquet"])
    finally:
        server.shutdown()
        server.server_close()
    assert len(requests) == 1  # not retried: the default policy would send 64
