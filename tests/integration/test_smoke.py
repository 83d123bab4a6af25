from __future__ import annotations

import asyncio
from datetime import timedelta

from chronoq.client import Client, TaskContext, Worker
from chronoq.clock import ManualClock
from chronoq.models import TaskState
from chronoq.node import Node


async def test_submit_fire_work(node: Node, client: Client, clock: ManualClock) -> None:
    sub = await client.submit("q", delay=timedelta(seconds=5), payload=b"x")
    assert sub.created and sub.task.state is TaskState.SCHEDULED
    seen: list[TaskContext] = []

    async def handler(ctx: TaskContext) -> None:
        seen.append(ctx)

    worker = Worker(client, {"q": handler}, concurrency=2)
    run = asyncio.create_task(worker.run())
    await asyncio.sleep(0.3)
    assert not seen
    clock.advance(timedelta(seconds=6))
    for _ in range(50):
        if seen:
            break
        await asyncio.sleep(0.05)
    worker.stop()
    await run
    assert seen and seen[0].id == sub.task.id and seen[0].attempt == 1
    assert (await client.get(sub.task.id)).state is TaskState.SUCCEEDED
