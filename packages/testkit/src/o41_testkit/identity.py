"""Credentials that change under a running stream.

A SeaweedFS user whose keys are rotated and revoked through the server's IAM API, and a local
HTTPS stand-in for AWS STS answering ``AssumeRoleWithWebIdentity`` with that user's current keys.

The STS stand-in speaks the documented protocol (a form POST, the XML answer of the STS API
reference) over TLS with a certificate made here, because the web identity provider of the
engine's S3 library refuses plain HTTP. It accepts only the token now in the token file, as
AWS accepts only an unexpired projected token.
"""

from __future__ import annotations

import datetime
import ipaddress
import json
import ssl
import threading
import time
import urllib.parse
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from o41_training_data._local_s3 import LocalS3Server

__all__ = ["RotatingUser", "StsStandIn", "self_signed_certificate"]

# How long an IAM change may take to reach the S3 API before the test kit calls the server broken.
_PROPAGATION_LIMIT_S = 60.0
_ALLOW_ALL = json.dumps(
    {"Version": "2012-10-17", "Statement": [{"Effect": "Allow", "Action": "s3:*", "Resource": "*"}]}
)


class RotatingUser:
    """An IAM user of ``server`` with full S3 access whose key can be replaced and the old one revoked.

    ``current`` is the key in force, ``(access_key_id, secret_access_key)``; :meth:`rotate` makes
    a new one and revokes the old, and returns once the server honours both.

    The server applies IAM changes a moment after it answers them (it reloads its identities from
    its filer), longer under load; a test that rotates mid-stream and counts the requests the
    rotation refused needs the change in force when ``rotate`` returns, so each change is polled
    until the S3 API shows it.
    """

    def __init__(self, server: LocalS3Server, name: str) -> None:
        import boto3

        self._iam = boto3.client(
            "iam",
            endpoint_url=server.endpoint_url,
            region_name=server.region,
            aws_access_key_id=server.access_key_id,
            aws_secret_access_key=server.secret_access_key,
        )
        self._server = server
        self.name = name
        self._iam.create_user(UserName=name)
        self._iam.put_user_policy(UserName=name, PolicyName="all-s3", PolicyDocument=_ALLOW_ALL)
        self.current = self._new_key()
        self.revoked: list[str] = []
        self._wait_until(self.current, accepted=True)

    def _new_key(self) -> tuple[str, str]:
        key = self._iam.create_access_key(UserName=self.name)["AccessKey"]
        return str(key["AccessKeyId"]), str(key["SecretAccessKey"])

    def rotate(self) -> tuple[str, str]:
        """Creates a new key, revokes the one in force, and returns the new one."""
        old = self.current
        new = self._new_key()
        self._wait_until(new, accepted=True)
        self._iam.delete_access_key(UserName=self.name, AccessKeyId=old[0])
        self._wait_until(old, accepted=False)
        self.current = new
        self.revoked.append(old[0])
        return self.current

    def _accepted(self, key: tuple[str, str]) -> bool:
        import boto3
        from botocore.exceptions import ClientError

        client = boto3.client(
            "s3",
            endpoint_url=self._server.endpoint_url,
            region_name=self._server.region,
            aws_access_key_id=key[0],
            aws_secret_access_key=key[1],
        )
        try:
            client.list_buckets()
        except ClientError:
            return False
        finally:
            client.close()
        return True

    def _wait_until(self, key: tuple[str, str], *, accepted: bool) -> None:
        deadline = time.monotonic() + _PROPAGATION_LIMIT_S
        while self._accepted(key) != accepted:
            if time.monotonic() > deadline:
                state = "accept" if accepted else "refuse"
                raise TimeoutError(
                    f"the S3 server did not {state} key {key[0]} within {_PROPAGATION_LIMIT_S} s"
                )
            time.sleep(0.05)

    def close(self) -> None:
        """Closes the IAM client."""
        self._iam.close()


