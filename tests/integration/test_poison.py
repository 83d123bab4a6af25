"""Poison rows written straight into PostgreSQL never stop the other tenants' work.

Each test writes rows no request can create today (overflowing durations, states and enum
values no version writes, instants past the year 9999, bad cron text), as an older version,
a bug or a hand edit could have, next to ordinary tasks of another namespace in the same
partitions. The node's own loops keep firing, reaping and materialising the others on time;
a poison row either works after saturation or is quarantined with its reason.

Where today's arithmetic can no longer fail on any stored value, the isolation itself is
driven by a fault hook in the database: a trigger that raises a data error when one marked
row changes state, as a row the statements cannot process would.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Awaitable, Callable
from datetime import datetime, timedelta
from typing import Any

import asyncpg
import pytest

from chronoq.buckets import bucket_of
from chronoq.client import Client
from chronoq.clock import ManualClock
from chronoq.coordinator.local import LocalOwnership
from chronoq.models import Lease, TaskSpec, TaskState
from chronoq.store import Store
from chronoq.store.schedules import Schedules
from chronoq.store.sql import q
from tests.integration.conftest import NodeFactory

pytestmark = pytest.mark.timeout(120)

BIGINT_MAX = 2**63 - 1
INT_MAX = 2**31 - 1
POISON_PAYLOAD = b"poison"  # the row the fault hook refuses to move

# The fault hook: a data error ("numeric value out of range") whenever the marked row would
# leave its state for anything but DEAD, as a row the statements cannot process does.
FAULT_HOOK = """
CREATE FUNCTION refuse_poison() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF NEW.payload = '\\x706f69736f6e'::bytea AND NEW.state <> OLD.state AND NEW.state <> 4 THEN
        RAISE EXCEPTION 'this row cannot be processed' USING ERRCODE = '22003';
    END IF;
    RETURN NEW;
END $$;
CREATE TRIGGER refuse_poison BEFORE UPDATE ON tasks
    FOR EACH ROW EXECUTE FUNCTION refuse_poison();
