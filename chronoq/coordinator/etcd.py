"""The etcd connection: endpoints, timeouts, keepalive, key layout and error translation.

Every call has a timeout (aetcd has none by default, and a frozen etcd would hang a node);
gRPC keepalive notices a silent server. Several endpoints go to gRPC as one ``ipv4:`` target,
whose default pick-first policy fails over to the next member when one dies.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence

import aetcd
import aetcd.exceptions

from chronoq.coordinator.credentials import read_password
from chronoq.coordinator.etcd_tls import EtcdClient
from chronoq.coordinator.settings import ClusterSettings as ClusterSettings
from chronoq.coordinator.settings import EtcdSettings as EtcdSettings
from chronoq.errors import ConfigError, CoordinatorUnavailable
from chronoq.targets import first_host, grpc_target, host_port
from chronoq.tls import channel_credentials

# etcd refuses pings more often than its --grpc-keepalive-min-time (5 s by default) with
# GOAWAY "too_many_pings", which resets the connection: ping every 5 s, give up after 2 s.
KEEPALIVE_OPTIONS = {
    "grpc.keepalive_time_ms": 5000,
    "grpc.keepalive_timeout_ms": 2000,
    "grpc.http2.ping_timeout_ms": 2000,
    "grpc.keepalive_permit_without_calls": 1,
    "grpc.http2.max_pings_without_data": 0,
    "grpc.initial_reconnect_backoff_ms": 100,
    "grpc.max_reconnect_backoff_ms": 1000,
}


def _target(endpoints: Sequence[str]) -> tuple[str, int]:
    """aetcd builds ``f"{host}:{port}"``; a multi-address ``ipv4:`` target fits that shape."""
    bare = [e.removeprefix("http://").removeprefix("https://") for e in endpoints]
    target = grpc_target(bare, what="etcd endpoint")
    if len(bare) == 1:
        host_port(target, "etcd endpoint")  # one endpoint goes as given: check its shape
    head, _, port = target.rpartition(":")
    return head, int(port)


def connect(settings: EtcdSettings) -> aetcd.Client:
    """An aetcd client (connects lazily) with timeouts and keepalive; TLS with ``ca_cert``."""
    host, port = _target(settings.endpoints)
    if settings.password is not None and settings.password_file is not None:
        raise ConfigError("give the etcd password or a password file, not both")
    password = settings.password
    if settings.password_file is not None:
        password = read_password(settings.password_file)
    if (settings.username is None) != (password is None):
        raise ConfigError("etcd username and password go together")
    tls = (
        settings.ca_cert
        or settings.cert_cert
        or settings.cert_key
        or any(e.startswith("https://") for e in settings.endpoints)  # system roots
    )
    options: dict[str, int | str] = dict(KEEPALIVE_OPTIONS)
    if tls and len(settings.endpoints) > 1:
        # An ipv4: target has no host name to check certificates against: every member's
        # certificate must then name the first endpoint's host (e.g. a shared DNS name or IP).
        first = settings.endpoints[0].removeprefix("http://").removeprefix("https://")
        options["grpc.ssl_target_name_override"] = first_host(first)
    return EtcdClient(
        credentials=channel_credentials(
            settings.ca_cert, settings.cert_cert, settings.cert_key, prefix="etcd"
        )
        if tls
        else None,
        host=host,
        port=port,
        username=settings.username,
        password=password,
        timeout=settings.timeout,
        options=options,
    )


@contextlib.contextmanager
def translated(what: str) -> Iterator[None]:
    """etcd client errors as ``CoordinatorUnavailable`` (the one place they are translated)."""
    try:
        yield
    except (aetcd.exceptions.ClientError, TimeoutError, OSError) as exc:
        raise CoordinatorUnavailable(f"etcd: {what} failed: {type(exc).__name__}: {exc}") from exc


class Keys:
    """The key layout of one chronoq cluster in etcd."""

    def __init__(self, cluster: str) -> None:
        self.cluster = cluster
        self.root = f"/chronoq/{cluster}/"
        self.members = f"{self.root}members/".encode()
        self.owners = f"{self.root}owners/".encode()
        self.stats = f"{self.root}stats/".encode()
        self.loads = f"{self.root}loads".encode()
        self.clock = f"{self.root}clock".encode()
        # The shard map and each shard's DSN, password masked (docs/design/shards.md).
        self.shards = f"{self.root}shards/".encode()
        self.shard_map = self.shards + b"map"
        self.shard_dsns = self.shards + b"dsn/"
        # Each shard's database identity (system identifier and name): a database is
        # registered once. Online moves: a record per move, and the driver's key per move
        # (on its lease; its create revision is the move token).
        self.shard_ids = f"{self.root}shard-ids/".encode()
        self.moves = f"{self.root}moves/".encode()
        self.move_keys = f"{self.root}move-keys/".encode()

    def member(self, node_id: str) -> bytes:
        return self.members + node_id.encode()

    def owner(self, partition: int) -> bytes:
        return self.owners + f"{partition:05d}".encode()

    def partition_of(self, key: bytes) -> int:
        return int(key[len(self.owners) :])

    def shard_dsn(self, shard: str) -> bytes:
        return self.shard_dsns + shard.encode()

    def shard_id(self, shard: str) -> bytes:
        return self.shard_ids + shard.encode()

    def move(self, move_id: str) -> bytes:
        return self.moves + move_id.encode()

    def move_key(self, move_id: str) -> bytes:
        return self.move_keys + move_id.encode()

    def stat(self, node_id: str) -> bytes:
        return self.stats + node_id.encode()
