"""Unique tasks and debounce through nodes: eight submitters on three nodes of one cluster
(real PostgreSQL and etcd) agree on one task per key, and the owner's timing wheel never
fires a debounced task at the instant it held before the debounce moved it.

The submitters speak the wire directly (each its own channel to its node), so that every one
of them is a separate caller racing the others, as clients of different machines are.
"""

from __future__ import annotations

import asyncio
import random
from collections import Counter, defaultdict
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from typing import Any

import grpc
import pytest

from chronoq.api import convert
from chronoq.api.v1 import tasks_pb2, tasks_pb2_grpc
from chronoq.client import Client, NewTask, TaskContext, Worker
from chronoq.clock import ManualClock
from chronoq.models import Lease, Task, TaskSpec, TaskState
from chronoq.node import Node
from chronoq.store import Store
from chronoq.taskfilter import BulkAction, TaskFilter
from tests.integration.conftest import NodeFactory
from tests.integration.test_cluster_inproc import cluster, settled
from tests.integration.test_precise_firing import LONG_TICK, _after_first_tick, _until_ready

pytestmark = pytest.mark.timeout(120)

SUBMITTERS = 8


def spec(queue: str, payload: bytes = b"", **fields: Any) -> tasks_pb2.TaskSpec:
    """A wire spec, due now unless told (a debounce replaces it); durations as timedelta."""
    fields.setdefault("delay", timedelta(0))
    durations = {k: fields.pop(k) for k in ("delay", "unique_for", "debounce", "debounce_max")
                 if k in fields}
    pb = tasks_pb2.TaskSpec(queue=queue, payload=payload, **fields)
    for name, value in durations.items():
        getattr(pb, name).FromTimedelta(value)
    return pb


class Submitter:
    """One caller with its own channel to one node."""

    def __init__(self, address: str) -> None:
        self.channel = grpc.aio.insecure_channel(address)
        self.stub = tasks_pb2_grpc.TaskServiceStub(self.channel)

    async def one(self, pb: tasks_pb2.TaskSpec) -> tuple[Task, bool]:
        resp = await self.stub.Submit(tasks_pb2.SubmitRequest(task=pb), timeout=30)
        return convert.task_from_pb(resp.task), resp.created

    async def batch(self, pbs: list[tasks_pb2.TaskSpec]) -> list[tuple[Task, bool]]:
        resp = await self.stub.SubmitBatch(tasks_pb2.SubmitBatchRequest(tasks=pbs), timeout=30)
        return [
            (convert.task_from_pb(t), c) for t, c in zip(resp.tasks, resp.created, strict=True)
        ]

    async def ids(self, pbs: list[tasks_pb2.TaskSpec]) -> list[tuple[str, bool]]:
        resp = await self.stub.SubmitBatch(
            tasks_pb2.SubmitBatchRequest(tasks=pbs, ids_only=True), timeout=30
        )
        return list(zip(resp.ids, resp.created, strict=True))


@pytest.fixture
async def three(
    make_node: NodeFactory, etcd: Any, cluster_name: str
) -> AsyncIterator[list[Node]]:
    settings = cluster(etcd, cluster_name)
    nodes = [await make_node(cluster=settings, node_id=f"u{i}") for i in range(3)]
    await settled(nodes)
    yield nodes


@pytest.fixture
async def submitters(three: list[Node]) -> AsyncIterator[list[Submitter]]:
    out = [Submitter(three[i % len(three)].address) for i in range(SUBMITTERS)]
    try:
        yield out
    finally:
        for s in out:
            await s.channel.close()


async def _keyed_rows(store: Store, column: str) -> list[Any]:
    async with store.pool.acquire() as conn:
        return list(
            await conn.fetch(
                f"SELECT id, {column} AS key, state, run_at, debounce_until, created_at, payload"
                f" FROM tasks WHERE {column} IS NOT NULL"
            )
        )


