"""Claims of queues limited per concurrency key: at most ``max_running_per_key`` RUNNING tasks
of one key and ``max_starts_per_key`` starts of it a second, cluster-wide.

A key's tasks all sit in one partition (the key routes them), hence in one store shard, so the
shard decides alone. Its claim is one transaction of two statements (``queries.sql``):

1. ``key_candidates`` reads, without locks, the keys that may start a task now: the keys among
   the first READY tasks of the queue in claim order, and a walk from key to key over
   ``tasks_ready_keys`` (one probe each) from where the last walk of this store stopped, which
   stops after ``walk_bound`` keys or once it found enough free ones. Each candidate key's
   *transaction-level advisory lock* is then tried; a key another claim holds is passed over.
2. ``claim_keyed``, a fresh statement, counts each locked key's RUNNING tasks again, claims at
   most the limit minus that count (and no more than the key's whole tokens), the key's tasks
   in (priority DESC, run_at) order, and spends the tokens, in the same write.

Why locks and a second statement: in READ COMMITTED a statement's snapshot is taken when it
starts, so one statement that counted a key's RUNNING tasks cannot see a slot that a
concurrent claim takes and commits meanwhile: two claims would each see a free slot and both
start a task. The key's lock serialises the claims of one key; the lock holder that came
before committed before its lock was released, and the statement that counts starts after the
lock is held, so it sees that commit. Try-locks, not waits: a claim never queues behind
another on a key (it takes other keys' work instead), and holding several keys cannot
deadlock. A lock, not a counter row: the count is read from the tasks themselves, so nothing
has to be decremented when a task leaves RUNNING (complete, fail, cancel, release, a lease
reaped, a partition moved), and no count can drift. The locks end with the transaction, like
row locks; a new primary after a failover holds none and no transaction of the old one.

A slot is held while its task is RUNNING: a crashed worker's slot is freed when the reaper
moves its expired lease out of RUNNING, at most the lease timeout plus the reaper's interval
after the worker's last heartbeat. The node wakes the claims waiting on the queue when a slot
is freed (``chronoq.effects.freed``).

Cost: the first ``front_window`` READY entries of each queue, and per key walked at most its
limit of RUNNING entries and two probes: bounded whatever the backlog of full keys. A key is
full only with ``max_running_per_key`` RUNNING tasks, so full keys are at most the queue's
RUNNING tasks / limit; a walk longer than that always reaches a free key when one has work,
and a shorter one goes on from its cursor at the next claim (every key is reached within
keys / ``walk_bound`` claims). A task without a key in a keyed queue is not limited; it is
claimed when it is among the first ``front_window`` READY tasks of its queue.

The front's keys are checked best first and only until twice the claim's want are free, a
queue whose front has enough free keys is not walked (a walk finds only worse heads), and the
keyless tasks are looked for only in queues whose front has one. Measured with ``chronoq
bench throughput --phases keys`` (20,000 tasks, 1,000 keys of limit 1, 3 alternating runs,
medians): CPU per task node+workers+PostgreSQL 438 µs before, 406 after (PostgreSQL alone
244 → 225; without keys 222 and 88), 2,305 → 2,932 keyed tasks/s.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from datetime import datetime
from typing import Any

from chronoq.store.sql import q

#: The advisory lock class of a concurrency key ("chqk"); the key itself is hashed into the
#: second half. A collision of two keys' hashes only makes one claim pass over the other key.
KEY_LOCK_CLASS = 0x6368716B
#: Queues whose walk cursor a store remembers (all forgotten past this: walks restart).
CURSOR_ENTRIES = 4096
#: How the keyed statements are planned, for their transaction only. Once per connection
#: (``force_generic_plan``): they take milliseconds to plan and their plans do not depend on
#: the values. Without sorts where an index gives the order (``enable_sort``): a plan made on
#: statistics read while few tasks were READY (a queue whose tasks were all SCHEDULED at the
#: last ANALYZE, then came due at once) costs every partial index of READY tasks at one row,
#: and may read a key's or the walk's next tasks from ``tasks_ready`` and sort them: the
#: queue's whole READY range per key walked. Measured so, with 20,000 READY tasks over 1,000
#: keys: key_candidates 319 ms and claim_keyed 227 ms a call, 3.4 ms and 0.8 ms with the
#: sorts disabled (the plans made on fresh statistics, which are the same either way). The
#: sorts no index can spare (DISTINCT ON, the claim order of candidates) are still made.
PLAN_SETTINGS = "SET LOCAL plan_cache_mode = force_generic_plan; SET LOCAL enable_sort = off"
#: Seconds between two purges of refilled key token rows by one store.
PURGE_EVERY_S = 10.0
#: key_tokens rows one purge deletes at most.
PURGE_BATCH = 1000


def front_window(want: int) -> int:
    """READY entries read at the front of each keyed queue for a claim of ``want`` tasks."""
    return min(max(4 * want, 32), 1000)


def walk_bound(want: int) -> int:
    """Keys a claim of ``want`` tasks walks at most per keyed queue."""
    return min(max(2 * want, 64), 1000)


class KeyCursors:
    """Where the next walk over each keyed queue's keys starts (after the last key walked),
    so that successive claims of one store reach every key, not the same first ones."""

    def __init__(self, most: int = CURSOR_ENTRIES) -> None:
        self._most = most
        self._at: dict[tuple[str, str], str] = {}
        self._purged = float("-inf")
        self._serial: dict[tuple[str, tuple[str, ...]], asyncio.Lock] = {}

    def serial(self, namespace: str, queues: Sequence[str]) -> asyncio.Lock:
        """The lock one store's keyed claims of these queues take one after the other.

        Claims in flight together read the same front and try the same keys in the same
        order: all but the first find the best keys held and take few or none, each at the
        full cost of its reads (measured: 17 of 117 claims took no key, many took a fraction
        of what they wanted). One after the other, each reads what the one before started
        and takes other keys. Taken before the claim's connection, so waiting holds none.
        Claims of other stores still run beside it: the keys' locks keep the limit, this
        only spares wasted reads."""
        key = (namespace, tuple(sorted(queues)))
        lock = self._serial.get(key)
        if lock is None:
            if len(self._serial) >= self._most:
                self._serial = {k: v for k, v in self._serial.items() if v.locked()}
            lock = self._serial[key] = asyncio.Lock()
        return lock

    def of(self, namespace: str, queues: Sequence[str]) -> list[str]:
        return [self._at.get((namespace, queue), "") for queue in queues]

    def advance(self, namespace: str, queue: str, key: str) -> None:
        if len(self._at) >= self._most:
            self._at.clear()
        self._at[(namespace, queue)] = key

    def purge_due(self) -> bool:
        """Whether this store should purge refilled token rows now (then not for a while)."""
        now = time.monotonic()
        if now - self._purged < PURGE_EVERY_S:
            return False
        self._purged = now
        return True


async def claim_keyed(
    conn: Any,
    map_version: int,
    cursors: KeyCursors,
    namespace: str,
    queues: Sequence[str],
    caps: Sequence[int],
    worker_id: str,
    max_tasks: int,
    now: datetime,
    lease_bounds_ms: tuple[int, int],
    max_bytes: int,
    fixed_bytes: int,
) -> list[Any]:
    """The rows claimed from the keyed ``queues`` (each with its cap), in one transaction."""
    window, walk = front_window(max_tasks), walk_bound(max_tasks)
    async with conn.transaction():
        await conn.execute(PLAN_SETTINGS)
        found = await conn.fetch(
            q("key_candidates"),
            namespace,
            now,
            list(queues),
            cursors.of(namespace, queues),
            window,
            walk,
            max_tasks,
        )
        keys = [(r["queue"], r["key"]) for r in found if r["key"] is not None]
        keyless = [r["queue"] for r in found if r["keyless"]]
        for r in found:
            if r["cursor"] is not None:
                cursors.advance(namespace, r["queue"], r["cursor"])
        rows = list(
            await conn.fetch(
                q("claim_keyed", map_version),
                namespace,
                now,
                [queue for queue, _ in keys],
                [key for _, key in keys],
                list(queues),
                list(caps),
                max_tasks,
                worker_id,
                *lease_bounds_ms,
                max_bytes,
                fixed_bytes,
                window,
                keyless,
            )
        )
    if cursors.purge_due():
        await conn.execute(q("purge_key_tokens"), now, PURGE_BATCH)
    return rows


async def key_heads(
    conn: Any,
    cursors: KeyCursors,
    namespace: str,
    queues: Sequence[str],
    most: int,
    worker_id: str,
    now: datetime,
    fixed_bytes: int,
) -> list[Any]:
    """The first ``most`` tasks a claim of the keyed ``queues`` could take, unlocked."""
    async with conn.transaction():
        await conn.execute(PLAN_SETTINGS)
        rows = await conn.fetch(
            q("key_heads"),
            namespace,
            now,
            list(queues),
            cursors.of(namespace, queues),
            front_window(most),
            walk_bound(most),
            most,
            worker_id,
            fixed_bytes,
        )
    return list(rows)
