"""Fair sharing across namespaces on a real node: firing shares each statement among the
namespaces with due work, schedule-made tasks count against the submit quota, and a namespace
has caps on its schedules and queue limits."""

from __future__ import annotations

import asyncio
import uuid
from datetime import datetime, timedelta

import pytest

from chronoq import errors
from chronoq.buckets import bucket_of, partition_of
from chronoq.client import Client
from chronoq.clock import ManualClock
from chronoq.models import TaskSpec, TaskState
from chronoq.node import Node
from chronoq.store import Store
from tests.integration.conftest import NodeFactory

pytestmark = pytest.mark.timeout(180)

FLOOD = 50_000
_COLUMNS = (
    "id", "namespace", "queue", "partition", "bucket", "run_at", "state", "max_attempts",
    "backoff_initial_ms", "backoff_max_ms", "lease_timeout_ms", "misfire_grace_ms", "created_at",
)  # fmt: skip


async def load_flood(store: Store, namespace: str, count: int, run_at: datetime) -> None:
    """``count`` SCHEDULED tasks of ``namespace``, all due at ``run_at``, written by COPY (the
    API would take most of the test's time to accept them)."""
    rows = []
    for _ in range(count):
        task_id = uuid.uuid4()
        rows.append(
            (
                task_id, namespace, "flood", partition_of(task_id.bytes, store.partitions),
                bucket_of(run_at, store.bucket_seconds), run_at, int(TaskState.SCHEDULED), 3,
                1000, 60_000, 30_000, 60_000, run_at - timedelta(minutes=1),
            )
        )  # fmt: skip
    async with store.connection() as conn:
        await conn.copy_records_to_table("tasks", records=rows, columns=_COLUMNS)
        await conn.execute("ANALYZE tasks")


async def pending(store: Store, namespace: str) -> int:
    async with store.connection() as conn:
        n = await conn.fetchval(
            "SELECT count(*) FROM tasks WHERE state = 0 AND namespace = $1", namespace
        )
    return int(n)


async def flood_and_one(node: Node, store: Store, clock: ManualClock) -> tuple[str, datetime]:
    """A flood in namespace ``a`` and then one task of namespace ``b``, all due in 20 s."""
    due = clock.now() + timedelta(seconds=20)
    await load_flood(store, "a", FLOOD, due)
    # Last in, and due at the very same instant: first come first served would fire it last.
    client = Client(node.address, namespace="b")
    try:
        quiet = await client.submit("quiet", run_at=due)
    finally:
        await client.close()
    return quiet.task.id, due


async def test_one_tick_fires_the_other_namespace_despite_a_flood(
    make_node: NodeFactory, clock: ManualClock, store: Store
) -> None:
    # One statement of 50 rows per partition each tick: the flood takes ~60 ticks to fire.
    node = await make_node(clock=clock, fire_batch=16, fire_rounds=1)
    assert node.firer is not None
    quiet_id, due = await flood_and_one(node, store, clock)
    clock.advance(due - clock.now())
    await node.firer.tick()
    # The node's own loop may have run one tick beside ours, no more.
    assert (await store.get(quiet_id, "b")).state is TaskState.READY
    left = await pending(store, "a")
    assert left >= FLOOD - 2 * 50 * store.partitions, left
    print(f"\nnamespace b's task READY after one tick; {left} of a's {FLOOD} still due")


async def test_the_firing_loop_serves_the_other_namespace_before_the_flood_is_done(
    make_node: NodeFactory, clock: ManualClock, store: Store
) -> None:
    node = await make_node(clock=clock, fire_batch=16, fire_rounds=1)
    assert node.firer is not None
    quiet_id, due = await flood_and_one(node, store, clock)
    ticks = node.firer.stats.ticks
    clock.advance(due - clock.now())
    node.firer.poke()
    for _ in range(600):  # bounded: the flood alone takes ~60 ticks of 50 ms
        if (await store.get(quiet_id, "b")).state is TaskState.READY:
            break
        await asyncio.sleep(0.01)
    ticks = node.firer.stats.ticks - ticks
    left = await pending(store, "a")
    assert (await store.get(quiet_id, "b")).state is TaskState.READY
    # Served while most of the flood was still due: it did not wait its turn behind it.
    assert left > FLOOD // 2, left
    print(f"\nnamespace b's task READY within {ticks} ticks; {left} of a's {FLOOD} still due")