async def test_eight_submitters_on_three_nodes_make_one_pending_task_per_unique_key(
    submitters: list[Submitter], store: Store
) -> None:
    keys = [f"u{k}" for k in range(10)]
    answers: dict[str, set[str]] = defaultdict(set)
    created: Counter[str] = Counter()

    async def submit(i: int, s: Submitter) -> None:
        rng = random.Random(i)
        for round_ in range(4):
            order = keys[:]
            rng.shuffle(order)  # batches take shared keys in different orders
            pbs = [spec("u", f"{i}-{round_}".encode(), unique_key=k, delay=timedelta(hours=1))
                   for k in order]
            if round_ % 2:
                got = [(t.id, c) for t, c in await s.batch(pbs)]
            elif i % 2:
                got = await s.ids(pbs)
            else:
                got = [(t.id, c) for t, c in [await s.one(pb) for pb in pbs]]
            for k, (task_id, c) in zip(order, got, strict=True):
                answers[k].add(task_id)
                created[k] += c

    await asyncio.gather(*(submit(i, s) for i, s in enumerate(submitters)))
    rows = await _keyed_rows(store, "unique_key")
    per_key = Counter(r["key"] for r in rows)
    assert per_key == dict.fromkeys(keys, 1)  # one task per key, no second one pending
    assert all(len(ids) == 1 for ids in answers.values()), answers
    assert created == dict.fromkeys(keys, 1)  # exactly one submit created each
    assert {str(r["id"]) for r in rows} == {next(iter(ids)) for ids in answers.values()}


async def test_eight_submitters_on_three_nodes_debounce_a_burst_into_one_run(
    three: list[Node], submitters: list[Submitter], store: Store
) -> None:
    keys = [f"d{k}" for k in range(4)]
    # A debounce far longer than the burst takes even on a loaded machine (a key whose task
    # fired mid-burst would rightly get a second task, and the test would say nothing).
    debounce, most = timedelta(seconds=4), timedelta(seconds=30)
    first_sent = datetime.now(UTC)
    runs: list[tuple[str, bytes, datetime, datetime]] = []

    async def handler(ctx: TaskContext) -> None:
        runs.append((ctx.task.id, ctx.payload, ctx.task.run_at, datetime.now(UTC)))

    async def burst(i: int, s: Submitter) -> list[tuple[Task, bool]]:
        out = []
        for n in range(5):
            for k in keys:
                out.append(
                    await s.one(
                        spec("d", f"{k}:{i}:{n}".encode(), debounce_key=k, debounce=debounce,
                             debounce_max=most)
                    )
                )
            await asyncio.sleep(0.05)
        return out

    answers = [a for got in await asyncio.gather(
        *(burst(i, s) for i, s in enumerate(submitters))) for a in got]
    burst_end = datetime.now(UTC)
    assert burst_end - first_sent < debounce  # the burst is one burst (else it may run twice)
    by_key: dict[str, set[str]] = defaultdict(set)
    for task, _created in answers:
        assert task.debounce_key is not None
        by_key[task.debounce_key].add(task.id)
    assert all(len(ids) == 1 for ids in by_key.values()), by_key
    assert sum(c for _t, c in answers) == len(keys)

    async with Client(three[0].address, timeout=10) as client:
        worker = Worker(client, {"d": handler}, concurrency=4, worker_id="debounced",
                        claim_wait=timedelta(milliseconds=300))
        run = asyncio.create_task(worker.run())
        try:
            for _ in range(300):  # bounded: 30 s
                if len(runs) >= len(keys):
                    break
                await asyncio.sleep(0.1)
            await asyncio.sleep(1.0)  # a second run of any key would show by now
        finally:
            worker.stop()
            await run
    rows = {str(r["id"]): r for r in await _keyed_rows(store, "debounce_key")}
    assert len(rows) == len(keys)  # one task per key, ever
    assert sorted(r[0] for r in runs) == sorted(rows)  # each ran once
    for task_id, payload, run_at, started in runs:
        row = rows[task_id]
        assert row["state"] == int(TaskState.SUCCEEDED)
        assert payload == row["payload"]  # the last write's payload
        assert started >= run_at  # never before its time...
        assert run_at >= first_sent + debounce  # ...which is after the burst began + debounce
        assert run_at <= row["debounce_until"] <= row["created_at"] + most + timedelta(seconds=1)
        # run_at follows the latest submit of the burst: no answer saw a later time
        assert run_at >= max(t.run_at for t, _c in answers if t.id == task_id)


