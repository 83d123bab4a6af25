"""How a node reaches etcd and takes part in a cluster: plain settings, no etcd client code.

Kept apart from ``chronoq.coordinator.etcd`` so that node settings (``chronoq.config``) can
name them without importing the etcd client.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from chronoq.coordinator.ring import DEFAULT_EPSILON
from chronoq.coordinator.ttl import DEFAULT_LEASE_TTL


@dataclass(frozen=True, kw_only=True)
class EtcdSettings:
    """How to reach etcd. ``endpoints`` are ``host:port`` strings (loopback in tests)."""

    endpoints: Sequence[str]
    cluster: str = "default"  # the chronoq cluster name: the key prefix
    timeout: float = 2.0
    username: str | None = None  # etcd auth: both or neither
    password: str | None = None
    password_file: str | None = None  # instead of password: read at connect (0600, ours)
    ca_cert: str | None = None  # PEM paths: TLS to etcd, trusting this CA (https endpoints)
    cert_key: str | None = None  # with cert_cert: a client certificate (--client-cert-auth)
    cert_cert: str | None = None


@dataclass(frozen=True, kw_only=True)
class ClusterSettings:
    """A node's part in an etcd-coordinated cluster (``None`` in ``NodeSettings``: alone)."""

    etcd: EtcdSettings
    lease_ttl: int = DEFAULT_LEASE_TTL
    epsilon: float = DEFAULT_EPSILON
    load_horizon_buckets: int = 5  # "the coming minutes" that make a partition's load
    load_interval: float = 2.0
    stats_interval: float = 1.0
    # How often an owner compares its tokens with the store's fences: a store that went back
    # in time (a failover that lost its last commits) may hold an older token than ours.
    fence_audit_interval: float = 5.0
    reconcile_interval: float = 1.0
