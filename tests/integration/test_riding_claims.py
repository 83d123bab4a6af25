"""Claims that ride on acks (``CompleteBatch`` with a claim): each task once per attempt,
leases and fencing as with ``Claim``, and the old calls unchanged (real node, real store)."""

from __future__ import annotations

import asyncio
from collections import Counter
from datetime import timedelta
from typing import Any

import grpc
import pytest

from chronoq import errors
from chronoq.api.v1 import worker_pb2, worker_pb2_grpc
from chronoq.client import Client, NewTask, TaskContext, Worker, WorkerStats
from chronoq.clock import ManualClock
from chronoq.models import Lease, TaskState
from chronoq.node import Node

pytestmark = pytest.mark.timeout(60)


def leases(tasks: list) -> list[Lease]:  # type: ignore[type-arg]
    return [Lease(t.id, t.attempt) for t in tasks]


async def test_a_claim_rides_on_acks_until_the_queue_is_empty(client: Client) -> None:
    await client.submit_many([NewTask(queue="ride") for _ in range(6)])
    first = await client.claim(["ride"], worker_id="w", max_tasks=2)
    assert len(first) == 2

    acks, second = await client.complete_and_claim(
        leases(first), ["ride"], worker_id="w", max_tasks=3
    )
    assert [(a.task_id, a.ok) for a in acks] == [(t.id, True) for t in first]
    assert len(second) == 3
    assert all(t.state is TaskState.RUNNING and t.attempt == 1 for t in second)
    assert all(t.worker_id == "w" for t in second)

    acks, third = await client.complete_and_claim(
        leases(second), ["ride"], worker_id="w", max_tasks=10
    )
    assert all(a.ok for a in acks) and len(third) == 1  # never more than are ready
    acks, none = await client.complete_and_claim(leases(third), ["ride"], max_tasks=10)
    assert all(a.ok for a in acks) and none == []

    claimed = [t.id for t in first + second + third]
    assert len(set(claimed)) == 6  # each task handed out once
    for task_id in claimed:
        assert (await client.get(task_id)).state is TaskState.SUCCEEDED


async def test_a_riding_claim_respects_leases_and_fencing(
    node: Node, client: Client, clock: ManualClock
) -> None:
    await client.submit_many(
        [
            NewTask(
                queue="fence",
                lease_timeout=timedelta(seconds=2),
                backoff_initial=timedelta(0),
                backoff_max=timedelta(0),
            )
            for _ in range(2)
        ]
    )
    (seed,) = await client.claim(["fence"], worker_id="a")
    _, (held,) = await client.complete_and_claim(leases([seed]), ["fence"], worker_id="a")
    assert held.attempt == 1

    clock.advance(timedelta(seconds=3))  # the worker that got it by riding claim went quiet
    assert node.reaper is not None
    assert [t.id for t in await node.reaper.reap()] == [held.id]

    # The stale ack is refused; the claim on the same call takes the task at its next attempt.
    (stale,), (again,) = await client.complete_and_claim(
        leases([held]), ["fence"], worker_id="b"
    )
    assert not stale.ok and stale.task_id == held.id
    assert again.id == held.id and again.attempt == 2
    with pytest.raises(errors.PreconditionFailed, match="stale"):
        await client.complete(Lease(held.id, 1))
    (ok,), _ = await client.complete_and_claim(leases([again]), ["fence"])
    assert ok.ok
    assert (await client.get(held.id)).state is TaskState.SUCCEEDED


async def test_the_old_ack_call_claims_nothing(node: Node, client: Client) -> None:
    await client.submit_many([NewTask(queue="old") for _ in range(3)])
    (task,) = await client.claim(["old"])
    async with grpc.aio.insecure_channel(node.address) as channel:
        stub = worker_pb2_grpc.WorkerServiceStub(channel)
        reply = await stub.CompleteBatch(
            worker_pb2.CompleteBatchRequest(
                leases=[worker_pb2.Lease(task_id=task.id, lease_token=task.attempt)]
            )
        )
    assert [r.ok for r in reply.results] == [True] and len(reply.claimed) == 0
    ready = await client.list(queue="old", state=TaskState.READY)
    assert len(ready.tasks) == 2  # nothing was claimed behind the caller's back


async def test_a_bad_riding_claim_is_refused_before_the_acks_are_written(
    node: Node, client: Client
) -> None:
    await client.submit(queue="bad")
    (task,) = await client.claim(["bad"])
    async with grpc.aio.insecure_channel(node.address) as channel:
        stub = worker_pb2_grpc.WorkerServiceStub(channel)
        for claim, field in [
            (worker_pb2.ClaimRequest(queues=[]), "claim.queues"),
            (worker_pb2.ClaimRequest(queues=["bad"], max_tasks=100_000), "claim.max_tasks"),
            (worker_pb2.ClaimRequest(namespace="other", queues=["bad"]), "claim.namespace"),
        ]:
            with pytest.raises(grpc.aio.AioRpcError) as info:
                await stub.CompleteBatch(
                    worker_pb2.CompleteBatchRequest(
                        leases=[worker_pb2.Lease(task_id=task.id, lease_token=task.attempt)],
                        claim=claim,
                    )
                )
            assert info.value.code() is grpc.StatusCode.INVALID_ARGUMENT
            assert field in (info.value.details() or "")
    assert (await client.get(task.id)).state is TaskState.RUNNING


async def run_flow(client: Client, count: int, **worker_options: Any) -> WorkerStats:
    """Run ``count`` ready tasks through one worker (concurrency 16); asserts what any
    protocol must give: each task once, at attempt 1, never more at once than the
    concurrency, every one SUCCEEDED and nothing dropped."""
    await client.submit_many([NewTask(queue="flow") for _ in range(count)])
    runs: Counter[tuple[str, int]] = Counter()
    in_flight = peak = 0

    async def handler(ctx: TaskContext) -> None:
        nonlocal in_flight, peak
        runs[(ctx.id, ctx.attempt)] += 1
        in_flight += 1
        peak = max(peak, in_flight)
        await asyncio.sleep(0.001)
        in_flight -= 1

    worker = Worker(client, {"flow": handler}, concurrency=16, **worker_options)
    run = asyncio.create_task(worker.run())
    try:
        deadline = asyncio.get_running_loop().time() + 30
        while worker.stats.succeeded < count:
            assert asyncio.get_running_loop().time() < deadline, worker.stats
            await asyncio.sleep(0.05)
    finally:
        worker.stop()
        stats = await run
    assert len(runs) == count and set(runs.values()) == {1}  # once each, at attempt 1
    assert stats.claimed == count and stats.acks_dropped == 0 and stats.released == 0
    assert peak <= 16  # never more than the concurrency
    done = await client.list(queue="flow", state=TaskState.SUCCEEDED, page_size=1000)
    assert len(done.tasks) == count
    return stats


async def test_a_worker_runs_each_task_once_with_claims_riding_on_acks(client: Client) -> None:
    stats = await run_flow(client, 400, claim_wait=timedelta(seconds=1), stream=False)
    assert stats.claimed_on_ack > 0  # the riding path carried part of the flow
