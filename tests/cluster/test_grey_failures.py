"""Grey failures seen from the workers: a node that is frozen (SIGSTOP: a GC pause, a frozen
VM, a black-holed network) keeps its connections open and answers nothing. Workers given
every node's address must keep starting tasks through the others, and acknowledgements
headed for the frozen (or killed) node must land through another one, not be dropped.
"""

from __future__ import annotations

import asyncio
import itertools
import signal
import time
from collections import Counter
from dataclasses import dataclass, field
from datetime import timedelta

import pytest

from chronoq.client import Client, NewTask, TaskContext, Worker
from chronoq.models import TaskState
from tests.cluster.conftest import ClusterFactory

pytestmark = pytest.mark.timeout(180)

FREEZE_SECONDS = 10.0
#: Tasks come due every 1/RATE s, so a pause in task starts longer than that is a stall.
RATE = 50
#: The bound asserted on the longest stretch without a task start (about 2 s is expected;
#: generous for a loaded 2-core machine).
GAP_BOUND = 4.0


@dataclass
class Ledger:
    """What the handlers saw: (task id, attempt, monotonic start) per execution."""

    runs: list[tuple[str, int, float]] = field(default_factory=list)

    async def handle(self, ctx: TaskContext) -> None:
        self.runs.append((ctx.id, ctx.attempt, time.monotonic()))
        await asyncio.sleep(0.02)

    def longest_gap(self, start: float, end: float) -> tuple[float, float]:
        """The longest time between task starts within [start, end], and where it began."""
        times = sorted(t for _, _, t in self.runs if start <= t <= end)
        edges = [start, *times, end]
        gap, at = max((b - a, a) for a, b in itertools.pairwise(edges))
        return gap, at - start


async def until(predicate, timeout: float) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "condition not reached in time"
        await asyncio.sleep(0.05)


async def test_workers_keep_starting_tasks_while_a_node_is_frozen(
    make_cluster: ClusterFactory,
) -> None:
    cluster = make_cluster(nodes=3)
    everyone = ",".join(cluster.addresses)
    victim = "node-1"
    ledger = Ledger()
    submitter = Client(everyone, timeout=10)
    clients = [Client(everyone, timeout=10) for _ in range(3)]
    workers = [
        Worker(c, {"grey": ledger.handle}, concurrency=8, worker_id=f"w{i}")
        for i, c in enumerate(clients)
    ]
    runs = [asyncio.create_task(w.run()) for w in workers]
    try:
        lead, span = 2.0, 22.0  # tasks due from 2 s to 24 s from now
        tasks = [
            NewTask(queue="grey", delay=timedelta(seconds=lead + i / RATE))
            for i in range(int(span * RATE))
        ]
        ids = []
        for i in range(0, len(tasks), 500):
            ids += [s.task.id for s in await submitter.submit_many(tasks[i : i + 500])]
        due_from = time.monotonic() + (lead - 0.5)  # submits took some of the lead
        await asyncio.sleep(max(0.0, due_from - time.monotonic()) + 5.0)

        cluster.signal(victim, signal.SIGSTOP)
        frozen_at = time.monotonic()
        # Submits during the freeze are answered through the others, and never twice.
        slowest, during = 0.0, []
        while time.monotonic() - frozen_at < FREEZE_SECONDS:
            started = time.monotonic()
            sub = await submitter.submit("grey", delay=timedelta(milliseconds=300))
            slowest = max(slowest, time.monotonic() - started)
            during.append(sub.task.id)
            await asyncio.sleep(0.5)
        cluster.signal(victim, signal.SIGCONT)
        thawed_at = time.monotonic()

        ids += during
        await until(lambda: {r[0] for r in ledger.runs} >= set(ids), timeout=60)
        due_until = due_from + span
    finally:
        cluster.signal(victim, signal.SIGCONT)
        for w in workers:
            w.stop()
        await asyncio.gather(*runs, return_exceptions=True)
        await submitter.close()
        for c in clients:
            await c.close()

    gap, at = ledger.longest_gap(due_from + 0.5, due_until)
    freeze_gap, _ = ledger.longest_gap(frozen_at, thawed_at)
    executions = Counter(task_id for task_id, _, _ in ledger.runs)
    twice = [t for t, n in executions.items() if n > 1]
    late_attempts = sum(1 for _, attempt, _ in ledger.runs if attempt > 1)
    print(
        f"\nlongest gap in task starts: {gap:.2f} s (at +{at:.1f} s; freeze from "
        f"+{frozen_at - due_from - 0.5:.1f} s), longest during the freeze {freeze_gap:.2f} s; "
        f"slowest submit during the freeze {slowest:.2f} s; executions {len(ledger.runs)} of "
        f"{len(ids)} tasks, {len(twice)} twice, {late_attempts} on a later attempt "
        f"(claims the frozen node answered too late); failovers "
        f"{sum(c.failovers for c in clients)} (workers), {submitter.failovers} (submits); "
        f"acks retried {sum(w.stats.ack_retries for w in workers)}, dropped "
        f"{sum(w.stats.acks_dropped for w in workers)}"
    )
    assert gap < GAP_BOUND, f"no task started for {gap:.2f} s"
    assert set(executions) == set(ids)  # every task ran: the ones submitted during it too
    assert len(during) >= 5 and slowest < GAP_BOUND
    # A task runs twice only if its ack was lost: every ack is retried through the others.
    assert twice == []
    assert sum(w.stats.acks_dropped for w in workers) == 0