"""


async def insert_task(
    store: Store, now: datetime, *, namespace: str, queue: str, run_at: datetime, **cols: Any
) -> uuid.UUID:
    """One task row written directly, with any column values (defaults as a submit's)."""
    task_id = uuid.uuid4()
    row: dict[str, Any] = {
        "id": task_id,
        "namespace": namespace,
        "queue": queue,
        "partition": 3,
        "bucket": bucket_of(run_at, store.bucket_seconds),
        "run_at": run_at,
        "state": 0,
        "max_attempts": 3,
        "backoff_initial_ms": 1000,
        "backoff_max_ms": 300_000,
        "lease_timeout_ms": 30_000,
        "misfire_grace_ms": 60_000,
        "created_at": now,
        **cols,
    }
    names = ", ".join(row)
    params = ", ".join(f"${i}" for i in range(1, len(row) + 1))
    async with store.pool.acquire() as conn:
        await conn.execute(f"INSERT INTO tasks ({names}) VALUES ({params})", *row.values())
    return task_id


async def sql(store: Store, statement: str, *args: Any) -> Any:
    async with store.pool.acquire() as conn:
        return await conn.fetch(statement, *args)


async def install_fault_hook(store: Store) -> None:
    async with store.pool.acquire() as conn:
        await conn.execute(FAULT_HOOK)


async def states(store: Store, ids: list[uuid.UUID] | list[str]) -> dict[str, int]:
    rows = await sql(store, "SELECT id, state FROM tasks WHERE id = ANY($1::uuid[])", ids)
    return {str(r["id"]): r["state"] for r in rows}


async def eventually(check: Callable[[], Awaitable[bool]], seconds: float = 20.0) -> None:
    """Wait for the node's own loops to get somewhere (bounded; fails if they never do)."""
    for _ in range(int(seconds / 0.05)):
        if await check():
            return
        await asyncio.sleep(0.05)
    assert await check(), "the node's loops did not get there in time"


async def good_tasks(store: Store, now: datetime, n: int, delay: timedelta) -> list[str]:
    """Ordinary tasks of another namespace, spread over every partition."""
    specs = [TaskSpec(queue="ok", namespace="tenant-b", run_at=now + delay) for _ in range(n)]
    return [o.task.id for o in await store.submit(specs, now)]


async def test_firing_goes_on_past_overflowing_and_unknown_values(
    make_node: NodeFactory, clock: ManualClock, store: Store
) -> None:
    now = clock.now()
    good = await good_tasks(store, now, 40, timedelta(seconds=5))
    due = now + timedelta(seconds=4)
    grace_max = await insert_task(
        store,
        now,
        namespace="a",
        queue="p",
        run_at=due,
        misfire_policy=1,
        misfire_grace_ms=BIGINT_MAX,
    )
    grace_min = await insert_task(
        store,
        now,
        namespace="a",
        queue="p",
        run_at=due,
        misfire_policy=1,
        misfire_grace_ms=-BIGINT_MAX,
    )
    policy_9 = await insert_task(store, now, namespace="a", queue="p", run_at=due, misfire_policy=9)
    # Due by its bucket, at a time past what a client can decode.
    far = await insert_task(
        store, now, namespace="a", queue="p", run_at=due, bucket=bucket_of(due) - 1
    )
    await sql(store, "UPDATE tasks SET run_at = run_at + interval '20000 years' WHERE id = $1", far)
    # A state no version writes, due by its bucket: no statement may pick it up.
    state_7 = await insert_task(store, now, namespace="a", queue="p", run_at=due, state=7)

    node = await make_node(clock=clock)
    clock.advance(timedelta(seconds=6))
    node.partitions_changed(set())  # tick now

    async def all_fired() -> bool:
        return set((await states(store, good)).values()) == {TaskState.READY}

    await eventually(all_fired)
    got = await states(store, [grace_max, grace_min, policy_9, far, state_7])
    assert got[str(grace_max)] == TaskState.READY  # the grace saturated at the horizon
    assert got[str(grace_min)] == TaskState.SKIPPED  # a negative grace reads as none
    assert got[str(policy_9)] == TaskState.READY  # an unknown policy fires late, as it reads
    assert got[str(far)] == TaskState.READY
    assert got[str(state_7)] == 7  # untouched
    assert node.firer is not None and node.firer.stats.errors == 0

    # The fired poison rows can be claimed; their instants read clamped, not as an error.
    claimed = {t.id: t for t in await store.claim("a", ["p"], "w", 10, clock.now())}
    assert set(claimed) == {str(grace_max), str(policy_9), str(far)}
    assert claimed[str(far)].run_at.year == 9999


async def test_a_row_the_fire_statement_cannot_process_is_quarantined(
    make_node: NodeFactory, clock: ManualClock, store: Store
) -> None:
    now = clock.now()
    await install_fault_hook(store)
    good = await good_tasks(store, now, 60, timedelta(seconds=5))
    bad = await insert_task(
        store,
        now,
        namespace="a",
        queue="p",
        run_at=now + timedelta(seconds=5),
        payload=POISON_PAYLOAD,
    )
    node = await make_node(clock=clock)
    clock.advance(timedelta(seconds=6))
    node.partitions_changed(set())

    async def all_fired() -> bool:
        return set((await states(store, good)).values()) == {TaskState.READY}

    await eventually(all_fired)
    dead = await store.get(str(bad), "a")
    assert dead.state is TaskState.DEAD
    assert (dead.last_error or "").startswith("quarantined: this row cannot be processed")
    assert node.firer is not None and node.firer.stats.quarantined == 1


async def test_reaping_goes_on_past_overflowing_backoffs_and_impossible_leases(
    make_node: NodeFactory, clock: ManualClock, store: Store
) -> None:
    now = clock.now()
    await install_fault_hook(store)
    good = await good_tasks(store, now, 30, timedelta(0))
    assert len(await store.claim("tenant-b", ["ok"], "crashed", 100, now)) == 30
    expired = now - timedelta(seconds=1)
    running: dict[str, Any] = {"state": 2, "attempt": 1, "worker_id": "old", "lease_until": expired}
    huge_backoff = await insert_task(
        store,
        now,
        namespace="a",
        queue="p",
        run_at=now,
        backoff_initial_ms=BIGINT_MAX,
        backoff_max_ms=BIGINT_MAX,
        **running,
    )
    negative_backoff = await insert_task(
        store,
        now,
        namespace="a",
        queue="p",
        run_at=now,
        backoff_initial_ms=-BIGINT_MAX,
        backoff_max_ms=-5,
        **running,
    )
    base_past_attempt = await insert_task(
        store, now, namespace="a", queue="p", run_at=now, retry_base=50, **running
    )
    no_lease = await insert_task(
        store, now, namespace="a", queue="p", run_at=now, **{**running, "lease_until": None}
    )
    # An older version's claim computed a lease past the year 9999 and stored it.
    endless = await insert_task(store, now, namespace="a", queue="p", run_at=now, **running)
    await sql(
        store,
        "UPDATE tasks SET lease_until = $2::timestamptz + interval '20000 years' WHERE id = $1",
        endless,
        now,
    )
    refused = await insert_task(
        store, now, namespace="a", queue="p", run_at=now, payload=POISON_PAYLOAD, **running
    )

    await make_node(clock=clock)
    clock.advance(timedelta(seconds=31))  # the good tasks' 30 s leases run out

    async def all_reaped() -> bool:
        return TaskState.RUNNING not in set((await states(store, good)).values())

    await eventually(all_reaped)
    assert set((await states(store, good)).values()) <= {TaskState.SCHEDULED, TaskState.READY}

    async def poison_settled() -> bool:
        got = await states(store, [huge_backoff, no_lease, endless, refused])
        return TaskState.RUNNING not in got.values()

    await eventually(poison_settled)
    later = clock.now()
    retried = await store.get(str(huge_backoff), "a")
    assert retried.state is TaskState.SCHEDULED
    horizon = store.horizon
    assert later + horizon / 2 - timedelta(seconds=1) <= retried.run_at <= later + horizon
    for task_id in (negative_backoff, base_past_attempt, no_lease, endless):
        task = await store.get(str(task_id), "a")
        assert task.state in (TaskState.READY, TaskState.SCHEDULED), task
        assert task.run_at <= later + timedelta(minutes=6)
    dead = await store.get(str(refused), "a")
    assert dead.state is TaskState.DEAD
    assert (dead.last_error or "").startswith("quarantined: this row cannot be processed")


async def test_claims_saturate_leases_and_set_aside_exhausted_attempt_counters(
    store: Store, clock: ManualClock
) -> None:
    now = clock.now()
    ready: dict[str, Any] = {"state": 1}
    zero = await insert_task(
        store, now, namespace="a", queue="p", run_at=now, lease_timeout_ms=0, **ready
    )
    huge = await insert_task(
        store, now, namespace="a", queue="p", run_at=now, lease_timeout_ms=BIGINT_MAX, **ready
    )
    negative = await insert_task(
        store, now, namespace="a", queue="q", run_at=now, lease_timeout_ms=-BIGINT_MAX, **ready
    )
    exhausted = await insert_task(
        store, now, namespace="a", queue="q", run_at=now, attempt=INT_MAX, **ready
    )
    fine = await insert_task(store, now, namespace="a", queue="q", run_at=now, **ready)

    claimed = {t.id: t for t in await store.claim("a", ["p", "q"], "w", 10, now)}
    assert set(claimed) == {str(zero), str(huge), str(negative), str(fine)}
    limits = store.limits
    assert claimed[str(zero)].lease_until == now + limits.min_lease_timeout
    assert claimed[str(negative)].lease_until == now + limits.min_lease_timeout
    assert claimed[str(huge)].lease_until == now + limits.max_lease_timeout
    dead = await store.get(str(exhausted), "a")
    assert dead.state is TaskState.DEAD and (dead.last_error or "").startswith("quarantined:")

    beats = await store.heartbeat(
        "a", [Lease(str(huge), 1), Lease(str(zero), 1)], now + timedelta(seconds=1)
    )
    assert all(b.ok for b in beats)
    (lease_until,) = await sql(store, "SELECT lease_until FROM tasks WHERE id = $1", huge)
    assert lease_until[0] == now + timedelta(seconds=1) + limits.max_lease_timeout


async def test_unknown_states_read_as_dead_without_failing_the_page(
    store: Store, clock: ManualClock
) -> None:
    now = clock.now()
    ok = await insert_task(store, now, namespace="a", queue="p", run_at=now, state=1)
    state_9 = await insert_task(store, now, namespace="a", queue="p", run_at=now, state=9)
    odd = await insert_task(
        store,
        now,
        namespace="a",
        queue="p",
        run_at=now,
        state=4,
        misfire_policy=9,
        misfire_grace_ms=BIGINT_MAX,
        backoff_initial_ms=-1,
        lease_timeout_ms=BIGINT_MAX,
    )
    far = await insert_task(store, now, namespace="a", queue="p", run_at=now, state=3)
    await sql(
        store,
        "UPDATE tasks SET created_at = created_at + interval '30000 years', "
        "finished_at = created_at - interval '3000 years' WHERE id = $1",
        far,
    )

    page = await store.list_tasks("a", page_size=10)
    by_id = {t.id: t for t in page.tasks}
    assert set(by_id) == {str(ok), str(state_9), str(odd), str(far)}
    unknown = by_id[str(state_9)]
    assert unknown.state is TaskState.DEAD
    assert "stored state 9 is unknown" in (unknown.last_error or "")
    assert by_id[str(odd)].backoff_initial == timedelta(0)
    assert by_id[str(far)].created_at is not None and by_id[str(far)].created_at.year == 9999
    assert (await store.get(str(state_9), "a")).state is TaskState.DEAD
    counts = await store.count_by_state()
    assert counts[TaskState.DEAD] == 2 and counts[TaskState.READY] == 1
    (miss,) = await store.heartbeat("a", [Lease(str(state_9), 1)], now)
    assert not miss.ok and "DEAD" in miss.error
    # It reads as DEAD, so it can be requeued like a dead task.
    (requeued,) = await store.requeue("a", [str(state_9)], now)
    assert requeued.state is TaskState.READY


async def insert_schedule(
    store: Store, now: datetime, name: str, *, namespace: str = "a", **cols: Any
) -> uuid.UUID:
    """One schedule row written directly (an every-minute interval unless told)."""
    schedule_id = uuid.uuid4()
    row: dict[str, Any] = {
        "id": schedule_id,
        "namespace": namespace,
        "name": name,
        "partition": 3,
        "queue": name,
        "interval_ms": 60_000,
        "anchor": now,
        "max_attempts": 3,
        "backoff_initial_ms": 1000,
        "backoff_max_ms": 300_000,
        "lease_timeout_ms": 30_000,
        "next_fire_at": now + timedelta(seconds=5),
        "created_at": now,
        **cols,
    }
    names = ", ".join(row)
    params = ", ".join(f"${i}" for i in range(1, len(row) + 1))
    async with store.pool.acquire() as conn:
        await conn.execute(f"INSERT INTO schedules ({names}) VALUES ({params})", *row.values())
    return schedule_id


async def test_schedule_passes_go_on_past_schedules_they_cannot_materialise(
    make_node: NodeFactory, clock: ManualClock, store: Store
) -> None:
    now = clock.now()
    good = await insert_schedule(store, now, "good", namespace="tenant-b")
    cron = {"cron": "0 0 31 2 *", "interval_ms": None}  # February 31st: no next date
    poison = {
        "huge": await insert_schedule(store, now, "huge", interval_ms=BIGINT_MAX),
        "vast": await insert_schedule(store, now, "vast", interval_ms=2**52),
        "zero": await insert_schedule(store, now, "zero", interval_ms=0),
        "negative": await insert_schedule(store, now, "negative", interval_ms=-60_000),
        "feb31": await insert_schedule(store, now, "feb31", **cron),
        "garbage": await insert_schedule(
            store, now, "garbage", cron="not a cron", interval_ms=None
        ),
        "zone": await insert_schedule(
            store, now, "zone", cron="* * * * *", interval_ms=None, timezone="Nowhere/Land"
        ),
        "catchup": await insert_schedule(store, now, "catchup", catchup=9),
        "unreadable": await insert_schedule(store, now, "unreadable"),
    }
    await sql(
        store,
        "UPDATE schedules SET anchor = anchor + interval '20000 years' WHERE id = $1",
        poison["unreadable"],
    )
    lease_zero = await insert_schedule(store, now, "lease0", lease_timeout_ms=0)
    lease_huge = await insert_schedule(store, now, "leasemax", lease_timeout_ms=BIGINT_MAX)

    node = await make_node(clock=clock, schedule_interval=timedelta(milliseconds=200))

    async def made(queue: str) -> bool:
        rows = await sql(store, "SELECT 1 FROM tasks WHERE queue = $1", queue)
        return len(rows) > 0

    await eventually(lambda: made("good"))

    async def all_paused() -> bool:
        rows = await sql(
            store, "SELECT paused FROM schedules WHERE id = ANY($1::uuid[])", list(poison.values())
        )
        return all(r["paused"] for r in rows)

    await eventually(all_paused)
    rows = await sql(
        store,
        "SELECT name, paused_reason FROM schedules WHERE id = ANY($1::uuid[])",
        list(poison.values()),
    )
    reasons = {r["name"]: r["paused_reason"] for r in rows}
    assert all(why.startswith("quarantined: ") for why in reasons.values()), reasons
    assert "no next" in reasons["feb31"] or "failed to find" in reasons["feb31"]
    assert "time zone" in reasons["zone"]
    good_row = await sql(store, "SELECT paused, created_total FROM schedules WHERE id = $1", good)
    assert not good_row[0]["paused"] and good_row[0]["created_total"] >= 1

    # A schedule shows (and lists) despite its bad row, with the reason it was paused.
    schedules = Schedules(store)
    shown = await schedules.get("a", "huge")
    assert shown.paused and (shown.paused_reason or "").startswith("quarantined: ")
    assert len(await schedules.list_page("a")) == len(poison) + 2
    # ... and over the API too.
    async with Client(node.address, namespace="a") as client:
        remote = await client.get_schedule("huge")
    assert remote.paused and remote.paused_reason == shown.paused_reason

    # Bad lease timeouts were saturated into the limits in the tasks they made.
    await eventually(lambda: made("lease0"))
    await eventually(lambda: made("leasemax"))
    clock.advance(timedelta(seconds=6))
    node.partitions_changed(set())
    claim_now = clock.now()

    async def claimable() -> bool:
        rows = await sql(
            store, "SELECT 1 FROM tasks WHERE queue IN ('lease0', 'leasemax') AND state = 1"
        )
        return len(rows) == 2

    await eventually(claimable)
    claimed = {
        t.queue: t for t in await store.claim("a", ["lease0", "leasemax"], "w", 5, claim_now)
    }
    assert claimed["lease0"].lease_timeout == store.limits.min_lease_timeout
    assert claimed["leasemax"].lease_timeout == store.limits.max_lease_timeout
    assert claimed["leasemax"].lease_until == claim_now + store.limits.max_lease_timeout
    assert {t.id for t in claimed.values()} <= set(await _task_ids(store, lease_zero, lease_huge))


async def _task_ids(store: Store, *schedule_ids: uuid.UUID) -> list[str]:
    rows = await sql(
        store,
        "SELECT t.id FROM tasks t JOIN schedules s ON t.idempotency_key LIKE "
        "'schedule:' || s.id || ':%' WHERE s.id = ANY($1::uuid[])",
        list(schedule_ids),
    )
    return [str(r["id"]) for r in rows]


async def test_a_quarantine_by_a_stale_owner_writes_nothing(
    store: Store, clock: ManualClock
) -> None:
    """The quarantine writes of owner statements carry the fencing clause."""
    now = clock.now()
    await install_fault_hook(store)
    bad = await insert_task(
        store,
        now,
        namespace="a",
        queue="p",
        run_at=now,
        payload=POISON_PAYLOAD,
        state=2,
        attempt=1,
        lease_until=now - timedelta(seconds=1),
    )
    schedule = await insert_schedule(store, now, "zero", interval_ms=0)
    old = LocalOwnership(store, "old")
    await old.start()
    new = LocalOwnership(store, "new")
    await new.start()  # every token bumped: "old" is fenced
    later = now + timedelta(seconds=10)
    assert await store.reap_expired(old.owned(), later) == []
    assert (await Schedules(store).materialize(old.owned(), later)).quarantined == []
    # The quarantine statements themselves refuse a stale token, whatever the caller read.
    stale = (list(old.owned()), list(old.owned().values()))
    assert await sql(store, q("quarantine_tasks"), *stale, [bad], later, 2, "quarantined: x") == []
    assert await sql(store, q("quarantine_schedule"), *stale, schedule, "quarantined: x") == []
    assert (await states(store, [bad]))[str(bad)] == TaskState.RUNNING
    (paused,) = await sql(store, "SELECT paused FROM schedules WHERE id = $1", schedule)
    assert not paused["paused"]

    (dead,) = await store.reap_expired(new.owned(), later)
    assert dead.id == str(bad) and dead.state is TaskState.DEAD
    done = await Schedules(store).materialize(new.owned(), later)
    assert [i for i, _why in done.quarantined] == [str(schedule)]


def test_fault_hook_errors_are_data_errors() -> None:
    """The hook raises SQLSTATE 22003, the class the statements' own data errors have."""
    assert issubclass(asyncpg.exceptions.NumericValueOutOfRangeError, asyncpg.DataError)
