"""A node's settings from what an operator set (flags, ``CHRONOQ_*`` variables, a file).

Every option is "not set" (None) unless the operator gave it, and then ``NodeSettings``,
``Limits`` and ``ClusterSettings`` supply their own defaults: a default is written once, in the
library, and ``chronoq config`` shows the same values the node runs with.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from chronoq.config import NodeSettings
from chronoq.coordinator.credentials import read_password
from chronoq.coordinator.settings import ClusterSettings, EtcdSettings
from chronoq.coordinator.ttl import DEFAULT_LEASE_TTL, check_lease_ttl
from chronoq.errors import ConfigError
from chronoq.limits import Limits

_MS = timedelta(milliseconds=1)
_DAY = timedelta(days=1)
_HOUR = timedelta(hours=1)


@dataclass(frozen=True, kw_only=True)
class NodeOptions:
    """What an operator may set for ``chronoq node``; None: the library's default.

    Units are the operator's (milliseconds, days); zero retention or clock offset means "off".
    """

    dsn: str
    store_shards: tuple[str, ...] | None = None  # shard-1, shard-2, ... (dsn is shard-0)
    host: str | None = None
    port: int | None = None
    node_id: str | None = None
    partitions: int | None = None
    bucket_seconds: int | None = None
    tick_ms: int | None = None
    wheel_horizon_ms: int | None = None  # 0: no timing wheel, the tick alone
    catch_all_ms: int | None = None
    max_payload_bytes: int | None = None
    horizon_days: int | None = None
    etcd: str | None = None  # comma-separated endpoints; None: own every partition alone
    cluster: str | None = None
    lease_ttl: int | None = None
    max_clock_offset_ms: int | None = None  # 0: never checked
    tls_cert: str | None = None
    tls_key: str | None = None
    tls_client_ca: str | None = None
    auth_tokens: str | None = None
    etcd_user: str | None = None
    etcd_password: str | None = None
    etcd_password_file: str | None = None
    etcd_ca: str | None = None
    etcd_cert: str | None = None
    etcd_key: str | None = None
    metrics_host: str | None = None
    metrics_port: int | None = None
    metrics_token_file: str | None = None
    metrics_token: str | None = None
    metrics_insecure: bool | None = None
    metrics_queues: int | None = None
    retention_days: float | None = None  # 0: forever
    dead_retention_days: float | None = None  # 0: forever
    history_after_s: float | None = None  # 0: at the next retention pass
    history_slice_hours: float | None = None  # 0: a day, or wider when the retention needs it
    submit_quota: float | None = None  # 0: unlimited
    submit_quota_burst: float | None = None
    long_polls_per_namespace: int | None = None
    long_polls_per_node: int | None = None
    ready_notices: bool | None = None
    handoff: bool | None = None
    schedules_per_namespace: int | None = None
    queue_limits_per_namespace: int | None = None

    @classmethod
    def names(cls) -> frozenset[str]:
        """The option names, as the CLI's parameters are called."""
        return frozenset(f.name for f in dataclasses.fields(cls))

    @property
    def etcd_access(self) -> dict[str, str | None]:
        """Credentials and TLS for etcd, as ``EtcdSettings`` names them."""
        return {
            "username": self.etcd_user,
            "password": self.etcd_password,
            "password_file": self.etcd_password_file,
            "ca_cert": self.etcd_ca,
            "cert_cert": self.etcd_cert,
            "cert_key": self.etcd_key,
        }


_SAME_NAME = (
    "host",
    "port",
    "partitions",
    "bucket_seconds",
    "tls_cert",
    "tls_key",
    "tls_client_ca",
    "auth_tokens",
    "metrics_host",
    "metrics_port",
    "metrics_token_file",
    "metrics_token",
    "metrics_insecure",
    "metrics_queues",
    "submit_quota_burst",
    "long_polls_per_namespace",
    "long_polls_per_node",
    "ready_notices",
    "handoff",
    "schedules_per_namespace",
    "queue_limits_per_namespace",
)


