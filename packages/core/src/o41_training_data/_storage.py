"""Storage settings: where ``s3://`` locations live and the credentials to reach them.

Credentials stay in this process. A :class:`StorageConfig` never shows them in its repr, and
its pickle (how a saver reaches ``ProcessPoolExecutor`` workers) carries only the endpoint,
region and profile name plus a one-process token: a forked worker finds the parent's
credentials (or credential provider) under that token in its copy of the parent's memory; a
spawned worker, which has no such copy, looks at the AWS chain or the standard ``AWS_*``
environment variables instead (docs/storage.md).
"""

from __future__ import annotations

import datetime
import hashlib
import ipaddress
import os
import posixpath
import secrets
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from . import _core
from ._errors import ConfigError, O41Error, invalid
from ._files import read_bytes
from ._limits import LIMITS

__all__ = ["CredentialProvider", "RetryPolicy", "StorageConfig", "TemporaryCredentials", "is_remote"]

# Credentials registered by this process (and inherited by forked children), by token.
_REGISTRY: dict[str, StorageConfig] = {}
_REGISTRY_LOCK = threading.Lock()


_MAX_SECONDS = LIMITS["max_retry_seconds"]
"""The longest timeout or backoff a retry policy takes, in seconds (about 31 years)."""
_MAX_FAILURES = LIMITS["max_retry_failures"]
_DEFAULTS = _core.retry_defaults()

MAX_CA_BUNDLE_BYTES = 16 << 20
"""Largest CA bundle read: the whole Mozilla bundle is about 220 KB, a corporate one a few MB."""


def _check_setting(name: str, value: object) -> None:
    """Refuses a region or credential that is not a string of visible characters.

    It travels in HTTP headers: a CR or LF there is refused by the engine too. The message does
    not repeat the value.
    """
    if not isinstance(value, str):
        raise invalid(name, f"expected a string, got {type(value).__name__}")
    if any(c.isspace() or not c.isprintable() for c in value):
        raise invalid(name, "it holds whitespace or control characters")


@dataclass(frozen=True)
class RetryPolicy:
    """When reads and writes of remote objects give up.

    A failed attempt is retried, resuming a read at its last received byte, until
    ``max_consecutive_failures`` attempts in a row fail or no byte arrives for
    ``no_progress_timeout_s`` seconds. ``read_timeout_s`` is how long an open response may stay
    silent before the attempt counts as failed. The defaults are the documented policy: 64
    failures or 15 minutes without progress.

    Examples:
        >>> RetryPolicy(max_consecutive_failures=8).no_progress_timeout_s
        900.0

    """

    # The engine's defaults (`_core.retry_defaults()`), written down once, there.
    max_consecutive_failures: int = int(_DEFAULTS["max_consecutive_failures"])
    no_progress_timeout_s: float = _DEFAULTS["no_progress_timeout_s"]
    read_timeout_s: float = _DEFAULTS["read_timeout_s"]
    connect_timeout_s: float = _DEFAULTS["connect_timeout_s"]
    initial_backoff_s: float = _DEFAULTS["initial_backoff_s"]
    max_backoff_s: float = _DEFAULTS["max_backoff_s"]

    def __post_init__(self) -> None:
        failures = self.max_consecutive_failures
        if isinstance(failures, bool) or not isinstance(failures, int) or not 1 <= failures <= _MAX_FAILURES:
            raise invalid(
                "retry.max_consecutive_failures",
                f"must be an integer from 1 to {_MAX_FAILURES}, got {failures!r}",
            )
        for name in (
            "no_progress_timeout_s",
            "read_timeout_s",
            "connect_timeout_s",
            "initial_backoff_s",
            "max_backoff_s",
        ):
            value = getattr(self, name)
            # The engine holds each as a Duration: finite, and far below its limit.
            if (
                isinstance(value, bool)
                or not isinstance(value, (int, float))
                or not 0 <= value <= _MAX_SECONDS
            ):
                raise invalid(
                    f"retry.{name}", f"must be a number of seconds from 0 to {_MAX_SECONDS}, got {value!r}"
                )


