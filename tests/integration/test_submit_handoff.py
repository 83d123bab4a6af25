"""The submit's hand-off: a task submitted due at once is leased by its own insert to a worker
stream waiting on this node and pushed there, with no claim after; a stream that is gone
before the push gets nothing and the task goes back READY with its attempt unspent; a queue
with a dispatch limit and a queue with waiting READY tasks are never handed off (real node,
real PostgreSQL)."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from chronoq.bench import pgstats
from chronoq.client import Client, NewTask
from chronoq.clock import ManualClock
from chronoq.embedded.postgres import EmbeddedPostgres
from chronoq.models import TaskSpec, TaskState
from chronoq.node import Node
from chronoq.store import Store
from tests.integration.conftest import NodeFactory
from tests.integration.test_precise_firing import _eventually
from tests.integration.test_work_stream import RawStream

pytestmark = pytest.mark.timeout(90)


async def _waiting_stream(node: Node, queue: str, credits: int) -> RawStream:
    """A stream whose first claim found nothing and that now waits (its queue is quiet)."""
    stream = RawStream(node)
    await stream.open([queue], credits=credits, worker_id="w-submit")
    await _eventually(lambda: node.notifier.quiet("default", [queue]))
    return stream


async def test_a_due_submit_is_leased_by_its_insert_and_pushed_without_a_claim(
    make_node: NodeFactory, store: Store
) -> None:
    node = await make_node()  # the system clock: a claim's lease would start after the insert
    assert node.submit_handoff is not None
    stream = await _waiting_stream(node, "now", credits=3)
    try:
        async with Client(node.address) as client:
            sub = await client.submit("now", run_at=datetime.now(UTC))
        (pushed,) = await stream.tasks(1)
    finally:
        await stream.close()
    # The submit's own answer is the row its insert wrote: already RUNNING, leased to the
    # stream's worker. A claim could only have leased it after that answer was written.
    assert sub.created and sub.task.state is TaskState.RUNNING
    assert sub.task.attempt == 1 and sub.task.worker_id == "w-submit"
    assert pushed.id == sub.task.id and pushed.attempt == 1 and pushed.worker_id == "w-submit"
    task = await store.get(sub.task.id, "default")
    assert task.state is TaskState.RUNNING and task.attempt == 1 and task.retry_base == 0
    assert task.created_at is not None and task.lease_until is not None
    # Leased at the insert's own instant, as a claim leases (now + the lease timeout).
    assert task.lease_until - task.lease_timeout == task.created_at
    assert node.submit_handoff.handed_off == 1


@pytest.fixture(scope="module")
def counted_dsn(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A database on a server of its own that counts every statement (pg_stat_statements),
    stopped after the module's nodes."""
    server = EmbeddedPostgres(
        Path(tmp_path_factory.mktemp("counted")) / "pg",
        durable=False,
        settings=pgstats.DIAGNOSTIC_SETTINGS,
    )
    server.start(timeout=120)
    try:
        yield server.create_database("counted")
    finally:
        server.stop()


async def _rows_of(dsn: str, name: str) -> int:
    """Rows the named statement of chronoq's has written so far, as the server counts them."""
    snap = await pgstats.snapshot(dsn)
    return sum(s.rows for s in snap.statements.values() if f"/* chronoq {name} */" in s.query)


async def test_the_server_counts_no_claim_for_a_handed_off_submit(
    make_node: NodeFactory, counted_dsn: str
) -> None:
    node = await make_node(dsn=counted_dsn)
    stream = await _waiting_stream(node, "counted", credits=3)
    try:
        claimed = await _rows_of(counted_dsn, "claim")
        async with Client(node.address) as client:
            subs = [await client.submit("counted") for _ in range(3)]
            pushed = await stream.tasks(3)
            # What a claim leased (none: each insert leased its own task) and what the
            # leasing insert wrote, by the server's own count.
            claimed_after = await _rows_of(counted_dsn, "claim")
            leased = await _rows_of(counted_dsn, "insert_task_leased")
            # The count sees claims: a READY task (a batch is never handed off) is claimed.
            (ready,) = await client.submit_many([NewTask(queue="counted")])
            await stream.send(credits=1)
            (by_claim,) = await stream.tasks(1)
    finally:
        await stream.close()
    assert {t.id for t in pushed} == {s.task.id for s in subs}
    assert all(t.attempt == 1 for t in pushed)
    assert claimed_after == claimed and leased == 3
    assert by_claim.id == ready.task.id
    assert await _rows_of(counted_dsn, "claim") == claimed + 1


