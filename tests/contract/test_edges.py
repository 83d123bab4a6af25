"""Contract: what every shape answers at its edges: liveness, notices, and bad ids named as
such (never a driver error)."""

from __future__ import annotations

import asyncio
import uuid
from datetime import datetime

import pytest

from chronoq.errors import InvalidArgument, TaskNotFound
from chronoq.models import Lease, TaskSpec
from chronoq.store.port import TaskStore

pytestmark = pytest.mark.timeout(60)


async def test_a_reachable_store_answers_its_probe(store_shape: TaskStore) -> None:
    assert await store_shape.probe()


async def test_announced_notices_reach_a_listener(store_shape: TaskStore) -> None:
    got: list[str] = []
    arrived = asyncio.Event()

    def on_notice(payload: str) -> None:
        got.append(payload)
        if len(got) == 2:
            arrived.set()

    listener = await store_shape.listen("contract_ch", on_notice)
    try:
        await store_shape.announce("contract_ch", ["one", "two"])
        await store_shape.announce("contract_ch", [])  # nothing to say: nothing sent
        await asyncio.wait_for(arrived.wait(), 10)
        assert got == ["one", "two"]
        assert not listener.closed
    finally:
        await listener.close()
    assert listener.closed


async def test_bad_ids_are_refused_by_name(store_shape: TaskStore, now: datetime) -> None:
    with pytest.raises(InvalidArgument, match="not a task id"):
        await store_shape.get("not-a-uuid", "default")
    with pytest.raises(InvalidArgument, match="not a task id"):
        await store_shape.cancel("42", "default", now)
    with pytest.raises(InvalidArgument, match="not a task id"):
        await store_shape.heartbeat("default", [Lease("nope", 1)], now)
    with pytest.raises(InvalidArgument, match="not a task id"):
        await store_shape.requeue("default", ["nope"], now)
    with pytest.raises(InvalidArgument):
        await store_shape.requeue("default", [], now)
    unknown = str(uuid.uuid4())
    with pytest.raises(TaskNotFound):
        await store_shape.get(unknown, "default")
    with pytest.raises(TaskNotFound):
        await store_shape.cancel(unknown, "default", now)


async def test_a_task_is_reached_by_its_id_in_its_namespace_only(
    store_shape: TaskStore, now: datetime
) -> None:
    (out,) = await store_shape.submit([TaskSpec(queue="q", run_at=now, namespace="a")], now)
    task = out.task
    with pytest.raises(TaskNotFound):
        await store_shape.cancel(task.id, "b", now)
    assert await store_shape.claim("b", ["q"], "w", 1, now) == []
    (claimed,) = await store_shape.claim("a", ["q"], "w", 1, now)
    (beat,) = await store_shape.heartbeat("b", [Lease(task.id, claimed.attempt)], now)
    assert not beat.ok
    (ack,) = await store_shape.complete("b", [Lease(task.id, claimed.attempt)], now)
    assert not ack.ok
    assert (await store_shape.get(task.id, "a")).state is claimed.state
