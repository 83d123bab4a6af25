"""Single-node ownership: one node owns every partition, fenced by a locally bumped token."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import Protocol

from chronoq.coordinator.protocols import ClusterView, MemberView
from chronoq.partitionmap import PartitionMap
from chronoq.store.port import ByPartition


class _CountedStore(ByPartition, Protocol):
    """A store that says how many partitions it was made with (a store used on its own)."""

    @property
    def partitions(self) -> int: ...


class LocalOwnership:
    """Single-node mode: own every partition, each with a token one above the stored one.

    Bumping the token fences any earlier node process that still believes it owns the
    partitions (a stale ``chronoq node`` left running against the same database).
    """

    def __init__(
        self,
        store: _CountedStore,
        node_id: str,
        address: str = "",
        *,
        partitions: PartitionMap | None = None,
    ) -> None:
        self._store = store
        #: The node hands its map; a store used on its own (tests, tools) gives its count.
        self.partitions = partitions or PartitionMap(store.partitions)
        self._node_id = node_id
        self._address = address
        self._owned: dict[int, int] = {}
        self.gate = asyncio.Lock()
        self.draining = False
        self.held_out: dict[str, frozenset[int]] = {}

    async def start(self) -> None:
        fences = await self._store.take_fences_local(self.partitions.all, self._node_id)
        self._owned = {p: f.token for p, f in fences.items()}

    async def stop(self) -> None:
        self._owned = {}

    def owned(self) -> Mapping[int, int]:
        if not self.held_out:
            return self._owned
        out = self.unavailable()
        return {p: t for p, t in self._owned.items() if p not in out}

    def hold_out(self, cause: str, partitions: frozenset[int], reason: str) -> None:
        self.held_out[cause] = partitions

    def bring_back(self, cause: str) -> None:
        self.held_out.pop(cause, None)

    def unavailable(self) -> frozenset[int]:
        return frozenset().union(*self.held_out.values())

    def expected(self) -> set[int]:
        return set() if self.draining else set(self.partitions.all)

    def leads(self) -> bool:
        return True

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
