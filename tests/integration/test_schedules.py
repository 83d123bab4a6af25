"""Recurring schedules on a real node: CRUD, materialisation, catch-up, no double creation."""

from __future__ import annotations

import asyncio
import time
from datetime import timedelta
from typing import Any

import pytest

from chronoq import errors
from chronoq.client import Client, NewTask
from chronoq.clock import ManualClock
from chronoq.coordinator.local import LocalOwnership
from chronoq.node import Node
from chronoq.recurrence import CatchUp
from chronoq.store import Store
from chronoq.store.schedules import Schedules
from tests.integration.conftest import NodeFactory

pytestmark = pytest.mark.timeout(60)

#: The node's own schedule loop runs a pass at start and then rarely: the tests pump by hand
#: and count in the store, so a background pass between two of theirs changes nothing.
BY_HAND = timedelta(hours=1)


async def by_hand(node: Node) -> Node:
    """Let the pump's own first pass (it runs once at start) end: from then on the tests'
    ``pump`` calls are the only passes, so a schedule created next is not materialised before
    the test pauses it. Begun is not enough: a pass still reading the schedules would make
    the new schedule's first occurrence."""
    (loop,) = [loop for loop in node.supervisor.loops if loop.name == "schedules"]
    for _ in range(500):
        if loop.ended:
            return node
        await asyncio.sleep(0.01)
    raise AssertionError("the schedule pump never made its first pass")


@pytest.fixture
async def node(make_node: NodeFactory, clock: ManualClock) -> Node:
    return await by_hand(await make_node(clock=clock, schedule_interval=BY_HAND))


async def pump(node: Node) -> int:
    assert node.pump is not None
    return (await node.pump.pump()).created


async def occurrences(store: Store, queue: str) -> list[str]:
    async with store.pool.acquire() as conn:
        rows = await conn.fetch("SELECT run_at FROM tasks WHERE queue = $1 ORDER BY run_at", queue)
    return [r["run_at"].strftime("%H:%M:%S") for r in rows]


async def test_crud_and_refusals(client: Client) -> None:
    made = await client.create_schedule(
        "nightly", "reports", cron="30 2 * * *", timezone="Europe/Paris"
    )
    assert made.spec.rule.expression == "30 2 * * *" and not made.paused  # type: ignore[union-attr]
    every = await client.create_schedule("tick", "ticks", every=timedelta(seconds=30))
    assert [s.spec.name for s in await client.list_schedules()] == ["nightly", "tick"]
    assert (await client.pause_schedule("tick")).paused
    assert not (await client.resume_schedule("tick")).paused
    assert (await client.get_schedule("tick")).id == every.id
    await client.delete_schedule("nightly")
    with pytest.raises(errors.NotFound, match="no schedule 'nightly'"):
        await client.get_schedule("nightly")
    with pytest.raises(errors.PreconditionFailed, match="exists"):
        await client.create_schedule("tick", "ticks", every=timedelta(seconds=5))
    with pytest.raises(errors.BadRequest, match="not a 5-field cron"):
        await client.create_schedule("bad", "q", cron="every day")
    with pytest.raises(errors.BadRequest, match="IANA time zone"):
        await client.create_schedule("bad", "q", cron="* * * * *", timezone="Nowhere/Land")
    with pytest.raises(errors.BadRequest, match="at least"):
        await client.create_schedule("bad", "q", every=timedelta(milliseconds=5))
    with pytest.raises(errors.BadRequest, match="name: must not be empty"):
        await client.create_schedule("", "q", every=timedelta(seconds=5))
    with pytest.raises(errors.NotFound):
        await client.delete_schedule("never")


async def test_occurrences_become_tasks_ahead_of_time(
    node: Node, client: Client, clock: ManualClock, store: Store
) -> None:
    # Counted in the store, not from pump()'s answer: the node's own schedule loop may run a
    # pass between two of the test's.
    await client.create_schedule("every20", "e", every=timedelta(seconds=20), start_at=clock.now())
    await pump(node)
    assert len(await occurrences(store, "e")) == 4  # now, +20, +40, +60 s: the 60 s lookahead
    await pump(node)
    assert len(await occurrences(store, "e")) == 4  # nothing twice
    clock.advance(timedelta(seconds=30))
    await pump(node)  # +80 s came into the lookahead
    assert await occurrences(store, "e") == [
        "12:00:10",
        "12:00:30",
        "12:00:50",
        "12:01:10",
        "12:01:30",
    ]
    s = await client.get_schedule("every20")
    assert s.created_total == 5 and s.last_fire_at is not None