async def test_a_debounce_key_cannot_be_used_from_another_namespace(
    submitters: list[Submitter], store: Store
) -> None:
    """Submitting with someone else's debounce key from another namespace postpones nothing of
    theirs: keys are per namespace."""
    mine, _ = await submitters[0].one(
        spec("d", b"mine", debounce_key="k", debounce=timedelta(seconds=30))
    )
    for s in submitters[1:]:
        theirs, _created = await s.one(
            spec("d", b"evil", debounce_key="k", debounce=timedelta(hours=1), namespace="evil")
        )
        assert theirs.namespace == "evil" and theirs.id != mine.id
    kept = await store.get(mine.id, "default")
    assert (kept.run_at, kept.payload) == (mine.run_at, b"mine")


async def test_the_wheel_fires_a_debounced_task_at_its_new_time_never_its_old(
    make_node: NodeFactory, clock: ManualClock, store: Store
) -> None:
    node = await make_node(clock=clock, tick=LONG_TICK)
    firer, precise = await _after_first_tick(node)
    ticks = firer.stats.ticks
    s = Submitter(node.address)
    try:
        first, created = await s.one(
            spec("w", b"1", debounce_key="b", debounce=timedelta(seconds=1))
        )
        assert created and first.id in precise.wheel  # entered at its first instant
        start = clock.now()
        clock.advance(timedelta(milliseconds=600))
        moved, created = await s.one(
            spec("w", b"2", debounce_key="b", debounce=timedelta(seconds=1))
        )
        assert not created and moved.run_at == start + timedelta(milliseconds=1600)
    finally:
        await s.channel.close()
    clock.advance(timedelta(milliseconds=500))  # past the old instant, before the new one
    precise.poke()
    await asyncio.sleep(0.5)  # the fire loop looked at the clock meanwhile
    assert (await store.get(first.id, "default")).state is TaskState.SCHEDULED
    clock.advance(timedelta(milliseconds=500))
    precise.poke()
    await _until_ready(store, first.id)
    fired = await store.get(first.id, "default")
    assert fired.fired_at is not None and fired.fired_at >= moved.run_at
    assert fired.payload == b"2"
    assert firer.stats.ticks == ticks, "a tick ran: the assertion would prove nothing"


@pytest.mark.parametrize(
    ("fields", "field"),
    [
        ({"unique_for": timedelta(hours=1)}, "unique_for"),
        ({"debounce": timedelta(seconds=1)}, "debounce"),
        ({"debounce_max": timedelta(seconds=1)}, "debounce_max"),
        ({"debounce_key": "k"}, "debounce"),
        ({"debounce_key": "k", "debounce": timedelta(days=2)}, "debounce"),
        (
            {"debounce_key": "k", "debounce": timedelta(seconds=10),
             "debounce_max": timedelta(seconds=5)},
            "debounce_max",
        ),
        ({"unique_key": "k" * 129}, "unique_key"),
        ({"unique_key": "k", "unique_for": timedelta(days=31)}, "unique_for"),
        ({"debounce_key": "a\x00b", "debounce": timedelta(seconds=1)}, "debounce_key"),
    ],
)
async def test_bad_unique_and_debounce_fields_are_refused_by_name(
    node: Node, fields: dict[str, Any], field: str
) -> None:
    s = Submitter(node.address)
    try:
        with pytest.raises(grpc.aio.AioRpcError) as one:
            await s.one(spec("q", **dict(fields)))
        assert one.value.code() is grpc.StatusCode.INVALID_ARGUMENT
        assert (one.value.details() or "").startswith(f"{field}:"), one.value.details()
        with pytest.raises(grpc.aio.AioRpcError) as batch:
            await s.batch([spec("q"), spec("q", **dict(fields))])
        assert batch.value.code() is grpc.StatusCode.INVALID_ARGUMENT
        assert (batch.value.details() or "").startswith(f"tasks[1].{field}:")
    finally:
        await s.channel.close()
    assert await node.store.count_by_state() == {}  # nothing of either was kept


