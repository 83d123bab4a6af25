"""The worker SDK end to end through a node's gRPC server (system clock)."""

from __future__ import annotations

import asyncio
from datetime import timedelta

import pytest

from chronoq.client import Client, FatalTaskError, NewTask, TaskContext, Worker
from chronoq.models import Lease, TaskState
from chronoq.node import Node

pytestmark = pytest.mark.timeout(60)


async def until(predicate, timeout: float = 10.0) -> None:  # type: ignore[no-untyped-def]
    deadline = asyncio.get_running_loop().time() + timeout
    while not await predicate():
        assert asyncio.get_running_loop().time() < deadline, "condition not reached in time"
        await asyncio.sleep(0.05)


async def test_worker_runs_handlers_with_task_context(live: tuple[Node, Client]) -> None:
    _, client = live
    seen: dict[str, tuple[int, str, bytes]] = {}

    async def handler(ctx: TaskContext) -> None:
        seen[ctx.id] = (ctx.attempt, ctx.idempotency_key, ctx.payload)

    subs = await client.submit_many(
        [
            NewTask(
                queue="a",
                payload=b"p%d" % i,
                idempotency_key=f"key-{i}",
                delay=timedelta(milliseconds=200),
            )
            for i in range(50)
        ]
    )
    worker = Worker(client, {"a": handler}, concurrency=8)
    run = asyncio.create_task(worker.run())

    async def all_done() -> bool:
        states = [(await client.get(s.task.id)).state for s in subs]
        return all(state is TaskState.SUCCEEDED for state in states)

    await until(all_done)
    worker.stop()
    stats = await run
    assert stats.succeeded == 50 and stats.failed == 0
    for i, s in enumerate(subs):
        assert seen[s.task.id] == (1, f"key-{i}", b"p%d" % i)


async def test_failures_carry_the_exception_text_and_retry(live: tuple[Node, Client]) -> None:
    _, client = live
    calls: list[int] = []

    async def flaky(ctx: TaskContext) -> None:
        calls.append(ctx.attempt)
        if ctx.attempt < 3:
            raise RuntimeError(f"transient failure #{ctx.attempt}")

    def fatal(ctx: TaskContext) -> None:  # a plain function runs in a thread
        raise FatalTaskError("malformed payload")

    retried = await client.submit(
        "flaky",
        backoff_initial=timedelta(milliseconds=50),
        backoff_max=timedelta(milliseconds=100),
        max_attempts=5,
    )
    doomed = await client.submit("fatal", max_attempts=5)
    worker = Worker(client, {"flaky": flaky, "fatal": fatal}, concurrency=4)
    run = asyncio.create_task(worker.run())

    async def settled() -> bool:
        a = await client.get(retried.task.id)
        b = await client.get(doomed.task.id)
        return a.state is TaskState.SUCCEEDED and b.state is TaskState.DEAD

    await until(settled)
    worker.stop()
    await run
    assert calls == [1, 2, 3]
    assert (await client.get(retried.task.id)).last_error == "RuntimeError: transient failure #2"
    dead = await client.get(doomed.task.id)
    assert dead.last_error == "FatalTaskError: malformed payload" and dead.attempt == 1


async def test_concurrency_limit_is_respected(live: tuple[Node, Client]) -> None:
    _, client = live
    active = 0
    peak = 0

    async def slow(ctx: TaskContext) -> None:
        nonlocal active, peak
        active += 1
        peak = max(peak, active)
        await asyncio.sleep(0.05)
        active -= 1

    subs = await client.submit_many([NewTask(queue="s") for _ in range(40)])
    worker = Worker(client, {"s": slow}, concurrency=3)
    run = asyncio.create_task(worker.run())

    async def done() -> bool:
        page = await client.list(state=TaskState.SUCCEEDED, page_size=100)
        return len(page.tasks) == len(subs)

    await until(done)
    worker.stop()
    await run
    assert peak == 3


