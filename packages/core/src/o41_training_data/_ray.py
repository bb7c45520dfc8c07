"""Connecting to a Ray cluster for the work that outgrows one machine (manifests, tokenising).

``ray.init(address="host:port")`` keeps retrying an address where no cluster answers (minutes,
not seconds), so the address is first probed with a plain TCP connection under a timeout: an
unreachable cluster is a :class:`ConfigError` naming the address at once, not a hang.
"""

from __future__ import annotations

import socket

from ._errors import ConfigError

__all__ = ["CONNECT_TIMEOUT_S", "connect"]

CONNECT_TIMEOUT_S = 10.0
"""Seconds the first connection to a cluster's address may take."""


def _host_port(address: str) -> tuple[str, int] | None:
    """The ``(host, port)`` an address names, or ``None`` for ``auto``/``local`` (Ray finds those)."""
    if address in ("auto", "local"):
        return None
    rest = address.split("://", 1)[-1].rstrip("/")
    host, separator, port = rest.rpartition(":")
    if not separator or not port.isdigit() or not host:
        raise ConfigError(
            f"invalid ray_address: {address!r}; expected host:port, ray://host:port, auto or local"
        )
    return host.strip("[]"), int(port)


def connect(address: str, *, timeout_s: float = CONNECT_TIMEOUT_S) -> None:
    """Connects this process to the Ray cluster at ``address`` unless it already is connected."""
    import ray

    if ray.is_initialized():
        return
    target = _host_port(address)
    if target is not None:
        try:
            with socket.create_connection(target, timeout=timeout_s):
                pass
        except OSError as error:
            raise ConfigError(
                f"invalid ray_address: no Ray cluster answers at {address} within {timeout_s:g} s ({error})"
            ) from None
    try:
        ray.init(address=address, include_dashboard=False, log_to_driver=False, configure_logging=False)
    except (ConnectionError, TimeoutError) as error:
        raise ConfigError(
            f"invalid ray_address: cannot connect to the Ray cluster at {address}: {error}"
        ) from None
