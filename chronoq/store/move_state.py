"""The states a move gives a shard's partitions (``shard_partitions``), the statements over
them a move takes (``chronoq.store.holdings``). A move's refusals are in ``chronoq.errors``
(re-exported here and from ``chronoq.store.mover``).
"""

from __future__ import annotations

import importlib
from collections.abc import Sequence
from typing import Any, Protocol

import asyncpg

from chronoq.errors import FreezeOverrun as FreezeOverrun
from chronoq.errors import MoveRefused as MoveRefused
from chronoq.errors import StaleMoveToken as StaleMoveToken
from chronoq.shardmap import format_partitions

# States of shard_partitions (migration 0011).
LIVE, FROZEN, INCOMING, GONE = 0, 1, 2, 3

_STATES = {LIVE: "live", FROZEN: "frozen", INCOMING: "incoming", GONE: "gone"}


class Holdings(Protocol):
    """The statements over ``shard_partitions`` a move takes (``chronoq.store.holdings``):
    each checks the move's token and refuses a stale one."""

    async def held(self, store: Any) -> dict[int, Any]: ...

    async def mark_incoming(
        self, store: Any, partitions: Sequence[int], move_id: str, token: int
    ) -> Any: ...

    async def freeze(
        self, store: Any, partitions: Sequence[int], move_id: str, token: int
    ) -> Any: ...

    async def make_live(
        self, store: Any, partitions: Sequence[int], since_version: int, move_id: str, token: int
    ) -> Any: ...

    async def mark_gone(
        self, store: Any, partitions: Sequence[int], move_id: str, token: int
    ) -> Any: ...

    async def unfreeze(
        self, store: Any, partitions: Sequence[int], move_id: str, token: int
    ) -> Any: ...


def store_holdings() -> Holdings:
    """The store's own holdings statements (imported when a move first needs them)."""
    module: Holdings = importlib.import_module("chronoq.store.holdings")
    return module


def _span(partitions: Sequence[int]) -> str:
    return format_partitions(partitions)


def _shown(held: Any) -> str:
    if held is None:
        return "not held"
    state = _STATES.get(held["state"] if isinstance(held, asyncpg.Record) else held.state, "?")
    move = held["move_id"] if isinstance(held, asyncpg.Record) else held.move_id
    return f"{state}" + (f" for move {move!r}" if move else "")
