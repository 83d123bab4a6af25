"""Bulk operations by filter (cancel, requeue, run now) and filtered listings.

A bulk call walks the namespace's tasks in the states its action changes, keyset in id
order, one batch per statement (``filter_walk`` in ``queries.sql``): each statement reads a
bounded stretch (``MAX_FILTER_EXAMINED`` index entries per state), changes at most
``BULK_BATCH`` rows in its own transaction, and says where the walk goes on. The call stops
at its bound of tasks or its deadline and answers that position as a token; the caller calls
again with it. Row locks are held one batch long, and each statement is one await: the
node's event loop, its owners' firing and the other namespaces' calls go on between them.

Over shards the walk is the listing's (``fanout.page``): every shard's batch after the same
position, concurrently, and the walk goes on from the lowest position a shard stopped at. A
write is counted when its shard commits it (a changed row leaves the states walked, so a
stretch walked again changes nothing twice); a dry run counts only the ids up to that
position (the rest are counted when walked again).
"""

from __future__ import annotations

import asyncio
import uuid
from collections import Counter
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from chronoq.buckets import bucket_of
from chronoq.effects import NO_EFFECTS, made_ready
from chronoq.errors import InvalidArgument
from chronoq.limits import BULK_BATCH, BULK_DEADLINE_S, MAX_BULK_TASKS, MAX_FILTER_EXAMINED
from chronoq.models import Page, TaskState
from chronoq.store.connection import Connected
from chronoq.store.rows import task_of
from chronoq.store.sql import q
from chronoq.taskfilter import BulkAction, BulkDone, BulkOutcome, TaskFilter
from chronoq.timeslice import converted

_ZERO_UUID = uuid.UUID(int=0)
#: Every state a filtered listing without a state walks.
ALL_STATES = sorted(TaskState)

_STATEMENTS = {
    BulkAction.CANCEL: "bulk_cancel",
    BulkAction.REQUEUE: "bulk_requeue",
    BulkAction.RUN_NOW: "bulk_run_now",
}


@dataclass(frozen=True)
class Batch:
    """One statement of a bulk walk on one shard: rows changed (a dry run: the ids it
    picked), their queues, and where its walk goes on (None: the end)."""

    count: int
    next: uuid.UUID | None
    ids: tuple[uuid.UUID, ...] = ()
    queues: tuple[str, ...] = ()


def after_token(page_token: str) -> uuid.UUID:
    """The position a token names (empty: the start)."""
    if not page_token:
        return _ZERO_UUID
    try:
        return uuid.UUID(page_token)
    except ValueError:
        raise InvalidArgument("page_token", "is not a token from a previous answer") from None


def filter_args(where: TaskFilter) -> tuple[Any, ...]:
    """The filter's parameters of ``filter_hit`` ($6..$9)."""
    return (where.queue, where.labels_json(), where.run_at_from, where.run_at_to)


def merged(
    batches: Sequence[Batch], *, dry_run: bool
) -> tuple[int, uuid.UUID | None, Counter[str]]:
    """One round of shard batches after the same position: what it counts, where the walk
    goes on (the lowest position a shard stopped at; None: every shard reached its end) and
    the queues of the rows changed."""
    stops = [b.next for b in batches if b.next is not None]
    upto = min(stops) if stops else None
    if dry_run:
        count = sum(1 for b in batches for i in b.ids if upto is None or i <= upto)
    else:
        count = sum(b.count for b in batches)
    return count, upto, Counter(q for b in batches for q in b.queues)


#: One round of a walk: every shard's batch of at most ``batch`` after ``after``.
Round = Callable[[uuid.UUID, int], Awaitable[Sequence[Batch]]]


