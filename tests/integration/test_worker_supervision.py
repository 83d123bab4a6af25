"""The worker SDK's background loops survive an unexpected error (a bug, not an outage).

Each test puts a fault into a pure function the loop calls on its way to the node (the code
that builds the request), against a real node and PostgreSQL, and checks that the loop goes on:
the lease is renewed, the ack lands, the stream opens again, and no task runs twice.
"""

from __future__ import annotations

import asyncio
import logging
import sys
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import pytest

from chronoq.api import convert
from chronoq.client import Client, TaskContext, Worker
from chronoq.models import TaskState
from chronoq.node import Node

pytestmark = pytest.mark.timeout(60)


class Fault:
    """Wraps a pure function: its first ``times`` calls made from a function named ``caller``
    raise ``error``; every other call goes through."""

    def __init__(self, real: Callable[..., Any], caller: str, times: int) -> None:
        self.real = real
        self.caller = caller
        self.times = times
        self.raised = 0
        self.passed = 0  # calls from ``caller`` that went through

    def _from_caller(self) -> bool:
        frame = sys._getframe(2)
        for _ in range(3):  # the caller, or the comprehension inside it
            if frame is None:
                return False
            if frame.f_code.co_name == self.caller:
                return True
            frame = frame.f_back
        return False

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if self._from_caller():
            if self.raised < self.times:
                self.raised += 1
                raise ValueError(f"injected fault #{self.raised} in {self.caller}")
            self.passed += 1
        return self.real(*args, **kwargs)


async def until(predicate: Callable[[], Any], timeout: float = 15.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout
    while not await predicate():
        assert asyncio.get_running_loop().time() < deadline, "condition not reached in time"
        await asyncio.sleep(0.05)


async def test_heartbeats_go_on_after_an_unexpected_error(
    live: tuple[Node, Client], monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Building the heartbeat request fails twice: the loop logs the traceback, retries after
    a backoff, renews the lease before it expires, and the task runs once."""
    _, client = live
    fault = Fault(convert.lease_to_pb, "heartbeat", times=2)
    monkeypatch.setattr(convert, "lease_to_pb", fault)
    attempts: list[int] = []
    leased: list[Any] = []

    async def long(ctx: TaskContext) -> None:
        attempts.append(ctx.attempt)
        leased.append((await client.get(ctx.id)).lease_until)
        await asyncio.sleep(7)  # over twice the 3 s lease: only heartbeats keep it

    sub = await client.submit("long", lease_timeout=timedelta(seconds=3))
    worker = Worker(client, {"long": long}, concurrency=2)
    run = asyncio.create_task(worker.run())

    async def renewed() -> bool:
        """A heartbeat built after the faults has been answered: the lease is extended past
        the claim's (the request going out is not enough: its answer may still be coming)."""
        if fault.passed < 1 or not leased:
            return False
        task = await client.get(sub.task.id)
        return task.lease_until is not None and task.lease_until > leased[0]

    await until(renewed)
    assert fault.raised == 2
    assert (await client.get(sub.task.id)).state is TaskState.RUNNING

    async def done() -> bool:
        return (await client.get(sub.task.id)).state is TaskState.SUCCEEDED

    await until(done)
    worker.stop()
    stats = await run
    assert attempts == [1]  # never redelivered
    assert stats.lost == 0
    assert fault.passed >= 3  # heartbeats went on after the faults
    failing = [r for r in caplog.records if "injected fault #1" in r.getMessage()]
    assert failing and failing[0].levelno == logging.ERROR and failing[0].exc_info is not None


async def test_an_ack_that_fails_unexpectedly_is_sent_again(
    live: tuple[Node, Client], monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Building the ack (a stream's complete) fails once: the batch goes again and lands; the
    task is not left to run a second time after its lease."""
    _, client = live
    fault = Fault(convert.lease_to_pb, "complete", times=1)
    monkeypatch.setattr(convert, "lease_to_pb", fault)
    attempts: list[int] = []

    async def quick(ctx: TaskContext) -> None:
        attempts.append(ctx.attempt)

    sub = await client.submit("q", lease_timeout=timedelta(seconds=2))
    worker = Worker(client, {"q": quick})
    run = asyncio.create_task(worker.run())

    async def done() -> bool:
        return (await client.get(sub.task.id)).state is TaskState.SUCCEEDED

    await until(done, timeout=1.5)  # within the lease: acknowledged, not expired and re-run
    await asyncio.sleep(2.5)  # past the lease: nothing runs it again
    worker.stop()
    stats = await run
    assert fault.raised == 1 and fault.passed >= 1
    assert attempts == [1] and stats.succeeded == 1 and stats.acks_dropped == 0
    assert stats.ack_retries == 1
    assert any(r.exc_info and "injected fault #1" in r.getMessage() for r in caplog.records)


async def test_a_push_the_reader_cannot_take_restarts_the_stream(
    live: tuple[Node, Client], monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Turning a pushed task into a model fails once: the stream's reader logs it with its
    traceback and ends the stream with a reason; the worker opens another and goes on (the
    task of the failed push runs after its lease, once)."""
    _, client = live
    fault = Fault(convert.task_from_pb, "_read", times=1)
    monkeypatch.setattr(convert, "task_from_pb", fault)
    attempts: dict[str, list[int]] = {}

    async def record(ctx: TaskContext) -> None:
        attempts.setdefault(ctx.id, []).append(ctx.attempt)

    first = await client.submit("r", lease_timeout=timedelta(seconds=1))
    worker = Worker(client, {"r": record}, concurrency=1, prefetch=0)
    run = asyncio.create_task(worker.run())

    async def faulted() -> bool:
        return fault.raised == 1

    await until(faulted)
    later = await client.submit("r")

    async def both_done() -> bool:
        states = [(await client.get(s.task.id)).state for s in (first, later)]
        return all(s is TaskState.SUCCEEDED for s in states)

    await until(both_done)
    worker.stop()
    await run
    assert attempts[later.task.id] == [1]
    assert attempts[first.task.id] == [2]  # its push was lost in this process: run once
    assert any(r.exc_info and "injected fault #1" in r.getMessage() for r in caplog.records)