class Secret(str):
    """A credential: the string itself for whoever uses it, ``<redacted>`` in every repr.

    ``vars()``, ``repr()`` of a settings object and tracebacks that show locals print the repr.
    """

    __slots__ = ()

    def __repr__(self) -> str:
        return "Secret(<redacted>)"


def _secret(value: str | None) -> str | None:
    return None if value is None or isinstance(value, Secret) else Secret(value)


class Endpoint(str):
    """An object storage endpoint: the URL itself for whoever uses it.

    Reprs show a host name redacted (see :func:`_shown_endpoint`).
    """

    __slots__ = ()

    def __repr__(self) -> str:
        return repr(_shown_endpoint(self))


class _Held:
    """The engine's storage object of one process, with a repr that shows no setting."""

    __slots__ = ("pid", "storage")

    def __init__(self, pid: int, storage: _core.Storage) -> None:
        self.pid, self.storage = pid, storage

    def __repr__(self) -> str:
        return "<engine storage>"


def _check_endpoint(url: str) -> None:
    """Refuses an endpoint that is not ``scheme://host[:port]``: anything else may hide a secret.

    Credentials (``user:password@``), a path, a query or a fragment would show in reprs, pickles
    and logs. The message never repeats the URL.
    """

    def refuse(what: str) -> None:
        error = ConfigError(
            f"invalid s3_base_url: it carries {what}, which would show in reprs, pickles and logs; "
            "an endpoint is scheme://host[:port] (pass credentials as access_key_id and "
            "secret_access_key)"
        )
        error.option = "s3_base_url"
        raise error

    if not isinstance(url, str):
        refuse("no URL")
    scheme, separator, rest = url.partition("://")
    if not separator or scheme not in ("http", "https"):
        refuse("no http:// or https:// scheme")
    authority, _, path = rest.partition("/")
    if "@" in authority:
        refuse("credentials (user:password@host)")
    if "?" in url or "#" in url:
        refuse("a query or fragment")
    if path:
        refuse("a path")
    if not authority or any(c in authority for c in " \t\r\n\\"):
        refuse("no valid host")


def _shown_endpoint(url: str) -> str:
    """The endpoint as reprs and messages show it.

    An IP address or localhost as it is; any other host name redacted (a name may carry a token)
    but for a digest that tells two endpoints apart.
    """
    scheme, _, authority = url.partition("://")
    authority = authority.rstrip("/")
    host, colon, port = authority.rpartition(":") if not authority.endswith("]") else (authority, "", "")
    if not colon:
        host, port = authority, ""
    bare = host.strip("[]")
    try:
        ipaddress.ip_address(bare)
        plain = True
    except ValueError:
        plain = bare == "localhost"
    if plain:
        return url.rstrip("/")
    digest = hashlib.sha256(host.encode()).hexdigest()[:8]
    return f"{scheme}://<host {digest}>" + (f":{port}" if colon else "")


def _env(*names: str) -> str | None:
    for name in names:
        value = os.environ.get(name)
        if value:
            return value
    return None


@dataclass(frozen=True, repr=False)
class TemporaryCredentials:
    """Credentials a ``credential_provider`` returns, with the time they stop working.

    ``expiry`` is a timezone-aware time (or None for keys that do not expire). The engine asks
    the provider again five minutes before it, or halfway through their lifetime when that is
    sooner; never shown in a repr.

    Examples:
        >>> import datetime
        >>> expiry = datetime.datetime(2030, 1, 1, tzinfo=datetime.timezone.utc)
        >>> TemporaryCredentials("AKIA...", "...", "token", expiry=expiry)
        TemporaryCredentials(<redacted>, expiry=2030-01-01T00:00:00+00:00)

    """

    access_key_id: str
    secret_access_key: str
    session_token: str | None = None
    expiry: datetime.datetime | None = None

    def __post_init__(self) -> None:
        for name in ("access_key_id", "secret_access_key", "session_token"):
            value = getattr(self, name)
            if value is None and name == "session_token":
                continue
            _check_setting(f"credential_provider.{name}", value)
            if not value and name != "session_token":
                raise invalid(f"credential_provider.{name}", "must not be empty")
            object.__setattr__(self, name, _secret(value))
        expiry = self.expiry
        if expiry is not None and (not isinstance(expiry, datetime.datetime) or expiry.tzinfo is None):
            raise invalid(
                "credential_provider.expiry",
                f"expected a timezone-aware datetime or None, got {expiry!r}",
            )

    def __repr__(self) -> str:
        shown = "never" if self.expiry is None else self.expiry.isoformat()
        return f"TemporaryCredentials(<redacted>, expiry={shown})"


