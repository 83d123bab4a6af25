"""A namespace's schedule counters across store shards, on the map's first shard (shard-0).

One row per namespace (``namespace_counts``: schedules, the tasks/s the active ones reserve)
on a shard that is never removed and whose rows no move carries, so two creates racing on
two shards meet on one row lock. A create *takes* before it writes on its own shard (+1 and
its rate, under the cap and quota, atomically; the take is recorded in ``namespace_takes``),
then *drops* the take when it succeeded or *gives it back* when it was definitely refused. A
take whose outcome is unknown stays: it over-counts (refuses more, never allows more) until
a *recount*, which runs only when no take of the namespace is younger than ``STALE`` (its
create can no longer commit) and holds the counter's row while it counts every shard.
Deletes and pauses *release* after they committed, unless a recount ran since they began
(the epoch): that recount counted their shard before or after them.
"""

from __future__ import annotations

import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import datetime, timedelta

from chronoq.store.sql import q
from chronoq.store.store import Store

#: A take older than this has no create left that could still commit (a create is one
#: statement, given up after the store's command timeout of 15 s): a recount may settle it.
STALE = timedelta(minutes=2)


@dataclass(frozen=True)
class Taken:
    """What a take answered: ``token`` when taken (None: refused), the counts before."""

    token: uuid.UUID | None
    schedules: int
    reserved: float


async def shard_count(store: Store, namespace: str) -> tuple[int, float]:
    """One shard's schedules of ``namespace`` and the tasks/s its active ones reserve."""
    async with store.connection() as conn:
        row = await conn.fetchrow(q("namespace_schedule_count"), namespace)
    return int(row["schedules"]), float(row["reserved"])


class NamespaceCounts:
    """The counter statements on the first shard's ``store``."""

    def __init__(self, store: Store) -> None:
        self.store = store

    async def take(
        self,
        namespace: str,
        schedules: int,
        rate: float,
        now: datetime,
        *,
        cap: int | None,
        quota: float | None,
    ) -> Taken | None:
        """Take ``schedules`` and ``rate`` when the cap and quota allow; None when the
        namespace has no counter yet (``seed`` it, then take again)."""
        token = uuid.uuid4()
        async with self.store.connection() as conn:
            row = await conn.fetchrow(
                q("take_namespace_count"), namespace, token, schedules, rate, cap, quota, now
            )
        if not row["counted"]:
            return None
        return Taken(token if row["taken"] else None, int(row["schedules"]), float(row["reserved"]))

    async def drop(self, token: uuid.UUID) -> None:
        """The create that took ``token`` succeeded: its counts stay."""
        async with self.store.connection() as conn:
            await conn.execute(q("drop_namespace_take"), token)

    async def give_back(self, namespace: str, token: uuid.UUID) -> None:
        """The create that took ``token`` was refused: its counts go back (once)."""
        async with self.store.connection() as conn:
            await conn.execute(q("give_back_namespace_take"), token, namespace)

    async def epoch(self, namespace: str) -> int | None:
        """The counter's recount epoch, read before a delete or pause (None: no counter)."""
        async with self.store.connection() as conn:
            value = await conn.fetchval(q("namespace_count_epoch"), namespace)
        return None if value is None else int(value)

    async def release(self, namespace: str, schedules: int, rate: float, epoch: int) -> None:
        """A delete or pause committed: give back its counts unless a recount ran since
        ``epoch`` was read."""
        async with self.store.connection() as conn:
            await conn.execute(q("release_namespace_count"), namespace, schedules, rate, epoch)

    async def seed(self, namespace: str, schedules: int, reserved: float, now: datetime) -> None:
        """The namespace's first counter, from a count over every shard (a racing seed's
        row stays: it counted as late or later than a take could follow it)."""
        async with self.store.connection() as conn:
            await conn.execute(q("seed_namespace_count"), namespace, schedules, reserved, now)

    async def recount(
        self,
        namespace: str,
        now: datetime,
        count: Callable[[], Awaitable[tuple[int, float] | None]],
    ) -> bool:
        """Set the counter to ``count()`` (every shard's schedules, None: not all answered),
        holding its row meanwhile; False when it did not (no counter, a take younger than
        ``STALE`` in flight, or ``count`` gave None)."""
        async with self.store.connection() as conn, conn.transaction():
            row = await conn.fetchrow(q("lock_namespace_count"), namespace, now - STALE)
            if row is None or row["busy"]:
                return False
            counted = await count()
            if counted is None:
                return False
            schedules, reserved = counted
            await conn.execute(q("recount_namespace_count"), namespace, schedules, reserved, now)
        return True

    async def due(self, now: datetime, limit: int) -> list[str]:
        """At most ``limit`` namespaces to recount: with a take left since before ``STALE``
        first (an over-count known), then the longest since their last recount."""
        async with self.store.connection() as conn:
            rows = await conn.fetch(q("namespaces_to_recount"), now - STALE, limit)
        return [str(r["namespace"]) for r in rows]