@pytest.mark.parametrize(
    ("policy", "created_on_return", "skipped"),
    # 10 occurrences missed while down (12:01:10 .. 12:10:10), 1 ahead within the lookahead
    [(CatchUp.ALL, 10 + 1, 0), (CatchUp.LATEST, 1 + 1, 9), (CatchUp.NONE, 1, 10)],
)
async def test_catch_up_after_downtime(
    make_node: NodeFactory,
    clock: ManualClock,
    store: Store,
    policy: CatchUp,
    created_on_return: int,
    skipped: int,
) -> None:
    node = await by_hand(
        await make_node(
            clock=clock, schedule_lookahead=timedelta(seconds=30), schedule_interval=BY_HAND
        )
    )
    client = Client(node.address)
    try:
        await client.create_schedule(
            "m",
            "catch",
            every=timedelta(minutes=1),
            start_at=clock.now() + timedelta(minutes=1),
            catch_up=policy,
        )
        await node.stop()  # the node is down for ten minutes
        clock.advance(timedelta(minutes=10, seconds=50))
        node2 = await make_node(
            clock=clock, schedule_lookahead=timedelta(seconds=30), schedule_interval=BY_HAND
        )
        await pump(node2)  # or its loop's first pass did it: the counts below say what was made
        sched = await Schedules(store).get("default", "m")
        assert sched.skipped_total == skipped and sched.created_total == created_on_return
    finally:
        await client.close()


async def test_failover_never_creates_an_occurrence_twice(store: Store, clock: ManualClock) -> None:
    from chronoq.models import ScheduleSpec
    from chronoq.recurrence import Every

    schedules = Schedules(store)
    await schedules.create(
        ScheduleSpec(name="s", queue="f", rule=Every(timedelta(seconds=10), clock.now())),
        clock.now(),
    )
    old = LocalOwnership(store, "old")
    await old.start()
    first = await schedules.materialize(old.owned(), clock.now())
    assert first.created == 7  # 0..60 s
    # The schedule's position is lost (as if the old owner died between the insert and the
    # update in another design): a new owner replays the same occurrences; keys dedupe them.
    async with store.pool.acquire() as conn:
        await conn.execute("UPDATE schedules SET next_fire_at = $1", clock.now())
    new = LocalOwnership(store, "new")
    await new.start()
    assert (await schedules.materialize(old.owned(), clock.now())).created == 0  # fenced
    await schedules.materialize(new.owned(), clock.now())
    async with store.pool.acquire() as conn:
        n = await conn.fetchval("SELECT count(*) FROM tasks WHERE queue = 'f'")
    assert n == 7


async def test_paused_schedule_creates_nothing_and_resumes_forward(
    node: Node, client: Client, clock: ManualClock, store: Store
) -> None:
    await client.create_schedule("p", "paused", every=timedelta(seconds=10), start_at=clock.now())
    await client.pause_schedule("p")
    clock.advance(timedelta(minutes=5))
    await pump(node)
    assert await occurrences(store, "paused") == []
    resumed = await client.resume_schedule("p")
    assert resumed.next_fire_at > clock.now()  # paused time is not caught up
    await pump(node)
    assert len(await occurrences(store, "paused")) == 6


async def test_schedule_cli(node: Node) -> None:
    import asyncio

    from typer.testing import CliRunner

    from chronoq.cli import app

    cli = CliRunner()

    class runner:  # the CLI runs its own event loop: keep it off ours
        @staticmethod
        async def invoke(app: object, args: list[str]) -> object:
            return await asyncio.to_thread(cli.invoke, app, args)  # type: ignore[arg-type]

    base = ["--address", node.address]
    made: Any = await runner.invoke(
        app, ["schedule", "create", "hourly", "--queue", "h", "--cron", "0 * * * *", *base]
    )
    assert made.exit_code == 0, made.output
    assert "hourly" in made.output
    client = Client(node.address)
    rule = (await client.get_schedule("hourly")).spec.rule
    await client.close()
    assert rule.expression == "0 * * * *"  # type: ignore[union-attr]
    listed: Any = await runner.invoke(app, ["schedule", "list", *base])
    assert "hourly" in listed.output and "active" in listed.output
    paused: Any = await runner.invoke(app, ["schedule", "pause", "hourly", *base])
    assert "paused" in paused.output
    bad: Any = await runner.invoke(
        app, ["schedule", "create", "x", "--queue", "h", "--cron", "nope", *base]
    )
    assert (
        bad.exit_code == 1 and "not a 5-field cron" in bad.output and "Traceback" not in bad.output
    )
    both: Any = await runner.invoke(
        app,
        ["schedule", "create", "x", "--queue", "h", "--every", "5s", "--cron", "* * * * *", *base],
    )
    assert both.exit_code == 2 and "exactly one" in both.output
    deleted: Any = await runner.invoke(app, ["schedule", "delete", "hourly", *base])
    assert deleted.exit_code == 0


