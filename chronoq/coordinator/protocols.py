"""What a node may fire: its owned partitions with their fencing tokens.

A single node takes every partition with a locally bumped token
(``chronoq.coordinator.local.LocalOwnership``); the etcd-coordinated cluster
(``chronoq.coordinator.ownership.EtcdOwnership``) supplies the same interface from its
ownership keys. Firing code asks ``owned()`` before each statement and never caches the answer.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Protocol

from chronoq.shardmap import ShardMap


@dataclass(frozen=True)
class MemberView:
    node_id: str
    address: str
    stats: dict[str, float] = field(default_factory=dict)


@dataclass(frozen=True)
class ClusterView:
    """What a node knows of the cluster, for status: members and partition owners."""

    cluster: str
    members: list[MemberView]
    owners: dict[int, tuple[str, int]]  # partition → (node id, fencing token)
    #: The shard map from etcd (None: a node alone, whose one store is ``single(P)``).
    shard_map: ShardMap | None = None
    shard_dsns: dict[str, str] = field(default_factory=dict)  # shard → DSN, password masked
    shard_map_error: str | None = None  # why the map in etcd was last refused


class Ownership(Protocol):
    """A view of the partitions this node currently owns: partition → fencing token.

    Owner writes hold ``gate`` while they run, so a release can wait for the one in flight.
    """

    gate: asyncio.Lock

    def owned(self) -> Mapping[int, int]: ...

    def describe(self) -> ClusterView: ...

    def expected(self) -> set[int]:
        """The partitions this node should own now (empty while draining)."""
        ...

    def leads(self) -> bool:
        """Whether this node does the cluster's shared chores (counting the coming buckets'
        loads, the queue depth): one live member at a time; always a node alone."""
        ...

    async def drain(self) -> set[int]:
        """Give up every partition and take no more; returns those released."""
        ...

    async def suspend(self, reason: str = "store unreachable") -> None:
        """Release every partition until ``resume``: the store is out of reach (or the
        node's clock is off), so the partitions are better fired by others."""
        ...

    async def resume(self) -> None: ...

    def hold_out(self, cause: str, partitions: frozenset[int], reason: str) -> None:
        """Fire none of ``partitions`` until ``bring_back(cause)``, keeping them owned (a
        store shard that nobody reaches): ``owned()`` leaves them out meanwhile."""
        ...

    def bring_back(self, cause: str) -> None:
        """End ``hold_out(cause)``: those partitions fire again, backfill first."""
        ...

    def unavailable(self) -> frozenset[int]:
        """Every partition held out now, whatever the cause."""
        ...

    @property
    def suspended(self) -> bool: ...

    async def start(self) -> None: ...

    async def stop(self) -> None: ...