async def test_a_requeue_beside_a_pending_task_of_its_unique_key_is_refused(
    node: Node, store: Store
) -> None:
    s = Submitter(node.address)
    try:
        first, _ = await s.one(
            spec("r", unique_key="k", retry=tasks_pb2.RetryPolicy(max_attempts=1))
        )
        now = node.clock.now()
        (claimed,) = await store.claim("default", ["r"], "w", 1, now)
        await store.fail("default", Lease(claimed.id, claimed.attempt), "x", now)
        second, created = await s.one(spec("r", unique_key="k"))
        assert created
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await s.stub.Requeue(tasks_pb2.RequeueRequest(ids=[first.id]), timeout=10)
        assert refused.value.code() is grpc.StatusCode.FAILED_PRECONDITION
        assert second.id in (refused.value.details() or "")
        assert (await store.get(first.id, "default")).state is TaskState.DEAD
    finally:
        await s.channel.close()


async def test_the_sdk_says_a_repeated_key_created_nothing(client: Client) -> None:
    """The SDK keys every submit itself and counts an answer to its own key as created by the
    call; an answer to a unique or debounce key may be another caller's task."""
    first = await client.submit("s", unique_key="k", delay=timedelta(hours=1))
    again = await client.submit("s", unique_key="k", delay=timedelta(hours=1))
    assert first.created and not again.created and again.task.id == first.task.id
    many = await client.submit_many(
        [NewTask(queue="s", debounce_key="d", debounce=timedelta(seconds=5)) for _ in range(2)]
    )
    assert [m.created for m in many] == [True, False]
    ids = await client.submit_ids(
        [NewTask(queue="s", unique_key="k", delay=timedelta(hours=1))]
    )
    assert ids == [(first.task.id, False)]


async def test_a_bulk_requeue_leaves_dead_a_task_whose_unique_key_is_held(store: Store) -> None:
    """Requeued, a dead task beside its key's pending task would make two pending: it stays
    DEAD (the call answers the ones it requeued), and of two dead tasks of one key, the first
    goes back. The call never fails on the unique index."""
    now = datetime(2030, 1, 1, 12, 0, 10, tzinfo=UTC)
    dead = []
    for _ in range(2):
        (out,) = await store.submit(
            [TaskSpec(queue="u", run_at=now, unique_key="k", max_attempts=1)], now
        )
        (claimed,) = await store.claim("default", ["u"], "w", 1, now)
        await store.fail("default", Lease(claimed.id, claimed.attempt), "x", now)
        dead.append(out.task.id)
    (pending,) = await store.submit([TaskSpec(queue="u", run_at=now, unique_key="k")], now)
    assert pending.created
    everything = TaskFilter(queue="u")
    held = await store.bulk_where(BulkAction.REQUEUE, "default", everything, now)
    assert held.outcome.count == 0
    assert {(await store.get(i, "default")).state for i in dead} == {TaskState.DEAD}
    await store.cancel(pending.task.id, "default", now)
    freed = await store.bulk_where(BulkAction.REQUEUE, "default", everything, now)
    assert freed.outcome.count == 1
    states = {i: (await store.get(i, "default")).state for i in dead}
    assert states == {min(dead): TaskState.READY, max(dead): TaskState.DEAD}