async def _waiting(store: Store, queue: str) -> int:
    async with store.pool.acquire() as conn:
        return int(
            await conn.fetchval(
                "SELECT count(*) FROM tasks WHERE queue = $1 AND state = 0", queue
            )
        )


async def test_pause_and_delete_remove_unfired_occurrences_and_resume_makes_them_again(
    node: Node, client: Client, clock: ManualClock, store: Store
) -> None:
    await client.create_schedule("r", "removed", every=timedelta(seconds=10), start_at=clock.now())
    await pump(node)
    assert await _waiting(store, "removed") == 6  # +10 .. +60 s; the one due now is READY
    await client.pause_schedule("r")
    assert await _waiting(store, "removed") == 0
    assert len(await occurrences(store, "removed")) == 1  # what fired stays
    await pump(node)
    assert await _waiting(store, "removed") == 0  # paused: nothing made again
    await client.resume_schedule("r")
    await pump(node)
    assert await _waiting(store, "removed") == 6  # the same times, made again
    async with store.pool.acquire() as conn:  # one has fired and waits for its retry
        await conn.execute(
            "UPDATE tasks SET attempt = 1, fired_at = $1 WHERE id = (SELECT id FROM tasks "
            "WHERE queue = 'removed' AND state = 0 ORDER BY run_at LIMIT 1)",
            clock.now(),
        )
    await client.delete_schedule("r")
    async with store.pool.acquire() as conn:
        left = await conn.fetch("SELECT attempt FROM tasks WHERE queue = 'removed' AND state = 0")
    assert [r["attempt"] for r in left] == [1]  # the retry is a task that ran: it stays


async def test_schedule_churn_makes_no_more_than_the_submit_quota(
    make_node: NodeFactory, clock: ManualClock, store: Store
) -> None:
    """The attack: create schedules up to the quota's reservation, let the owner make their
    occurrences, delete them, again. Each round would make 20 x 6 tasks uncharged (2,648/s
    against 100/s before); paid from the namespace's bucket it makes the quota at most."""
    quota = 20.0
    node = await by_hand(
        await make_node(clock=clock, schedule_interval=BY_HAND, submit_quota=quota)
    )
    assert node.pump is not None
    created = rounds = 0
    async with Client(node.address, namespace="churn", timeout=10) as client:
        started = time.monotonic()
        while time.monotonic() - started < 3.0:
            names = [f"s{rounds}-{i}" for i in range(20)]
            for name in names:
                await client.create_schedule(
                    name, "churn", every=timedelta(seconds=1), start_at=clock.now()
                )
            created += (await node.pump.pump()).created
            for name in names:
                await client.delete_schedule(name)
            rounds += 1
        elapsed = time.monotonic() - started
    assert rounds * 20 * 6 > 3 * (quota * elapsed + quota)  # the attack was a real one
    assert 0 < created <= quota * elapsed + quota  # the rate and one burst at most
    async with store.pool.acquire() as conn:
        made = await conn.fetchval("SELECT count(*) FROM tasks WHERE namespace = 'churn'")
    assert made <= quota * elapsed + quota
    assert await _waiting(store, "churn") == 0  # what had not fired went with its schedule


async def test_a_namespace_out_of_quota_holds_no_place_of_another(
    make_node: NodeFactory, clock: ManualClock, store: Store
) -> None:
    """150 due schedules of a namespace that spent its quota, all in one partition (more
    than a batch), do not keep another namespace's schedule from being made."""
    from chronoq.models import ScheduleSpec
    from chronoq.recurrence import Cron

    node = await by_hand(
        await make_node(clock=clock, schedule_interval=BY_HAND, submit_quota=20.0, partitions=1)
    )
    assert node.pump is not None and node.schedules is not None
    schedules = node.schedules  # the node's partitions (one)
    for i in range(150):
        await schedules.create(
            ScheduleSpec(name=f"a{i}", queue="a", namespace="spent", rule=Cron("* * * * *")),
            clock.now(),
        )
    async with Client(node.address, namespace="spent", timeout=10) as spender:
        for _ in range(4):  # the namespace spends its whole bucket on submits
            await spender.submit_ids([NewTask(queue="x", run_at=clock.now())] * 5)
    await schedules.create(
        ScheduleSpec(name="b", queue="b", namespace="other", rule=Cron("* * * * *")),
        clock.now(),
    )
    clock.advance(timedelta(minutes=1))
    await node.pump.pump()
    assert len(await occurrences(store, "b")) >= 1