def settings_from(options: NodeOptions) -> NodeSettings:
    """The ``NodeSettings`` ``options`` describe; ``ConfigError`` when they do not fit together."""
    o = options
    fields: dict[str, Any] = {
        name: getattr(o, name) for name in _SAME_NAME if getattr(o, name) is not None
    }
    if o.node_id:
        fields["node_id"] = o.node_id
    fields.update(_durations(o))
    if o.submit_quota is not None:
        fields["submit_quota"] = o.submit_quota or None
    if o.store_shards:
        fields["store_shards"] = tuple(o.store_shards)
    limits: dict[str, Any] = {}
    if o.max_payload_bytes is not None:
        limits["max_payload_bytes"] = o.max_payload_bytes
    if o.horizon_days is not None:
        limits["horizon"] = o.horizon_days * _DAY
    if limits:
        fields["limits"] = Limits(**limits)
    if o.etcd:
        fields["cluster"] = cluster_settings(
            o.etcd, cluster=o.cluster, lease_ttl=o.lease_ttl, **o.etcd_access
        )
    elif any(o.etcd_access.values()):
        raise ConfigError("etcd credentials and TLS need --etcd too")
    return NodeSettings(dsn=o.dsn, **fields)


def _durations(o: NodeOptions) -> dict[str, timedelta | None]:
    """The durations that were set, from the operator's units (zero: "off" where allowed)."""
    out: dict[str, timedelta | None] = {}
    if o.tick_ms is not None:
        out["tick"] = o.tick_ms * _MS
    if o.wheel_horizon_ms is not None:
        out["wheel_horizon"] = o.wheel_horizon_ms * _MS  # zero: no wheel
    if o.catch_all_ms is not None:
        out["catch_all"] = o.catch_all_ms * _MS
    if o.retention_days is not None:
        out["retention"] = o.retention_days * _DAY or None
    if o.dead_retention_days is not None:
        out["dead_retention"] = o.dead_retention_days * _DAY or None
    if o.history_after_s is not None:
        out["history_after"] = timedelta(seconds=o.history_after_s)
    if o.history_slice_hours is not None:
        out["history_slice"] = timedelta(hours=o.history_slice_hours) or None
    if o.max_clock_offset_ms is not None:
        out["max_clock_offset"] = o.max_clock_offset_ms * _MS or None
    return out


def cluster_settings(
    endpoints: str,
    *,
    cluster: str | None = None,
    lease_ttl: int | None = None,
    username: str | None = None,
    password: str | None = None,
    password_file: str | None = None,
    ca_cert: str | None = None,
    cert_cert: str | None = None,
    cert_key: str | None = None,
) -> ClusterSettings:
    """Membership in the etcd cluster at ``endpoints`` (comma-separated host:port)."""
    hosts = [e.strip() for e in endpoints.split(",") if e.strip()]
    if password_file is not None:
        read_password(password_file)  # a bad file is a setting error now, not at connect
    named: dict[str, Any] = {"cluster": cluster} if cluster else {}
    etcd = EtcdSettings(
        endpoints=hosts,
        username=username,
        password=password,
        password_file=password_file,
        ca_cert=ca_cert,
        cert_cert=cert_cert,
        cert_key=cert_key,
        **named,
    )
    ttl = check_lease_ttl(DEFAULT_LEASE_TTL if lease_ttl is None else lease_ttl)
    return ClusterSettings(etcd=etcd, lease_ttl=ttl)


def shown_defaults() -> dict[str, object]:
    """The value each unset option takes, in the operator's units (for ``chronoq config``)."""
    node = NodeSettings(dsn="")
    etcd = EtcdSettings(endpoints=())
    shown: dict[str, object] = {name: getattr(node, name) for name in _SAME_NAME}
    shown.update(
        tick_ms=node.tick // _MS,
        wheel_horizon_ms=node.wheel_horizon // _MS,
        catch_all_ms=node.catch_all // _MS,
        retention_days=node.retention / _DAY if node.retention else 0,
        dead_retention_days=node.dead_retention / _DAY if node.dead_retention else 0,
        history_after_s=node.history_after.total_seconds(),
        history_slice_hours=node.history_slice / _HOUR if node.history_slice else 0,
        max_clock_offset_ms=node.max_clock_offset // _MS if node.max_clock_offset else 0,
        submit_quota=node.submit_quota,
        max_payload_bytes=node.limits.max_payload_bytes,
        horizon_days=node.limits.horizon // _DAY,
        cluster=etcd.cluster,
        lease_ttl=DEFAULT_LEASE_TTL,
    )
    return shown
