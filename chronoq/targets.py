"""gRPC targets from ``host:port`` addresses: one server, or several to spread over and fail over.

gRPC takes several addresses as one ``ipv4:a:1,b:2`` target, but that scheme takes literal
addresses only, so names (docker-compose services, DNS) are resolved once, when the target is
made. Used for chronoq nodes (clients, workers, the CLI) and for etcd members.
"""

from __future__ import annotations

import socket
from collections.abc import Sequence

from chronoq.errors import ConfigError

#: Targets in gRPC's own syntax pass through untouched.
GRPC_SCHEMES = ("ipv4:", "ipv6:", "dns:", "unix:", "unix-abstract:", "vsock:")


def split_addresses(addresses: str | Sequence[str]) -> list[str]:
    """``"a:1, b:2"`` or ``["a:1", "b:2"]`` as a list of non-empty addresses."""
    items = addresses.split(",") if isinstance(addresses, str) else list(addresses)
    return [a.strip() for a in items if a.strip()]


def host_port(address: str, what: str) -> tuple[str, int]:
    """``host:port`` (``[v6]:port`` too) as its parts; ``ConfigError`` naming ``what`` if not."""
    host, sep, port = address.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ConfigError(f"{what} {address!r} is not host:port")
    return host, int(port)


def grpc_target(addresses: str | Sequence[str], what: str = "address") -> str:
    """The gRPC target of one address (as given) or of several (``ipv4:``, names resolved);
    a target already in gRPC syntax (``dns:///…``, ``ipv4:…``) as it is.

    Args:
        addresses: ``host:port`` items, as a list or one comma-separated string.
        what: names the addresses in error messages, e.g. ``"etcd endpoint"``.
    """
    if isinstance(addresses, str) and addresses.strip().startswith(GRPC_SCHEMES):
        return addresses.strip()
    items = split_addresses(addresses)
    if not items:
        raise ConfigError(f"at least one {what} is needed")
    if len(items) == 1:
        return items[0]
    parsed = [host_port(a, what) for a in items]
    return "ipv4:" + ",".join(f"{_ipv4(h, p, what)}:{p}" for h, p in parsed)


def node_targets(target: str, what: str = "node address") -> list[str]:
    """One gRPC target per server, for clients that keep a channel per node and choose among
    them: ``"a:1,b:2"`` and ``"ipv4:10.0.0.1:1,10.0.0.2:2"`` give one target per address
    (names are left to gRPC's resolver); any other gRPC target (``dns:///…``) is one target.
    """
    stripped = target.strip()
    for scheme in ("ipv4:", "ipv6:"):
        if stripped.startswith(scheme):
            return [scheme + a for a in split_addresses(stripped.removeprefix(scheme))]
    if stripped.startswith(GRPC_SCHEMES):
        return [stripped]
    items = split_addresses(stripped)
    if not items:
        raise ConfigError(f"at least one {what} is needed")
    if len(items) > 1:
        for item in items:
            host_port(item, what)
    return items


def is_several(target: str) -> bool:
    """Whether a target from ``grpc_target`` lists more than one server."""
    return target.startswith("ipv4:") and "," in target


def first_host(addresses: str | Sequence[str]) -> str:
    """The host of the first address: the name TLS checks certificates against when a target
    lists several (an ``ipv4:`` target has no name of its own)."""
    return split_addresses(addresses)[0].rpartition(":")[0].strip("[]")


def _ipv4(host: str, port: int, what: str) -> str:
    try:
        infos = socket.getaddrinfo(host.strip("[]"), port, socket.AF_INET, socket.SOCK_STREAM)
    except socket.gaierror as exc:
        raise ConfigError(f"{what} {host}:{port}: cannot resolve {host!r} ({exc})") from None
    return str(infos[0][4][0])