async def test_an_occurrence_in_the_history_is_not_made_again(
    store: Store, clock: ManualClock
) -> None:
    """An occurrence that ran and moved into the task history keeps its key: a schedule whose
    position goes back over it (resumed by a node whose clock is behind the owner's, or a
    replay as above) does not make and fire it a second time."""
    from chronoq.models import Lease, ScheduleSpec
    from chronoq.recurrence import Every

    schedules = Schedules(store)
    start = clock.now()
    rule = Every(timedelta(seconds=10), start)
    await schedules.create(
        ScheduleSpec(name="h", queue="hist", rule=rule, catch_up=CatchUp.ALL), start
    )
    owner = LocalOwnership(store, "owner")
    await owner.start()
    assert (await schedules.materialize(owner.owned(), start)).created == 7  # 0..60 s
    await store.fire_due(owner.owned(), start)
    (task,) = await store.claim("default", ["hist"], "w", 5, start)  # the one at 0 s
    (done,) = await store.complete("default", [Lease(task.id, task.attempt)], start)
    assert done.ok
    clock.advance(timedelta(minutes=2))
    now = clock.now()
    window = {"retention": timedelta(days=1), "width": timedelta(hours=1)}
    await store.keep_history(now, **window)
    retired = await store.retire_finished(
        list(range(store.partitions)), now, now, batch=100, **window
    )
    assert retired.gone == 1
    await schedules.pause("default", "h", now)
    resumed = await schedules.resume("default", "h", start - timedelta(seconds=1))
    assert resumed.next_fire_at == start  # the position went back over the retired one
    await schedules.materialize(owner.owned(), now)
    await store.fire_due(owner.owned(), now)
    async with store.pool.acquire() as conn:
        keys = await conn.fetch(
            "SELECT idempotency_key, count(*) AS n FROM tasks_with_history"
            " WHERE queue = 'hist' GROUP BY 1"
        )
        first = await conn.fetchval(
            "SELECT count(*) FROM tasks_with_history WHERE queue = 'hist' AND run_at = $1",
            start,
        )
    assert all(r["n"] == 1 for r in keys), [r for r in keys if r["n"] > 1]
    assert first == 1  # the retired occurrence, and no second task of it


async def test_an_occurrence_moving_into_the_history_during_the_pass_is_not_made_again(
    dsn: str, clock: ManualClock
) -> None:
    """The race made certain: the sweep holds its DELETE of the ran occurrence uncommitted
    while a pass whose position went back inserts it again, so the insert waits for the sweep
    and, once it commits, finds no conflict in tasks: the pass must still leave one task."""
    from chronoq.models import Lease, ScheduleSpec
    from chronoq.recurrence import Every

    store = await Store.connect(dsn, partitions=16, min_size=2, max_size=6)
    try:
        schedules = Schedules(store)
        start = clock.now()
        rule = Every(timedelta(seconds=10), start)
        await schedules.create(ScheduleSpec(name="r", queue="race", rule=rule), start)
        owner = LocalOwnership(store, "owner")
        await owner.start()
        await schedules.materialize(owner.owned(), start)
        await store.fire_due(owner.owned(), start)
        (task,) = await store.claim("default", ["race"], "w", 5, start)
        await store.complete("default", [Lease(task.id, task.attempt)], start)
        async with store.pool.acquire() as conn:  # the position lost, as in the replay above
            await conn.execute("UPDATE schedules SET next_fire_at = $1", start)
        later = start + timedelta(seconds=1)
        retention, width = timedelta(days=1), timedelta(hours=1)
        await store.keep_history(later, retention=retention, width=width)
        async with store.connection() as sweep:
            tx = sweep.transaction()
            await tx.start()
            row = await sweep.fetchrow(
                store._q("retire_finished"), list(range(16)), later, retention, 100, later
            )
            assert row["kept"] == 1
            making = asyncio.ensure_future(schedules.materialize(owner.owned(), later))
            await asyncio.sleep(0.3)
            assert not making.done()  # its insert waits on the sweep's DELETE
            await tx.commit()
        await asyncio.wait_for(making, 30)
        async with store.pool.acquire() as conn:
            n = await conn.fetchval(
                "SELECT count(*) FROM tasks_with_history WHERE queue = 'race' AND run_at = $1",
                start,
            )
        assert n == 1
    finally:
        await store.close()