CredentialProvider = Callable[[], TemporaryCredentials]
"""A function returning fresh :class:`TemporaryCredentials`; called from an engine thread."""


def _provider_answer(
    provider: CredentialProvider,
) -> Callable[[], tuple[str, str, str | None, float | None]]:
    """The provider as the engine calls it: the answer checked here and flattened to a tuple."""

    def call() -> tuple[str, str, str | None, float | None]:
        got = provider()
        if not isinstance(got, TemporaryCredentials):
            raise TypeError(f"it returned {type(got).__name__}, expected TemporaryCredentials")
        expiry = None if got.expiry is None else got.expiry.timestamp()
        return (got.access_key_id, got.secret_access_key, got.session_token, expiry)

    return call


@dataclass(frozen=True, repr=False)
class StorageConfig:
    """Object storage settings; ``StorageConfig()`` with nothing set serves local paths only.

    Build one through :class:`TrainingData` (``training_data.storage_config``), which serves
    ``s3://`` too: at ``s3_base_url`` (or ``AWS_ENDPOINT_URL_S3``/``AWS_ENDPOINT_URL``) when
    given, else at AWS S3 itself in ``region`` (or ``AWS_REGION``/``AWS_DEFAULT_REGION``,
    default ``us-east-1``). Credentials are static keys when given, a ``credential_provider``
    when given, else the standard AWS chain (docs/storage.md, "Credentials"). ``ca_bundle`` (or
    ``AWS_CA_BUNDLE``) names PEM certificates to trust besides the system's.

    Examples:
        >>> StorageConfig()
        StorageConfig(local)

    """

    s3_base_url: str | None = None
    region: str | None = None
    access_key_id: str | None = field(default=None, compare=False)
    secret_access_key: str | None = field(default=None, compare=False)
    session_token: str | None = field(default=None, compare=False)
    retry: RetryPolicy = field(default_factory=RetryPolicy)
    profile: str | None = None
    credential_provider: CredentialProvider | None = field(default=None, compare=False)
    ca_bundle: str | None = None
    aws: bool = False
    # Set on a copy unpickled in a process that could not recover the credentials.
    _missing_credentials: str | None = field(default=None, compare=False)

    def __post_init__(self) -> None:
        if self.s3_base_url is not None:
            _check_endpoint(self.s3_base_url)
            object.__setattr__(self, "s3_base_url", Endpoint(self.s3_base_url))
        for name in ("access_key_id", "secret_access_key", "session_token"):
            object.__setattr__(self, name, _secret(getattr(self, name)))
        if self.has_s3 and (self.secret_access_key is not None or self.credential_provider is not None):
            # Registered now, before any worker is forked, so forked workers inherit the entry.
            token = secrets.token_hex(16)
            object.__setattr__(self, "_token", token)
            with _REGISTRY_LOCK:
                _REGISTRY[token] = self

    @classmethod
    def resolve(
        cls,
        s3_base_url: str | None = None,
        region: str | None = None,
        access_key_id: str | None = None,
        secret_access_key: str | None = None,
        session_token: str | None = None,
        retry: RetryPolicy | None = None,
        *,
        profile: str | None = None,
        credential_provider: CredentialProvider | None = None,
        ca_bundle: str | os.PathLike[str] | None = None,
    ) -> StorageConfig:
        """Settings from the arguments, falling back to the standard AWS environment variables."""
        endpoint = s3_base_url or _env("AWS_ENDPOINT_URL_S3", "AWS_ENDPOINT_URL")
        retry = RetryPolicy() if retry is None else retry
        if not isinstance(retry, RetryPolicy):
            raise invalid("retry", f"expected a RetryPolicy, got {type(retry).__name__}")
        for name, value in (
            ("region", region),
            ("access_key_id", access_key_id),
            ("secret_access_key", secret_access_key),
            ("session_token", session_token),
            ("profile", profile),
        ):
            if value is not None:
                _check_setting(name, value)
        if endpoint is not None:
            _check_endpoint(endpoint)
        if (access_key_id is None) != (secret_access_key is None):
            missing = "access_key_id" if access_key_id is None else "secret_access_key"
            raise invalid(missing, "static keys need both access_key_id and secret_access_key")
        if session_token is not None and access_key_id is None:
            raise invalid("session_token", "it goes with access_key_id and secret_access_key")
        chosen = [
            name
            for name, value in (
                ("access_key_id", access_key_id),
                ("profile", profile),
                ("credential_provider", credential_provider),
            )
            if value is not None
        ]
        if len(chosen) > 1:
            raise invalid(chosen[1], f"pass one source of credentials, not both {chosen[0]} and {chosen[1]}")
        if credential_provider is not None and not callable(credential_provider):
            raise invalid(
                "credential_provider",
                "expected a function returning TemporaryCredentials, got "
                f"{type(credential_provider).__name__}",
            )
        bundle = _env("AWS_CA_BUNDLE") if ca_bundle is None else os.fspath(ca_bundle)
        config = cls(
            s3_base_url=endpoint,
            region=region or _env("AWS_REGION", "AWS_DEFAULT_REGION") or "us-east-1",
            access_key_id=access_key_id,
            secret_access_key=secret_access_key,
            session_token=session_token,
            retry=retry,
            profile=profile,
            credential_provider=credential_provider,
            ca_bundle=bundle,
            aws=endpoint is None,
        )
        config.core()  # malformed settings fail here, not at the first read
        return config

    @property
    def has_s3(self) -> bool:
        """Whether ``s3://`` locations can be served."""
        return self.s3_base_url is not None or self.aws

    def core(self) -> _core.Storage:
        """The engine's storage object for these settings (built once per process)."""
        if self._missing_credentials is not None:
            raise ConfigError(self._missing_credentials)
        cached: _Held | None = self.__dict__.get("_core_storage")
        if cached is not None and cached.pid == os.getpid():
            return cached.storage
        bundle = None
        if self.ca_bundle is not None:
            # Bounded: a FIFO would block, /dev/zero would be read until memory ran out.
            try:
                bundle = read_bytes(Path(self.ca_bundle), ConfigError, "CA bundle", MAX_CA_BUNDLE_BYTES)
            except O41Error as err:
                raise invalid("ca_bundle", str(err)) from None
        provider = self.credential_provider
        r = self.retry
        storage = _core.Storage(
            self.s3_base_url,
            self.region,
            self.access_key_id,
            self.secret_access_key,
            self.session_token,
            aws=self.aws,
            profile=self.profile,
            credential_provider=None if provider is None else _provider_answer(provider),
            ca_bundle=bundle,
            max_consecutive_failures=r.max_consecutive_failures,
            no_progress_timeout_s=r.no_progress_timeout_s,
            read_timeout_s=r.read_timeout_s,
            connect_timeout_s=r.connect_timeout_s,
            initial_backoff_s=r.initial_backoff_s,
            max_backoff_s=r.max_backoff_s,
        )
        object.__setattr__(self, "_core_storage", _Held(os.getpid(), storage))
        return storage

    def _credential_kind(self) -> str:
        if self.credential_provider is not None:
            return "provider"
        if self.secret_access_key is not None:
            return "static"
        return "chain"

    def __repr__(self) -> str:
        if not self.has_s3:
            return "StorageConfig(local)"
        credentials = {
            "provider": "<credential_provider>",
            "static": "<redacted>",
            "chain": "<AWS chain>" if self.profile is None else f"<AWS profile {self.profile!r}>",
        }[self._credential_kind()]
        if self.s3_base_url is None:
            return f"StorageConfig(s3=AWS, region={self.region!r}, credentials={credentials})"
        endpoint = _shown_endpoint(self.s3_base_url)
        return f"StorageConfig(s3_base_url={endpoint!r}, region={self.region!r}, credentials={credentials})"

    def __reduce__(self) -> tuple[Any, ...]:
        if not self.has_s3:
            return (_restore, (None, self.retry, None))
        settings = {
            "s3_base_url": self.s3_base_url,
            "region": self.region,
            "profile": self.profile,
            "ca_bundle": self.ca_bundle,
            "kind": self._credential_kind(),
        }
        return (_restore, (settings, self.retry, self.__dict__.get("_token")))


