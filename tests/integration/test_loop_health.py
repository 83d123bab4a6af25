"""Honest health on a real node: a background loop that keeps failing turns the gRPC health
service NOT_SERVING until it recovers, and a PostgreSQL outage logs one line per loop when it
starts and one when it ends, without tracebacks."""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections.abc import AsyncIterator, Callable
from datetime import timedelta
from pathlib import Path
from typing import Any

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from chronoq.api.v1 import tasks_pb2, tasks_pb2_grpc
from chronoq.config import NodeSettings
from chronoq.embedded.postgres import EmbeddedPostgres
from chronoq.node import Node
from chronoq.store import Store
from chronoq.supervision import LoopPolicy

pytestmark = pytest.mark.timeout(120)

SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING
# Quick to call a loop unhealthy, so the test does not wait the default 10 s.
QUICK = LoopPolicy(unhealthy_after=1.0, unhealthy_passes=3, max_backoff=0.5)


def settings(dsn: str) -> NodeSettings:
    return NodeSettings(
        dsn=dsn,
        port=0,
        partitions=16,
        tick=timedelta(milliseconds=50),
        reap_interval=timedelta(milliseconds=200),
        schedule_interval=timedelta(milliseconds=100),
        claim_poll=timedelta(milliseconds=100),
    )


@pytest.fixture
async def start_node() -> AsyncIterator[Callable[[str], Any]]:
    """Start nodes with the quick loop policy; all are stopped at the end."""
    nodes: list[Node] = []

    async def start(dsn: str) -> Node:
        node = Node(settings(dsn), loop_policy=QUICK)
        await node.start()
        nodes.append(node)
        return node

    try:
        yield start
    finally:
        for node in nodes:
            await asyncio.wait_for(node.stop(grace=0.5), 30)


async def status_of(address: str) -> int:
    async with grpc.aio.insecure_channel(address) as channel:
        stub = health_pb2_grpc.HealthStub(channel)  # type: ignore[no-untyped-call]
        reply = await stub.Check(health_pb2.HealthCheckRequest(service=""), timeout=5)
        return int(reply.status)


async def until_status(address: str, wanted: int, timeout: float) -> float:
    """Seconds until the node's health service answers ``wanted`` (polled, bounded)."""
    started = time.monotonic()
    while (status := await status_of(address)) != wanted:
        assert time.monotonic() - started < timeout, f"health still {status}"
        await asyncio.sleep(0.05)
    return time.monotonic() - started


def loop_healthy_gauge(node: Node, loop: str) -> float | None:
    labels = {"loop": loop, "critical": "true"}
    return node.metrics.registry.get_sample_value("chronoq_loop_healthy", labels)


def loop_records(caplog: pytest.LogCaptureFixture, loop: str, text: str) -> list[logging.LogRecord]:
    return [
        r
        for r in caplog.records
        if r.name == "chronoq.loops" and r.getMessage().startswith(f"loop {loop} {text}")
    ]


async def test_a_loop_that_keeps_failing_turns_health_not_serving_until_it_recovers(
    start_node: Callable[[str], Any], dsn: str, store: Store, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)
    node: Node = await start_node(dsn)
    assert await status_of(node.address) == SERVING
    # A real fault for one loop only: the schedule pump's table is gone (a bad migration or
    # an operator's mistake); firing, reaping and the API on tasks are untouched.
    async with store.pool.acquire() as conn:
        await conn.execute("ALTER TABLE schedules RENAME TO schedules_away")
    try:
        await until_status(node.address, NOT_SERVING, timeout=30)
        problems = node.supervisor.problems()
        assert len(problems) == 1 and problems[0].startswith("loop schedules failing for")
        assert loop_healthy_gauge(node, "schedules") == 0
        assert loop_healthy_gauge(node, "firing") == 1
    finally:
        async with store.pool.acquire() as conn:
            await conn.execute("ALTER TABLE schedules_away RENAME TO schedules")
    await until_status(node.address, SERVING, timeout=30)

    failures = node.metrics.registry.get_sample_value(
        "chronoq_loop_failures_total", {"loop": "schedules"}
    )
    assert failures is not None and failures >= QUICK.unhealthy_passes
    started = loop_records(caplog, "schedules", "failing")
    assert len(started) == 1  # an unexpected error: its traceback once, not once per pass
    assert started[0].exc_info is not None
    assert "UndefinedTableError" in started[0].getMessage()
    ended = loop_records(caplog, "schedules", "recovered")
    assert len(ended) == 1 and f"after {int(failures)} failed passes" in ended[0].getMessage()


@pytest.fixture
async def own_postgres(tmp_path: Path) -> AsyncIterator[EmbeddedPostgres]:
    """A PostgreSQL of this test's own, which it stops and starts again."""
    server = EmbeddedPostgres(tmp_path / "pg", durable=False)
    await asyncio.to_thread(server.start)
    try:
        yield server
    finally:
        await asyncio.to_thread(server.stop)


async def test_a_postgres_outage_logs_one_line_per_loop_when_it_starts_and_when_it_ends(
    own_postgres: EmbeddedPostgres,  # first: it must outlive the node
    start_node: Callable[[str], Any],
    caplog: pytest.LogCaptureFixture,
) -> None:
    dsn = await asyncio.to_thread(own_postgres.create_database, "outage")
    node: Node = await start_node(dsn)
    assert await status_of(node.address) == SERVING
    caplog.clear()
    caplog.set_level(logging.DEBUG)

    await asyncio.to_thread(own_postgres.stop)
    await until_status(node.address, NOT_SERVING, timeout=30)
    firing = next(loop for loop in node.supervisor.loops if loop.name == "firing")
    deadline = time.monotonic() + 20
    while firing.failing < 8:  # several retries per loop, all silent after the first
        assert time.monotonic() < deadline
        await asyncio.sleep(0.1)
    async with grpc.aio.insecure_channel(node.address) as channel:
        tasks = tasks_pb2_grpc.TaskServiceStub(channel)  # type: ignore[no-untyped-call]
        for _ in range(3):  # API calls during the outage: UNAVAILABLE, and no traceback
            with pytest.raises(grpc.aio.AioRpcError) as err:
                await tasks.GetTask(tasks_pb2.GetTaskRequest(id=str(uuid.uuid4())), timeout=20)
            assert err.value.code() == grpc.StatusCode.UNAVAILABLE
    failed = {loop.name: loop.failing for loop in node.supervisor.loops if loop.failing}
    assert {"firing", "reaper", "schedules"} <= set(failed)

    await asyncio.to_thread(own_postgres.start)
    await until_status(node.address, SERVING, timeout=60)
    deadline = time.monotonic() + 20
    while any(loop.failing for loop in node.supervisor.loops if loop.name in failed):
        assert time.monotonic() < deadline, "a loop did not recover"
        await asyncio.sleep(0.1)

    loud = [r for r in caplog.records if r.levelno >= logging.INFO]
    for name in failed:
        assert len(loop_records(caplog, name, "failing")) == 1, name
        (ended,) = loop_records(caplog, name, "recovered")
        assert "failed passes in" in ended.getMessage()
    tracebacks = [r for r in loud if r.exc_info is not None]
    assert tracebacks == [], [r.getMessage() for r in tracebacks]
    # Per loop one line at each end, plus the health changes and the pool's own notices.
    assert len(loud) <= 2 * len(failed) + 6, "\n".join(r.getMessage() for r in loud)
