"""What a node may fire: its owned partitions with their fencing tokens.

A single node takes every partition with a locally bumped token (``LocalOwnership``); the
etcd-coordinated cluster supplies the same interface from its ownership keys. Firing code
asks ``owned()`` before each statement and never caches the answer.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Protocol

from chronoq.store import Store


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

    async def drain(self) -> set[int]:
        """Give up every partition and take no more; returns those released."""
        ...

    async def suspend(self, reason: str = "store unreachable") -> None:
        """Release every partition until ``resume``: the store is out of reach (or the
        node's clock is off), so the partitions are better fired by others."""
        ...

    async def resume(self) -> None: ...

    @property
    def suspended(self) -> bool: ...

    async def start(self) -> None: ...

    async def stop(self) -> None: ...


class LocalOwnership:
    """Single-node mode: own every partition, each with a token one above the stored one.

    Bumping the token fences any earlier node process that still believes it owns the
    partitions (a stale ``chronoq node`` left running against the same database).
    """

    def __init__(self, store: Store, node_id: str, address: str = "") -> None:
        self._store = store
        self._node_id = node_id
        self._address = address
        self._owned: dict[int, int] = {}
        self.gate = asyncio.Lock()
        self.draining = False

    async def start(self) -> None:
        fences = await self._store.take_fences_local(range(self._store.partitions), self._node_id)
        self._owned = {p: f.token for p, f in fences.items()}

    async def stop(self) -> None:
        self._owned = {}

    def owned(self) -> Mapping[int, int]:
        return self._owned

    def expected(self) -> set[int]:
        return set() if self.draining else set(range(self._store.partitions))

    async def drain(self) -> set[int]:
        async with self.gate:
            released = set(self._owned)
            self._owned = {}
            self.draining = True
        return released

    async def suspend(self, reason: str = "store unreachable") -> None:
        """Alone, there is nobody to hand partitions to: keep them and keep trying."""

    async def resume(self) -> None:
        """Nothing was suspended."""

    @property
    def suspended(self) -> bool:
        return False

    def describe(self) -> ClusterView:
        return ClusterView(
            "local",
            [MemberView(self._node_id, self._address)],
            {p: (self._node_id, t) for p, t in self._owned.items()},
        )
