"""A slot freed on a queue limited per concurrency key wakes the claims waiting on it at once,
through the node's effects, not at the next store re-check."""

from __future__ import annotations

import asyncio
import time
from datetime import timedelta

import pytest

from chronoq.client import Client
from chronoq.models import Lease
from tests.integration.conftest import NodeFactory

pytestmark = pytest.mark.timeout(60)

#: The node's store re-check for waiting claims runs this rarely here: a claim that returns
#: well within it was woken by the freed slot.
PROBE = timedelta(seconds=20)


@pytest.mark.parametrize("free", ["complete", "fail", "cancel"])
async def test_a_freed_slot_wakes_a_waiting_claim_of_the_key(
    make_node: NodeFactory, free: str
) -> None:
    node = await make_node(claim_poll=PROBE)
    client = Client(node.address, timeout=10)
    try:
        await client.set_queue("k", max_running_per_key=1)
        for i in range(2):
            await client.submit("k", concurrency_key="acct", payload=str(i).encode())
        # The node's gate learns the queue is keyed (within its refresh); one task runs.
        first: list = []
        deadline = time.monotonic() + 10
        while not first and time.monotonic() < deadline:
            first = await client.claim(["k"], worker_id="a", max_tasks=5)
            await asyncio.sleep(0.2)
        assert len(first) == 1
        assert await client.claim(["k"], worker_id="b", max_tasks=5) == []  # the key is full
        waiting = asyncio.create_task(
            client.claim(["k"], worker_id="b", max_tasks=5, wait=timedelta(seconds=15))
        )
        await asyncio.sleep(0.5)  # the claim waits on the node
        assert not waiting.done()
        started = time.monotonic()
        task = first[0]
        if free == "complete":
            await client.complete(Lease(task.id, task.attempt))
        elif free == "fail":
            await client.fail(Lease(task.id, task.attempt), "boom", fatal=True)
        else:
            await client.cancel(task.id)
        second = await asyncio.wait_for(waiting, 15)
        assert len(second) == 1 and second[0].id != task.id
        assert time.monotonic() - started < PROBE.total_seconds() / 4
    finally:
        await client.close()