def self_signed_certificate(directory: Path) -> tuple[Path, Path, Path]:
    """A private CA and a server certificate for 127.0.0.1 it signed, as PEM files in ``directory``.

    Returns (CA certificate, server certificate, server key). TLS clients refuse a CA certificate
    presented as the server's own, hence the two.
    """
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    now = datetime.datetime.now(datetime.timezone.utc)
    valid = (now - datetime.timedelta(minutes=5), now + datetime.timedelta(days=1))
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "o41 test CA")])
    ca = (
        x509.CertificateBuilder()
        .subject_name(ca_name)
        .issuer_name(ca_name)
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(valid[0])
        .not_valid_after(valid[1])
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=False,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=True,
                crl_sign=True,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .sign(ca_key, hashes.SHA256())
    )
    key = ec.generate_private_key(ec.SECP256R1())
    server = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "127.0.0.1")]))
        .issuer_name(ca_name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(valid[0])
        .not_valid_after(valid[1])
        .add_extension(
            x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]), False
        )
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    ca_path, cert_path, key_path = (
        directory / "ca.pem",
        directory / "server-cert.pem",
        directory / "server-key.pem",
    )
    ca_path.write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    cert_path.write_bytes(server.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )
    )
    return ca_path, cert_path, key_path


class StsStandIn:
    """``AssumeRoleWithWebIdentity`` on ``https://127.0.0.1:PORT``, answering ``user``'s current key.

    ``token_file`` holds the token it accepts (read at each request); ``lifetime`` is how long
    the answered credentials are said to last. ``calls`` counts the answered requests and
    ``refused`` the requests with another token. ``certificate`` is what
    :func:`self_signed_certificate` returns; clients trust its CA. Use as a context manager.
    """

    def __init__(
        self,
        user: RotatingUser,
        token_file: Path,
        certificate: tuple[Path, Path, Path],
        lifetime: datetime.timedelta = datetime.timedelta(hours=1),
    ) -> None:
        self.user, self.token_file, self.lifetime = user, token_file, lifetime
        self.calls = 0
        self.refused = 0
        self.roles: list[str] = []
        stand_in = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                # The STS query API takes its parameters in the query string or a form body.
                length = int(self.headers.get("Content-Length", "0"))
                form = urllib.parse.parse_qs(urllib.parse.urlsplit(self.path).query)
                form.update(urllib.parse.parse_qs(self.rfile.read(length).decode()))
                self._answer(*stand_in._answer(form))

            def _answer(self, status: int, body: str) -> None:
                data = body.encode()
                self.send_response(status)
                self.send_header("Content-Type", "text/xml")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(str(certificate[1]), str(certificate[2]))
        self._server.socket = context.wrap_socket(self._server.socket, server_side=True)
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    @property
    def endpoint_url(self) -> str:
        """``https://127.0.0.1:PORT``."""
        return f"https://127.0.0.1:{self._server.server_address[1]}"

    def _answer(self, form: dict[str, list[str]]) -> tuple[int, str]:
        field = {k: v[0] for k, v in form.items()}
        if field.get("Action") != "AssumeRoleWithWebIdentity":
            return 400, _error("InvalidAction", f"unknown action {field.get('Action')!r}")
        if field.get("WebIdentityToken", "").strip() != self.token_file.read_text().strip():
            self.refused += 1
            return 400, _error("InvalidIdentityToken", "the token is not the current one")
        self.calls += 1
        self.roles.append(field.get("RoleArn", ""))
        key, secret = self.user.current
        expiry = datetime.datetime.now(datetime.timezone.utc) + self.lifetime
        return 200, (
            '<AssumeRoleWithWebIdentityResponse xmlns="https://sts.amazonaws.com/doc/2011-06-15/">'
            "<AssumeRoleWithWebIdentityResult><Credentials>"
            f"<AccessKeyId>{key}</AccessKeyId><SecretAccessKey>{secret}</SecretAccessKey>"
            # Empty: the keys are a plain IAM user's, and SeaweedFS refuses a session token
            # that it did not issue (the engine sends no token header for an empty one).
            "<SessionToken></SessionToken>"
            f"<Expiration>{expiry.strftime('%Y-%m-%dT%H:%M:%SZ')}</Expiration>"
            "</Credentials></AssumeRoleWithWebIdentityResult>"
            "</AssumeRoleWithWebIdentityResponse>"
        )

    def __enter__(self) -> StsStandIn:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join()


def _error(code: str, message: str) -> str:
    return (
        '<ErrorResponse xmlns="https://sts.amazonaws.com/doc/2011-06-15/">'
        f"<Error><Type>Sender</Type><Code>{code}</Code><Message>{message}</Message></Error>"
        "</ErrorResponse>"
    )
