"""What a store shard holds of the shard map (``shard_partitions``, migration 0011), and the
statements a partition move changes it with.

Every write of a partition checks these rows (``chronoq_hold`` / ``chronoq_live`` in each
statement of ``queries.sql``); this module changes them. Each change names its move and the
mover's token (its etcd key's create revision): a row last changed by a mover with a higher
token refuses a stale one (``StaleMoveToken``), and a change the row's state does not allow
is refused (``MoveRefused``), so a replay after a crash is idempotent and nothing else is.

States and the changes that reach them::

    (no row) | GONE | INCOMING ──mark_incoming──▶ INCOMING ──make_live(v)──▶ LIVE since v
    LIVE ──freeze──▶ FROZEN ──unfreeze──▶ LIVE          FROZEN | INCOMING ──mark_gone──▶ GONE
    LIVE (made by this move) ──mark_incoming──▶ INCOMING   (a rollback on the target)

A row that an older mover (lower token) left FROZEN or INCOMING is taken over by a newer one
(freeze, unfreeze, mark_incoming), which is how a move whose driver died is resumed or
rolled back by the next driver.

``freeze`` is the fence of the cut-over: it takes the writes' advisory lock exclusively (all
of its stripes), so it waits for every write in flight on this shard to commit, and a write
that starts after it committed reads FROZEN and is refused.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import asyncpg

from chronoq.errors import FreezeTimedOut as FreezeTimedOut
from chronoq.errors import MoveRefused, StaleMoveToken
from chronoq.shardmap import format_partitions
from chronoq.store.connection import Connected

LIVE, FROZEN, INCOMING, GONE = 0, 1, 2, 3
_NAMES = {LIVE: "live", FROZEN: "frozen", INCOMING: "incoming", GONE: "gone"}
#: The writes' advisory lock (migration 0011): class "chrq", one stripe per backend % 8.
LOCK_CLASS = 0x63687271
LOCK_STRIPES = 8
#: Seconds a freeze waits at most for the writes in flight (then nothing is frozen).
FREEZE_WAIT_S = 5.0


@dataclass(frozen=True)
class Holding:
    """One partition as this shard holds it."""

    partition: int
    state: int  # LIVE, FROZEN, INCOMING or GONE
    since_version: int  # the map version from which this shard holds it
    move_id: str | None  # the move that last changed it (None: adopted at first connect)
    move_token: int | None  # that mover's token

    @property
    def state_name(self) -> str:
        return _NAMES.get(self.state, f"state {self.state}")


def _holding(row: Any) -> Holding:
    return Holding(
        row["partition"], row["state"], row["since_version"], row["move_id"], row["move_token"]
    )


async def held(store: Connected) -> dict[int, Holding]:
    """Every partition this shard has a row for (at most P rows)."""
    async with store.connection() as conn:
        rows = await conn.fetch(
            "SELECT partition, state, since_version, move_id, move_token"
            " FROM shard_partitions ORDER BY partition"
        )
    return {r["partition"]: _holding(r) for r in rows}


def _partitions(partitions: Iterable[int]) -> list[int]:
    parts = sorted({int(p) for p in partitions})
    if not parts:
        raise MoveRefused("a move names at least one partition")
    return parts


def _check(
    found: dict[int, Holding],
    parts: Sequence[int],
    move_id: str,
    token: int,
    allowed: Any,
    change: str,
) -> None:
    """Refuse the whole change unless every row allows it (``allowed(holding | None)``)."""
    for p in parts:
        h = found.get(p)
        if h is not None and h.move_token is not None and h.move_token > token:
            raise StaleMoveToken(move_id, token, h.move_token)
        if h is not None and h.move_token == token and h.move_id not in (None, move_id):
            raise MoveRefused(
                f"move {move_id!r}: partition {p} was changed by move {h.move_id!r} with the "
                f"same token {token}; a token names one move"
            )
        if not allowed(h):
            what = "no row" if h is None else f"{h.state_name} (move {h.move_id!r})"
            raise MoveRefused(
                f"move {move_id!r}: cannot {change} partition {p} on this shard: it is {what}; "
                "nothing was changed"
            )


async def _change(
    store: Connected,
    partitions: Iterable[int],
    move_id: str,
    token: int,
    *,
    state: int,
    allowed: Any,
    change: str,
    since_version: int | None = None,
    fence_writes: bool = False,
    wait_s: float = FREEZE_WAIT_S,
) -> list[Holding]:
    """Check and change the rows in one transaction: the rows are locked first (movers of
    the same partitions serialise), then, with ``fence_writes``, the writes' lock is taken
    exclusively (waits for writes in flight, at most ``wait_s``)."""
    parts = _partitions(partitions)
    async with store.connection() as conn, conn.transaction():
        rows = await conn.fetch(
            "SELECT partition, state, since_version, move_id, move_token FROM shard_partitions"
            " WHERE partition = ANY($1::smallint[]) ORDER BY partition FOR UPDATE",
            parts,
        )
        found = {r["partition"]: _holding(r) for r in rows}
        _check(found, parts, move_id, token, allowed, change)
        if fence_writes:
            await conn.execute(f"SET LOCAL lock_timeout = {max(1, int(wait_s * 1000))}")
            try:
                await conn.execute(
                    "SELECT pg_advisory_xact_lock($1::integer, s)"
                    " FROM generate_series(0, $2::integer - 1) AS s ORDER BY s",
                    LOCK_CLASS,
                    LOCK_STRIPES,
                )
            except asyncpg.exceptions.LockNotAvailableError:
                raise FreezeTimedOut(
                    f"move {move_id!r}: writes in flight on this shard did not finish within "
                    f"{wait_s:g} s; partitions {format_partitions(parts)} were not frozen "
                    "(retry the cut-over)"
                ) from None
            await conn.execute("SET LOCAL lock_timeout = 0")
        changed = await conn.fetch(
            "INSERT INTO shard_partitions AS h"
            " (partition, state, since_version, move_id, move_token)"
            " SELECT p, $2, coalesce($3, 1), $4, $5 FROM unnest($1::smallint[]) AS p"
            " ON CONFLICT (partition) DO UPDATE SET state = EXCLUDED.state,"
            "   since_version = coalesce($3, h.since_version), move_id = EXCLUDED.move_id,"
            "   move_token = EXCLUDED.move_token"
            " RETURNING partition, state, since_version, move_id, move_token",
            parts,
            state,
            since_version,
            move_id,
            token,
        )
    return [_holding(r) for r in changed]


def _ours(h: Holding | None, move_id: str, *states: int) -> bool:
    return h is not None and h.move_id == move_id and h.state in states


def _superseded(h: Holding | None, token: int, *states: int) -> bool:
    """Left in one of ``states`` by an older mover (a lower token): a newer one takes over."""
    return (
        h is not None and h.state in states and h.move_token is not None and h.move_token < token
    )


async def mark_incoming(
    store: Connected, partitions: Sequence[int], move_id: str, token: int
) -> list[Holding]:
    """The target's partitions INCOMING for this move: every write of them refused here,
    while the move copies them in. Also the first step of a rollback on the target (LIVE
    made by this move back to INCOMING: writes in flight there are waited for)."""
    found = await held(store)
    leaving_live = any(_ours(found.get(p), move_id, LIVE) for p in partitions)
    return await _change(
        store,
        partitions,
        move_id,
        token,
        state=INCOMING,
        allowed=lambda h: h is None or h.state in (GONE, INCOMING) or _ours(h, move_id, LIVE),
        change="mark incoming",
        fence_writes=leaving_live,
    )


async def freeze(
    store: Connected,
    partitions: Sequence[int],
    move_id: str,
    token: int,
    *,
    wait_s: float = FREEZE_WAIT_S,
) -> list[Holding]:
    """The source's partitions FROZEN: returns once every write in flight on this shard
    has committed (or rolled back); no write of these partitions commits afterwards. Waits
    at most ``wait_s`` for those writes (``FreezeTimedOut``: nothing frozen)."""
    return await _change(
        store,
        partitions,
        move_id,
        token,
        state=FROZEN,
        allowed=lambda h: h is not None
        and (h.state == LIVE or _ours(h, move_id, FROZEN) or _superseded(h, token, FROZEN)),
        change="freeze",
        fence_writes=True,
        wait_s=wait_s,
    )


async def make_live(
    store: Connected,
    partitions: Sequence[int],
    since_version: int,
    move_id: str,
    token: int,
) -> list[Holding]:
    """The target's partitions LIVE since ``since_version`` (the map version the move
    commits next): no node passes the check before it routes by that version."""
    if since_version < 1:
        raise MoveRefused(f"move {move_id!r}: a map version is 1 or more, got {since_version}")
    return await _change(
        store,
        partitions,
        move_id,
        token,
        state=LIVE,
        since_version=since_version,
        allowed=lambda h: _ours(h, move_id, INCOMING)
        or (_ours(h, move_id, LIVE) and h is not None and h.since_version == since_version),
        change="make live",
    )


async def mark_gone(
    store: Connected, partitions: Sequence[int], move_id: str, token: int
) -> list[Holding]:
    """The partitions GONE from this shard: the source after the commit (FROZEN by this
    move), or the target after a rollback (INCOMING for this move)."""
    return await _change(
        store,
        partitions,
        move_id,
        token,
        state=GONE,
        allowed=lambda h: h is None or _ours(h, move_id, FROZEN, INCOMING, GONE),
        change="mark gone",
    )


async def unfreeze(
    store: Connected, partitions: Sequence[int], move_id: str, token: int
) -> list[Holding]:
    """The rollback of ``freeze``: the source's partitions LIVE again (since the version
    they had), writes of them accepted again."""
    return await _change(
        store,
        partitions,
        move_id,
        token,
        state=LIVE,
        allowed=lambda h: _ours(h, move_id, FROZEN, LIVE) or _superseded(h, token, FROZEN),
        change="unfreeze",
    )