def _restore(settings: dict[str, Any] | None, retry: RetryPolicy, token: str | None) -> StorageConfig:
    """Unpickles a :class:`StorageConfig`: the registered original, or one from the environment."""
    if settings is None:
        return StorageConfig(retry=retry)
    with _REGISTRY_LOCK:
        original = _REGISTRY.get(token or "")
    if original is not None:
        return original
    endpoint, kind = settings["s3_base_url"], settings["kind"]
    rebuilt = {
        "s3_base_url": endpoint,
        "region": settings["region"],
        "ca_bundle": settings["ca_bundle"],
        "aws": endpoint is None,
        "retry": retry,
    }
    if kind == "chain" or (kind == "static" and _env("AWS_ACCESS_KEY_ID") and _env("AWS_SECRET_ACCESS_KEY")):
        # The chain is looked at again here: the environment, profile files and roles of the
        # worker are what it would use had it been started alone.
        return StorageConfig(profile=settings["profile"], **rebuilt)
    where = "AWS S3" if endpoint is None else endpoint
    if kind == "provider":
        # A provider is code: nothing in the worker's environment stands in for it.
        missing = (
            f"storage: the credential_provider for {where} does not travel in pickles, and this "
            "process has no forked copy of it; use a fork-based process pool, or give the "
            "workers credentials they find themselves (a profile, the AWS chain)"
        )
    else:
        missing = (
            f"storage: the credentials for {where} do not travel in pickles, and this process "
            "has neither a forked copy of them nor AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY in its "
            "environment; use a fork-based process pool or set those variables for the workers"
        )
    return StorageConfig(**rebuilt, _missing_credentials=missing)