@pytest.mark.parametrize("fault", ["freeze", "kill"])
async def test_acks_headed_for_a_lost_node_land_through_another(
    make_cluster: ClusterFactory, fault: str
) -> None:
    """Acks go one per call, round robin: some are sent to the node just frozen (its health
    stream has not noticed yet). ``kill``: once they hang there, the node is SIGKILLed."""
    cluster = make_cluster(nodes=3)
    victim = "node-1"
    survivor = Client(cluster.nodes["node-0"].address, timeout=5)
    client = Client(",".join(cluster.addresses), timeout=10)
    gate = asyncio.Event()
    ran: list[str] = []

    async def handler(ctx: TaskContext) -> None:
        ran.append(ctx.id)
        await gate.wait()

    count = 6
    worker = Worker(
        client,
        {"acks": handler},
        concurrency=count,
        ack_batch=1,
        ack_delay=timedelta(0),
        worker_id="acker",
    )
    try:
        subs = await survivor.submit_many([NewTask(queue="acks") for _ in range(count)])
        ids = {s.task.id for s in subs}
        run = asyncio.create_task(worker.run())
        await until(lambda: len(ran) == count, timeout=20)
        worker.stop()  # claims no more: from now on the worker only acknowledges
        cluster.signal(victim, signal.SIGSTOP)
        gate.set()
        released = time.monotonic()
        if fault == "kill":
            await asyncio.sleep(0.3)
            cluster.kill(victim)
        stats = await asyncio.wait_for(run, 20)
        settled = time.monotonic() - released
        tasks = [await survivor.get(task_id) for task_id in ids]
        if fault == "freeze":
            assert cluster.nodes[victim].stopped  # still frozen: the acks went elsewhere
    finally:
        cluster.signal(victim, signal.SIGCONT)
        gate.set()
        await client.close()
        await survivor.close()
    print(
        f"\n{fault}: acks settled {settled:.2f} s after the handlers finished; "
        f"failovers {client.failovers}, ack batches retried {stats.ack_retries}"
    )
    assert client.failovers >= 1  # at least one ack was sent to the lost node first
    assert stats.acks_dropped == 0
    assert all(t.state is TaskState.SUCCEEDED and t.attempt == 1 for t in tasks)
    assert sorted(ran) == sorted(ids)  # each handler ran once: nothing will run again