async def walk(
    round_: Round,
    *,
    shards: int,
    namespace: str,
    action: BulkAction,
    dry_run: bool,
    page_token: str,
    max_tasks: int,
    deadline_s: float,
) -> BulkDone:
    """Rounds of ``round_`` from ``page_token`` until the walk's end, ``max_tasks`` or the
    deadline (a round started before it runs to its end: one statement per shard)."""
    after = after_token(page_token)
    loop = asyncio.get_running_loop()
    ends = loop.time() + deadline_s
    count = 0
    ready: Counter[str] = Counter()
    size = MAX_FILTER_EXAMINED if dry_run else BULK_BATCH
    while True:
        left = max_tasks - count
        if left <= 0:
            break
        batches = await round_(after, max(1, min(size, left // max(1, shards))))
        n, upto, queues = merged(batches, dry_run=dry_run)
        count += n
        ready.update(queues)
        if upto is None:
            return _done(count, "", dry_run, namespace, action, ready)
        after = upto
        if loop.time() >= ends:
            break
        await asyncio.sleep(0)  # the loop's other work between two statements
    return _done(count, str(after), dry_run, namespace, action, ready)


def _done(
    count: int,
    token: str,
    dry_run: bool,
    namespace: str,
    action: BulkAction,
    queues: Counter[str],
) -> BulkDone:
    # READY tasks wake claims of their queue; so does a cancel of a task with a concurrency
    # key (if it was running, a slot of its key is free; else the wake-up finds nothing).
    effects = NO_EFFECTS
    if not dry_run and queues:
        effects = made_ready({(namespace, q): n for q, n in queues.items()})
    return BulkDone(BulkOutcome(count, token, dry_run), effects)


async def list_filtered(
    conn: Any,
    namespace: str,
    where: TaskFilter,
    *,
    page_size: int,
    after: uuid.UUID,
    max_bytes: int,
    row_bytes: int,
) -> Page:
    """A page of ``filter_walk`` (see ``list_tasks_filtered``): it may hold fewer than
    ``page_size`` tasks, even none, and still have a next token."""
    states = [int(where.state)] if where.state is not None else [int(s) for s in ALL_STATES]
    rows = await conn.fetch(
        q("list_tasks_filtered"),
        namespace,
        states,
        after,
        page_size,
        MAX_FILTER_EXAMINED,
        *filter_args(where),
        max_bytes,
        row_bytes,
    )
    kept = [r for r in rows if r["id"] is not None]
    tasks = await converted(kept, task_of)
    picked = rows[0]["picked"] if rows else 0
    nxt = rows[0]["next"] if rows else None
    if len(kept) < picked:  # cut short by the byte budget: go on after the last one kept
        return Page(tasks, tasks[-1].id)
    return Page(tasks, "" if nxt is None else str(nxt))


class BulkStatements(Connected):
    """Bulk operations by filter on one database (one shard)."""

    async def bulk_batch(
        self,
        action: BulkAction,
        namespace: str,
        where: TaskFilter,
        after: uuid.UUID,
        batch: int,
        now: datetime,
        *,
        dry_run: bool = False,
    ) -> Batch:
        """One statement of a bulk walk: at most ``batch`` rows after ``after``."""
        states = [int(s) for s in where.states_for(action)]
        if not states:
            return Batch(0, None)
        head = (namespace, states, after, batch, MAX_FILTER_EXAMINED, *filter_args(where))
        async with self.connection() as conn:
            if dry_run:
                row = await conn.fetchrow(q("bulk_match"), *head)
                return Batch(len(row["ids"]), row["next"], ids=tuple(row["ids"]))
            extra: tuple[Any, ...] = (now,)
            if action is not BulkAction.CANCEL:
                extra += (bucket_of(now, self.bucket_seconds),)
            row = await conn.fetchrow(self._q(_STATEMENTS[action]), *head, *extra)
        return Batch(row["n"], row["next"], queues=tuple(row["queues"]))

    async def bulk_where(
        self,
        action: BulkAction,
        namespace: str,
        where: TaskFilter,
        now: datetime,
        *,
        dry_run: bool = False,
        page_token: str = "",
        max_tasks: int = MAX_BULK_TASKS,
        deadline_s: float = BULK_DEADLINE_S,
    ) -> BulkDone:
        """``action`` on the tasks of ``namespace`` that ``where`` matches, in batches, from
        ``page_token`` on; at most ``max_tasks`` of them, for at most about ``deadline_s``."""

        async def one_round(after: uuid.UUID, batch: int) -> list[Batch]:
            return [
                await self.bulk_batch(action, namespace, where, after, batch, now, dry_run=dry_run)
            ]

        return await walk(
            one_round,
            shards=1,
            namespace=namespace,
            action=action,
            dry_run=dry_run,
            page_token=page_token,
            max_tasks=max_tasks,
            deadline_s=deadline_s,
        )