async def _running_count(client: Client) -> int:
    return len((await client.list(state=TaskState.RUNNING, page_size=100)).tasks)


async def test_quick_handlers_get_tasks_held_beyond_their_slots(live: tuple[Node, Client]) -> None:
    """Once its handlers prove quick, a worker holds up to ``prefetch`` leased tasks beyond
    its running ones; they start only when a slot frees, are heartbeated meanwhile, and go back
    to READY at once when it stops."""
    _, client = live
    gate = asyncio.Event()
    started: list[str] = []

    async def quick(ctx: TaskContext) -> None:
        pass

    async def blocks(ctx: TaskContext) -> None:
        started.append(ctx.id)
        await gate.wait()

    worker = Worker(
        client, {"quick": quick, "block": blocks}, concurrency=2, prefetch=3,
        stop_grace=timedelta(seconds=0.5),
    )
    run = asyncio.create_task(worker.run())
    try:
        warm = await client.submit_many([NewTask(queue="quick") for _ in range(20)])

        async def warmed() -> bool:
            return all(
                [(await client.get(s.task.id)).state is TaskState.SUCCEEDED for s in warm]
            )

        await until(warmed)
        blocked = await client.submit_many(
            [NewTask(queue="block", lease_timeout=timedelta(seconds=1.5)) for _ in range(10)]
        )

        async def holding() -> bool:
            return await _running_count(client) == 5

        await until(holding)  # 2 running, 3 held
        await asyncio.sleep(2.5)  # past the 1.5 s lease: only heartbeats keep the held ones
        assert len(started) == 2  # never more handlers than slots
        running = (await client.list(state=TaskState.RUNNING, page_size=100)).tasks
        assert len(running) == 5 and all(t.attempt == 1 for t in running)
    finally:
        worker.stop()
        stats = await asyncio.wait_for(run, 10)
    assert stats.released == 5  # the 3 held at once, the 2 stuck after the grace
    states = [(await client.get(s.task.id)) for s in blocked]
    assert all(t.state is TaskState.READY and t.worker_id is None for t in states)


async def test_slow_handlers_get_nothing_held(live: tuple[Node, Client]) -> None:
    """Handlers that take longer than the horizon: the worker takes no more tasks than it
    runs (a finished task may still be RUNNING in the store until its ack lands, so the
    worker's own count is the one to look at)."""
    _, client = live
    peak = 0

    async def slow(ctx: TaskContext) -> None:
        nonlocal peak
        peak = max(peak, worker.stats.claimed - worker.stats.succeeded)
        await asyncio.sleep(0.3)

    subs = await client.submit_many([NewTask(queue="slow") for _ in range(8)])
    worker = Worker(client, {"slow": slow}, concurrency=2, prefetch=50)
    run = asyncio.create_task(worker.run())

    async def done() -> bool:
        return all([(await client.get(s.task.id)).state is TaskState.SUCCEEDED for s in subs])

    await until(done)
    worker.stop()
    await run
    assert peak <= 2


async def test_heartbeats_keep_a_long_task_leased(live: tuple[Node, Client]) -> None:
    _, client = live
    attempts: list[int] = []

    async def long(ctx: TaskContext) -> None:
        attempts.append(ctx.attempt)
        await asyncio.sleep(3.5)  # longer than the 1.5 s lease: only heartbeats keep it

    sub = await client.submit("long", lease_timeout=timedelta(seconds=1.5))
    worker = Worker(client, {"long": long}, concurrency=2)
    run = asyncio.create_task(worker.run())

    async def done() -> bool:
        return (await client.get(sub.task.id)).state is TaskState.SUCCEEDED

    await until(done)
    worker.stop()
    await run
    assert attempts == [1]  # never redelivered


