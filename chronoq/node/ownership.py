"""What a node may fire: its owned partitions with their fencing tokens.

A single node takes every partition with a locally bumped token (``LocalOwnership``); the
etcd-coordinated cluster supplies the same interface from its ownership keys. Firing code
asks ``owned()`` before each statement and never caches the answer.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Protocol

from chronoq.store import Store


class Ownership(Protocol):
    """A view of the partitions this node currently owns: partition → fencing token."""

    def owned(self) -> Mapping[int, int]: ...

    async def start(self) -> None: ...

    async def stop(self) -> None: ...


class LocalOwnership:
    """Single-node mode: own every partition, each with a token one above the stored one.

    Bumping the token fences any earlier node process that still believes it owns the
    partitions (a stale ``chronoq node`` left running against the same database).
    """

    def __init__(self, store: Store, node_id: str) -> None:
        self._store = store
        self._node_id = node_id
        self._owned: dict[int, int] = {}

    async def start(self) -> None:
        fences = await self._store.take_fences_local(range(self._store.partitions), self._node_id)
        self._owned = {p: f.token for p, f in fences.items()}

    async def stop(self) -> None:
        self._owned = {}

    def owned(self) -> Mapping[int, int]:
        return self._owned
