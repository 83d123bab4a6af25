"""Contract: the effects a write answers with are what it did, through the port only."""

from __future__ import annotations

from collections import Counter
from datetime import datetime, timedelta

import pytest

from chronoq.effects import of_submits
from chronoq.models import TaskSpec, TaskState
from chronoq.store.port import TaskStore

pytestmark = pytest.mark.timeout(60)


async def test_an_ids_only_submit_names_what_it_made_ready_and_scheduled(
    store_shape: TaskStore, now: datetime
) -> None:
    later = now + timedelta(seconds=2)
    specs = [
        TaskSpec(queue="q", run_at=now, namespace="fx", idempotency_key="k"),
        TaskSpec(queue="q", run_at=later, namespace="fx"),
        TaskSpec(queue="r", run_at=now, namespace="fx"),
    ]
    answer = await store_shape.submit_ids(specs, now)
    assert [created for _i, created in answer] == [True, True, True]
    assert answer.effects.ready == Counter({("fx", "q"): 1, ("fx", "r"): 1})
    assert answer.effects.scheduled == ((answer[1][0], later, ("fx", "q")),)
    # What it says matches the stored states.
    states = [(await store_shape.get(i, "fx")).state for i, _c in answer]
    assert states == [TaskState.READY, TaskState.SCHEDULED, TaskState.READY]
    # A repeated key made nothing: nothing to wake.
    again = await store_shape.submit_ids(specs[:1], now)
    assert again == [(answer[0][0], False)] and not again.effects
    assert not (await store_shape.submit_ids([], now)).effects


async def test_a_submit_s_effects_are_those_of_its_created_tasks(
    store_shape: TaskStore, now: datetime
) -> None:
    spec = TaskSpec(queue="q", run_at=now, namespace="fy", idempotency_key="k")
    first = await store_shape.submit([spec], now)
    assert of_submits(first).ready == Counter({("fy", "q"): 1})
    assert not of_submits(await store_shape.submit([spec], now))
