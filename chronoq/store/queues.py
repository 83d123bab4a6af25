"""Queue settings: pause, resume (with its misfire pass) and the per-key limits of a queue.

A row of ``queue_settings`` per (namespace, queue) that sets anything; a queue without one is
unpaused and unlimited, and a row set back to that is removed (it frees its place under the
namespace's cap). The claim statement reads the row (a paused queue is skipped whole), and the
hand-off statements refuse a gated queue, so a pause holds at once on every node, whatever
their dispatch gates have read. A store of shards writes each setting to every shard
(``chronoq.store.shard_queues``).
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from datetime import datetime
from typing import Any

from chronoq.errors import NamespaceCapReached
from chronoq.limits import RESUME_SKIP_BATCH, RESUME_WAKE_COUNT
from chronoq.queue_settings import QueueSettings, Resumed
from chronoq.saturating import ms_of
from chronoq.store.connection import Connected
from chronoq.store.sql import q

#: Settings rows one statement copies to a shard joining the map.
COPY_BATCH = 1000
#: Below every task id: a misfire pass starts its walk after it.
_FIRST_ID = uuid.UUID(int=0)


def settings_of(row: Any) -> QueueSettings:
    return QueueSettings(
        namespace=row["namespace"],
        queue=row["queue"],
        paused=row["paused"],
        paused_at=row["paused_at"],
        max_running_per_key=row["max_running_per_key"],
        max_starts_per_key=row["max_starts_per_key"],
        updated_at=row["updated_at"],
    )


class QueueStatements(Connected):
    """The statements of queue settings on one database."""

    async def set_queue(
        self,
        namespace: str,
        queue: str,
        now: datetime,
        *,
        max_running_per_key: int | None = None,
        max_starts_per_key: float | None = None,
        cap: int,
    ) -> QueueSettings:
        """Set a queue's per-key limits (None keeps one as it is; 0 removes it). A namespace
        holds at most ``cap`` queues with settings (``NamespaceCapReached`` for one more)."""
        async with self.connection() as conn, conn.transaction():
            row = await conn.fetchrow(
                q("set_queue_settings"),
                namespace,
                queue,
                max_running_per_key,
                max_starts_per_key,
                now,
                cap,
            )
            if row is None:
                raise NamespaceCapReached(namespace, "queue settings", cap)
            await conn.execute(q("drop_default_queue_settings"), namespace, queue)
        return settings_of(row)

    async def pause_queue(
        self, namespace: str, queue: str, now: datetime, *, cap: int
    ) -> QueueSettings:
        """Pause a queue: its due tasks still fire, no claim takes them until it resumes. A
        paused queue keeps the instant its pause began."""
        async with self.connection() as conn:
            row = await conn.fetchrow(q("pause_queue"), namespace, queue, now, cap)
        if row is None:
            raise NamespaceCapReached(namespace, "queue settings", cap)
        return settings_of(row)

    async def skip_overdue_ready(self, namespace: str, queue: str, now: datetime) -> int:
        """A resume's misfire pass: READY tasks of the queue whose policy is SKIP and whose
        run_at is older than their grace at ``now`` go SKIPPED. Walks the namespace's READY
        tasks in batches of ``RESUME_SKIP_BATCH`` (each statement reads at most that many);
        returns how many were skipped."""
        skipped = 0
        after = _FIRST_ID
        while True:
            async with self.connection() as conn:
                row = await conn.fetchrow(
                    self._q("skip_overdue_ready"),
                    namespace,
                    queue,
                    now,
                    RESUME_SKIP_BATCH,
                    after,
                    ms_of(self.horizon),
                )
            skipped += int(row["skipped"])
            if row["last"] is None:
                return skipped
            after = row["last"]

    async def unpause_queue(self, namespace: str, queue: str, now: datetime) -> QueueSettings:
        """The settings row's part of a resume (no misfire pass: ``resume_queue`` runs it)."""
        async with self.connection() as conn, conn.transaction():
            row = await conn.fetchrow(q("resume_queue"), namespace, queue, now)
            if row is None:
                return QueueSettings(namespace, queue, updated_at=now)
            await conn.execute(q("drop_default_queue_settings"), namespace, queue)
        return settings_of(row)

    async def resume_queue(self, namespace: str, queue: str, now: datetime) -> Resumed:
        """Resume a paused queue: first its misfire pass (while still paused, so no claim
        takes a task the pass would skip), then the pause ends; answers what it skipped and
        the READY tasks left to wake claims for (up to ``RESUME_WAKE_COUNT``)."""
        skipped = await self.skip_overdue_ready(namespace, queue, now)
        settings = await self.unpause_queue(namespace, queue, now)
        return Resumed(settings, skipped, await self.ready_count(namespace, queue))

    async def ready_count(self, namespace: str, queue: str) -> int:
        """READY tasks of the queue, counted up to ``RESUME_WAKE_COUNT`` (none while paused)."""
        async with self.connection() as conn:
            rows = await conn.fetch(q("ready_counts"), [namespace], [queue], [RESUME_WAKE_COUNT])
        return sum(int(r["n"]) for r in rows)

    async def queue_settings(self, namespace: str, queue: str) -> QueueSettings:
        """A queue's settings (the defaults when it has none)."""
        async with self.connection() as conn:
            row = await conn.fetchrow(q("get_queue_settings"), namespace, queue)
        return QueueSettings(namespace, queue) if row is None else settings_of(row)

    async def list_queue_settings(self, namespace: str, *, limit: int) -> list[QueueSettings]:
        """The queues of ``namespace`` with settings, by name, at most ``limit``."""
        async with self.connection() as conn:
            rows = await conn.fetch(q("list_queue_settings"), namespace, limit)
        return [settings_of(r) for r in rows]

    async def copy_queue_settings(self, rows: Sequence[QueueSettings]) -> None:
        """Write ``rows`` (another shard's settings) here, ``COPY_BATCH`` a statement; a row
        this shard has already stays (a shard joining the map takes the first shard's)."""
        for start in range(0, len(rows), COPY_BATCH):
            part = rows[start : start + COPY_BATCH]
            async with self.connection() as conn:
                await conn.execute(
                    q("copy_queue_settings"),
                    [r.namespace for r in part],
                    [r.queue for r in part],
                    [r.paused for r in part],
                    [r.paused_at for r in part],
                    [r.max_running_per_key for r in part],
                    [r.max_starts_per_key for r in part],
                    [r.updated_at for r in part],
                )

    async def gated_queues(self) -> list[QueueSettings]:
        """Every namespace's queues that are paused or limited per key (the dispatch gate's)."""
        async with self.connection() as conn:
            rows = await conn.fetch(q("gated_queue_settings"))
        return [settings_of(r) for r in rows]