async def test_cancel_reaches_the_running_handler(live: tuple[Node, Client]) -> None:
    _, client = live
    started = asyncio.Event()
    interrupted = asyncio.Event()

    async def waits(ctx: TaskContext) -> None:
        started.set()
        try:
            await asyncio.sleep(30)
        except asyncio.CancelledError:
            interrupted.set()
            raise

    sub = await client.submit("c", lease_timeout=timedelta(seconds=1.5))
    worker = Worker(client, {"c": waits})
    run = asyncio.create_task(worker.run())
    await asyncio.wait_for(started.wait(), 5)
    await client.cancel(sub.task.id)
    await asyncio.wait_for(interrupted.wait(), 5)  # told by the next heartbeat
    worker.stop()
    stats = await run
    assert stats.lost == 1
    assert (await client.get(sub.task.id)).state is TaskState.CANCELLED


async def test_graceful_stop_releases_unfinished_tasks(live: tuple[Node, Client]) -> None:
    _, client = live
    started = asyncio.Event()

    async def stuck(ctx: TaskContext) -> None:
        started.set()
        await asyncio.sleep(60)

    async def quick(ctx: TaskContext) -> None:
        await asyncio.sleep(0.3)

    blocked = await client.submit("stuck", max_attempts=1)
    finishing = await client.submit("quick")
    worker = Worker(
        client, {"stuck": stuck, "quick": quick}, concurrency=4, stop_grace=timedelta(seconds=1)
    )
    run = asyncio.create_task(worker.run())
    await asyncio.wait_for(started.wait(), 5)
    await asyncio.sleep(0.05)
    worker.stop()
    stats = await asyncio.wait_for(run, 10)
    assert stats.released == 1 and stats.succeeded == 1
    released = await client.get(blocked.task.id)
    # Back to READY at once, and the interrupted attempt does not count against max_attempts=1.
    assert released.state is TaskState.READY and released.worker_id is None
    assert (await client.get(finishing.task.id)).state is TaskState.SUCCEEDED
    (again,) = await client.claim(["stuck"])
    assert again.attempt == 2
    failed = await client.fail(Lease(again.id, 2), "x")
    assert failed.state is TaskState.DEAD  # now its single counted attempt is used


async def test_a_queue_rate_paces_handler_starts(live: tuple[Node, Client]) -> None:
    """rates={"slow": 5}: 15 due tasks start over about 2 s, not at once; an unpaced queue of
    the same worker is not held back."""
    _, client = live
    starts: dict[str, list[float]] = {"slow": [], "fast": []}
    loop = asyncio.get_running_loop()

    async def handler(ctx: TaskContext) -> None:
        starts[ctx.queue].append(loop.time())

    await client.submit_many([NewTask(queue="slow") for _ in range(15)])
    await client.submit_many([NewTask(queue="fast") for _ in range(15)])
    worker = Worker(client, {"slow": handler, "fast": handler}, concurrency=40, rates={"slow": 5})
    run = asyncio.create_task(worker.run())
    await until(lambda: _counted(starts, 30), timeout=20)
    worker.stop()
    await run
    slow, fast = sorted(starts["slow"]), sorted(starts["fast"])
    # 5 a second: the 15th start comes at least 2 windows of 1 s after the first.
    assert slow[-1] - slow[0] >= 1.9
    assert fast[-1] - fast[0] < slow[-1] - slow[0]
    # Never more than 5 starts in any 1-second window.
    assert all(b - a >= 0.99 for a, b in zip(slow, slow[5:], strict=False))


async def _counted(starts: dict[str, list[float]], n: int) -> bool:
    return sum(len(v) for v in starts.values()) >= n


async def test_rates_must_name_served_queues_and_be_positive() -> None:
    from chronoq import errors

    client = Client("127.0.0.1:1")
    try:
        with pytest.raises(errors.ConfigError, match="without a handler: nope"):
            Worker(client, {"a": lambda ctx: None}, rates={"nope": 1})
        with pytest.raises(errors.ConfigError, match="finite number above 0"):
            Worker(client, {"a": lambda ctx: None}, rates={"a": 0})
    finally:
        await client.close()
