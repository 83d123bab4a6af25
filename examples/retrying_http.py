"""A task that calls an HTTP endpoint, retried with backoff, and a dead-letter handler.

    python examples/retrying_http.py 127.0.0.1:7070 http://127.0.0.1:8000/hook work
    python examples/retrying_http.py 127.0.0.1:7070 http://127.0.0.1:8000/hook requeue-dead

``work`` submits one call and runs a worker until the call has succeeded or is DEAD (the
endpoint failed on every one of its attempts). ``requeue-dead`` is the dead-letter handler:
it lists the queue's DEAD tasks with their last error, requeues them (a fresh attempt budget)
and runs the worker until they are done. Every call carries the task's idempotency key, so
the endpoint can drop a call it already served: delivery is at least once.
"""

from __future__ import annotations

import asyncio
import sys
import urllib.error
import urllib.request
from datetime import timedelta

from chronoq.client import Client, FatalTaskError, TaskContext, TaskRegistry
from chronoq.models import TaskState

QUEUE = "webhooks"
HTTP_TIMEOUT_S = 5.0  # every call has a deadline
FINISHED = {TaskState.SUCCEEDED, TaskState.DEAD, TaskState.CANCELLED}

tasks = TaskRegistry()


@tasks.task(
    queue=QUEUE,
    max_attempts=3,
    backoff_initial=timedelta(milliseconds=200),
    backoff_max=timedelta(seconds=2),
)
def call_webhook(ctx: TaskContext) -> None:
    request = urllib.request.Request(
        ctx.data["url"],
        data=ctx.payload,
        headers={"Idempotency-Key": ctx.idempotency_key, "Content-Type": "application/json"},
        method="POST",
    )
    try:
        with urllib.request.urlopen(request, timeout=HTTP_TIMEOUT_S) as answer:
            print(f"attempt {ctx.attempt}: HTTP {answer.status}", flush=True)
    except urllib.error.HTTPError as e:
        if 400 <= e.code < 500 and e.code != 429:
            raise FatalTaskError(f"HTTP {e.code}: the request itself is wrong") from e
        print(f"attempt {ctx.attempt}: HTTP {e.code}, will retry", flush=True)
        raise  # any other exception: retried with backoff, DEAD after max_attempts


async def run_until_finished(client: Client, ids: list[str], limit_s: float = 60.0) -> None:
    worker = tasks.worker(client, claim_wait=timedelta(milliseconds=200))
    running = asyncio.create_task(worker.run())
    try:
        async with asyncio.timeout(limit_s):
            while True:
                states = [(await client.get(i)).state for i in ids]
                if all(s in FINISHED for s in states):
                    break
                await asyncio.sleep(0.1)
    finally:
        worker.stop()
        await running
    for i in ids:
        task = await client.get(i)
        print(f"task {i}: {task.state.name} after {task.attempt} attempts", flush=True)


async def work(client: Client, url: str) -> None:
    submitted = await call_webhook.aschedule_in(timedelta(0), payload={"url": url}, client=client)
    await run_until_finished(client, [submitted.task.id])


async def requeue_dead(client: Client) -> None:
    dead = (await client.list(queue=QUEUE, dead=True)).tasks
    for task in dead:
        print(f"dead letter {task.id}: {task.last_error}", flush=True)
    if dead:
        await client.requeue([t.id for t in dead])
        await run_until_finished(client, [t.id for t in dead])


async def main(address: str, url: str, command: str) -> None:
    async with Client(address) as client:
        if command == "work":
            await work(client, url)
        elif command == "requeue-dead":
            await requeue_dead(client)
        else:
            raise SystemExit(f"unknown command {command!r}: work or requeue-dead")


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], sys.argv[2], sys.argv[3]))