def is_remote(uri: str | os.PathLike[str]) -> bool:
    """True for ``s3://`` locations."""
    return str(uri).startswith("s3://")


def normalize(uri: str | os.PathLike[str], option: str = "location") -> str:
    """The engine's one spelling of a location (docs/storage.md, "Locations").

    Anything but a string or path, or one holding a NUL character, is a :class:`ConfigError`
    naming ``option``.

    An ``s3://`` location as given; a local path made absolute with ``.`` and ``..`` resolved
    lexically. Symbolic links are not followed, so a path names what the user wrote, as the
    engine's resolved documents and manifests do.
    """
    if not isinstance(uri, (str, os.PathLike)):
        raise invalid(option, f"expected a path or s3:// location, got {type(uri).__name__}")
    text = os.fspath(uri)
    if not isinstance(text, str) or "\0" in text:
        raise invalid(option, f"{text!r} is not a path (bytes, or a NUL character)")
    return _core.normalize_location(text)


def parent(uri: str) -> str:
    """The directory part of a location."""
    if is_remote(uri):
        return uri.rsplit("/", 1)[0]
    return str(Path(uri).parent)


def relative_location(target: str, base_dir: str) -> str:
    """``target`` relative to ``base_dir`` when both are in one store, else ``target`` itself."""
    if is_remote(target) != is_remote(base_dir):
        return target
    if is_remote(target):
        t_bucket, _, t_key = target[len("s3://") :].partition("/")
        b_bucket, _, b_key = base_dir[len("s3://") :].partition("/")
        if t_bucket != b_bucket:
            return target
        return posixpath.relpath("/" + t_key, "/" + b_key)
    return os.path.relpath(target, base_dir)