async def test_each_namespace_gets_a_share_and_the_rest_follows(
    store: Store, clock: ManualClock
) -> None:
    """Per partition, each namespace with due rows takes an equal share of the batch; the
    partitions where a share was filled are reported for another statement."""
    now = clock.now()
    await load_flood(store, "a", 2000, now)
    few = await store.submit(
        [TaskSpec(queue="few", namespace=ns, run_at=now) for ns in ("b", "c") for _ in range(8)],
        now - timedelta(seconds=1),  # submitted a second ahead: SCHEDULED, not READY
    )
    fences = await store.take_fences_local(list(range(store.partitions)), "test")
    owned = {p: f.token for p, f in fences.items()}
    # 2000 rows of a over 16 partitions (~125 each) against a batch of 20 per partition.
    first = await store.fire_due(owned, now, batch=20)
    fired_few = first.ready_by_queue[("b", "few")] + first.ready_by_queue[("c", "few")]
    assert fired_few == len(few)  # every b and c task, in the first statement
    assert first.ready_by_queue[("a", "flood")] <= 20 * store.partitions
    assert first.saturated() == set(range(store.partitions))  # a has more everywhere
    total, more = first.fired, first.saturated()
    for _ in range(100):  # bounded: ~7 statements at 20 a partition
        if not more:
            break
        result = await store.fire_due({p: owned[p] for p in more}, now, batch=20)
        total, more = total + result.fired, result.saturated()
    assert not more
    assert total == 2000 + len(few)
    assert await pending(store, "a") == 0


async def test_schedule_caps_per_namespace(make_node: NodeFactory, clock: ManualClock) -> None:
    node = await make_node(clock=clock, schedules_per_namespace=3)
    a = Client(node.address, namespace="a")
    b = Client(node.address, namespace="b")
    try:
        for i in range(3):
            await a.create_schedule(f"s{i}", "q", every=timedelta(minutes=1))
        with pytest.raises(errors.ResourceExhausted, match="namespace 'a' has 3 schedules") as e:
            await a.create_schedule("s3", "q", every=timedelta(minutes=1))
        assert e.value.code == "RESOURCE_EXHAUSTED"
        await b.create_schedule("s0", "q", every=timedelta(minutes=1))  # another namespace
        await a.pause_schedule("s0")  # paused schedules still count
        with pytest.raises(errors.ResourceExhausted):
            await a.create_schedule("s3", "q", every=timedelta(minutes=1))
        await a.delete_schedule("s0")
        await a.create_schedule("s3", "q", every=timedelta(minutes=1))
        assert len(await a.list_schedules()) == 3
    finally:
        await a.close()
        await b.close()


async def test_queue_limit_caps_per_namespace(make_node: NodeFactory, clock: ManualClock) -> None:
    node = await make_node(clock=clock, queue_limits_per_namespace=2)
    a = Client(node.address, namespace="a")
    b = Client(node.address, namespace="b")
    try:
        await a.set_queue_limit("q0", rate=5)
        await a.set_queue_limit("q1", rate=5)
        with pytest.raises(errors.ResourceExhausted, match="namespace 'a' has 2 queue limits"):
            await a.set_queue_limit("q2", rate=5)
        await a.set_queue_limit("q1", rate=50)  # changing one is always allowed
        await b.set_queue_limit("q2", rate=5)  # another namespace
        await a.set_queue_limit("q0", rate=0)  # removing frees a place
        await a.set_queue_limit("q2", rate=5)
        assert set(await a.queue_limits()) == {"q1", "q2"}
        assert (await a.queue_limits())["q1"][0] == 50
    finally:
        await a.close()
        await b.close()


async def test_schedules_count_against_the_submit_quota(
    make_node: NodeFactory, clock: ManualClock, store: Store
) -> None:
    """200 one-second schedules against a quota of 5 tasks/s: 5 are accepted, and what they
    make stays within the quota."""
    node = await make_node(clock=clock, submit_quota=5.0)
    a = Client(node.address, namespace="a")
    try:
        refused = 0
        for i in range(200):
            try:
                await a.create_schedule(f"s{i}", "q", every=timedelta(seconds=1))
            except errors.ResourceExhausted as exc:
                assert "submit quota of 5 tasks/s" in str(exc)
                refused += 1
        assert refused == 195
        # A cron schedule reserves one task a minute: nothing is left for it either.
        with pytest.raises(errors.ResourceExhausted, match="submit quota"):
            await a.create_schedule("cron", "q", cron="* * * * *")
        # Paused, a schedule reserves nothing; resumed, it needs its share back.
        await a.pause_schedule("s0")
        await a.create_schedule("cron", "q", cron="* * * * *")
        with pytest.raises(errors.ResourceExhausted, match="submit quota"):
            await a.resume_schedule("s0")
        assert (await a.get_schedule("s0")).paused
        await a.delete_schedule("cron")
        assert not (await a.resume_schedule("s0")).paused

        assert node.pump is not None
        await node.pump.pump()
        start = clock.now()
        async with store.connection() as conn:
            made = await conn.fetchval(
                "SELECT count(*) FROM tasks WHERE namespace = 'a' AND run_at >= $1"
                " AND run_at < $1 + interval '1 minute'",
                start,
            )
        assert 0 < made <= 5 * 60  # at most the quota's worth over a minute
    finally:
        await a.close()