async def test_a_stream_gone_before_the_push_gets_the_task_back_ready_unspent(
    make_node: NodeFactory, clock: ManualClock, store: Store
) -> None:
    node = await make_node(clock=clock)
    handoff = node.submit_handoff
    assert handoff is not None
    stream = await _waiting_stream(node, "gone", credits=2)
    now = clock.now()
    spec = TaskSpec(queue="gone", run_at=now)
    single = handoff.stream_for(spec, now)  # the stream's credit is held for this submit
    assert single is not None and single.worker_id == "w-submit"
    await stream.close()  # the worker leaves before the insert commits
    await _eventually(lambda: not node.handoff.serves(("default", "gone")))  # its session ends
    outcome = await handoff.submit_to(single, spec, now)
    assert outcome.created and outcome.task.state is TaskState.RUNNING  # leased, not pushed
    task_id = outcome.task.id
    for _ in range(100):  # the give-back runs beside the submit's answer
        if (await store.get(task_id, "default")).state is TaskState.READY:
            break
        await asyncio.sleep(0.05)
    task = await store.get(task_id, "default")
    assert task.state is TaskState.READY and task.worker_id is None and task.lease_until is None
    assert handoff.handed_off == 1  # leased by its insert, then given back by the stream
    (again,) = await store.claim("default", ["gone"], "w2", 1, now)
    assert again.attempt - again.retry_base == 1  # the hand-off's attempt was not used


async def test_a_queue_with_a_dispatch_limit_is_never_handed_off_and_its_limit_holds(
    make_node: NodeFactory, clock: ManualClock, store: Store
) -> None:
    node = await make_node(clock=clock)
    assert node.submit_handoff is not None
    async with Client(node.address) as client:
        await client.set_queue_limit("lim", rate=0.001, burst=1)
        stream = await _waiting_stream(node, "lim", credits=5)  # its claim read the limit
        try:
            subs = [await client.submit("lim") for _ in range(3)]
            (claimed,) = await stream.tasks(1)  # by a claim, which took the one token
            await asyncio.sleep(0.5)
            assert stream.responses.empty()  # no token left: nothing more, by any path
        finally:
            await stream.close()
    assert all(s.task.state is TaskState.READY for s in subs)  # no insert leased one
    assert claimed.attempt == 1
    states = sorted([(await store.get(s.task.id, "default")).state for s in subs])
    assert states == [TaskState.READY, TaskState.READY, TaskState.RUNNING]
    assert node.submit_handoff.handed_off == 0


async def test_a_submit_never_overtakes_ready_tasks_a_claim_would_take_first(
    make_node: NodeFactory, clock: ManualClock, store: Store
) -> None:
    # No store re-check within the test: the node does not learn of the READY tasks below.
    node = await make_node(clock=clock, claim_poll=timedelta(seconds=30))
    assert node.submit_handoff is not None
    stream = await _waiting_stream(node, "p", credits=5)
    now = clock.now()
    # READY behind this node's back, as another node's submits whose notice has not come: the
    # queue looks quiet here, so the hand-off is offered; its insert must still not lease.
    urgent = await store.submit([TaskSpec(queue="p", run_at=now, priority=9)] * 2, now)
    try:
        async with Client(node.address) as client:
            low = await client.submit("p", priority=0)
            # Its notice wakes the stream, whose claim takes the queue in claim order.
            pushed = await stream.tasks(3)
    finally:
        await stream.close()
    assert low.task.state is TaskState.READY and low.task.attempt == 0
    assert {t.id for t in pushed[:2]} == {o.task.id for o in urgent}
    assert pushed[2].id == low.task.id
    assert node.submit_handoff.handed_off == 0
