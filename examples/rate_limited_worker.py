"""A worker that paces a queue whose downstream has a limit: at most 10 starts a second.

    python examples/rate_limited_worker.py 127.0.0.1:7070

Submits 30 tasks due now and runs them with 8 slots but at most 10 handler starts a second in
this process (a claimed task waits for its turn, its lease heartbeated). Pacing waits and never
refuses; a cluster-wide limit is ``Client.set_queue_limit``, which the node enforces.
"""

from __future__ import annotations

import asyncio
import sys
import time
from datetime import timedelta

from chronoq.client import Client, NewTask, TaskContext, Worker

QUEUE = "sms"
TASKS = 30
RATE = 10.0  # handler starts per second


async def main(address: str) -> None:
    starts: list[float] = []
    done = asyncio.Event()

    async def send_sms(ctx: TaskContext) -> None:
        starts.append(time.monotonic())
        if len(starts) == TASKS:
            done.set()

    async with Client(address) as client:
        await client.submit_many([NewTask(queue=QUEUE, payload=b"hi") for _ in range(TASKS)])
        worker = Worker(
            client,
            {QUEUE: send_sms},
            concurrency=8,
            rates={QUEUE: RATE},
            claim_wait=timedelta(milliseconds=200),
        )
        running = asyncio.create_task(worker.run())
        try:
            await asyncio.wait_for(done.wait(), 60)
        finally:
            worker.stop()
            await running
    span = starts[-1] - starts[0]
    print(f"{TASKS} starts over {span:.2f} s (at most {RATE:g} in any second)")


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1] if len(sys.argv) > 1 else "127.0.0.1:7070"))
