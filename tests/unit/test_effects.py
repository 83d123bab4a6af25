"""A write's effects (``chronoq.effects``) and the node's one dispatcher that applies them."""

from __future__ import annotations

import ast
import asyncio
from collections import Counter
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import chronoq.node
from chronoq.clock import ManualClock
from chronoq.effects import (
    Effects,
    made_ready,
    of_accepted,
    of_submits,
    of_tasks,
    released,
)
from chronoq.models import SubmitOutcome, Task, TaskSpec, TaskState
from chronoq.node.dispatch.dispatcher import Dispatch
from chronoq.node.dispatch.readiness import ReadyNotifier
from chronoq.store import FireResult

NOW = datetime(2030, 1, 1, tzinfo=UTC)


def _task(i: int, state: TaskState, queue: str = "q", run_at: datetime = NOW) -> Task:
    return Task(
        id=f"id-{i}", namespace="ns", queue=queue, state=state, run_at=run_at, partition=0, bucket=0
    )


def test_only_ready_tasks_wake_and_only_scheduled_ones_reach_the_wheel() -> None:
    later = NOW + timedelta(seconds=3)
    tasks = [
        _task(1, TaskState.READY),
        _task(2, TaskState.READY, "r"),
        _task(3, TaskState.SCHEDULED, run_at=later),
        _task(4, TaskState.DEAD),
    ]
    effects = of_tasks(tasks)
    assert effects.ready == Counter({("ns", "q"): 1, ("ns", "r"): 1})
    assert effects.scheduled == (("id-3", later, ("ns", "q")),)


def test_a_repeated_key_makes_nothing_to_announce() -> None:
    outcomes = [
        SubmitOutcome(_task(1, TaskState.READY), created=False),
        SubmitOutcome(_task(2, TaskState.READY), created=True),
    ]
    assert of_submits(outcomes).ready == Counter({("ns", "q"): 1})
    assert not of_submits(outcomes[:1])


def test_an_ids_only_submit_counts_due_specs_ready_and_later_ones_scheduled() -> None:
    later = NOW + timedelta(seconds=1)
    specs = [
        TaskSpec(queue="q", namespace="ns", run_at=NOW),
        TaskSpec(queue="q", namespace="ns", run_at=later),
        TaskSpec(queue="q", namespace="ns", run_at=NOW),
    ]
    effects = of_accepted(specs, [("a", True), ("b", True), ("c", False)], NOW)
    assert effects.ready == Counter({("ns", "q"): 1})
    assert effects.scheduled == (("b", later, ("ns", "q")),)


def test_merge_adds_counts_and_keeps_the_order_of_scheduled_tasks() -> None:
    one = Effects(ready=Counter({("ns", "q"): 1}), scheduled=(("a", NOW, ("ns", "q")),))
    two = Effects(ready=Counter({("ns", "q"): 2}), scheduled=(("b", NOW, ("ns", "q")),))
    both = one.merge(two)
    assert both.ready == Counter({("ns", "q"): 3})
    assert [s[0] for s in both.scheduled] == ["a", "b"]
    assert not Effects() and not made_ready({("ns", "q"): 0})
    assert released([_task(1, TaskState.READY)]).ready == Counter({("ns", "q"): 1})


def test_a_fire_result_carries_its_ready_tasks_as_effects() -> None:
    result = FireResult(fired=2, ready_by_queue=Counter({("ns", "q"): 2}))
    assert result.effects.ready == Counter({("ns", "q"): 2})
    assert not FireResult().effects


async def test_the_dispatcher_wakes_one_waiter_per_ready_task() -> None:
    notifier = ReadyNotifier()
    dispatch = Dispatch(notifier, ManualClock(NOW))
    with notifier.watch("ns", ["q"]) as a, notifier.watch("ns", ["q"]) as b:
        dispatch.apply(made_ready([("ns", "q")]))
        await asyncio.sleep(0)
        assert [a.woken, b.woken] == [True, False]


class _Owner:
    def __init__(self) -> None:
        self.offered: list[tuple[list[Any], datetime]] = []

    def offer(self, scheduled: Any, now: datetime) -> None:
        self.offered.append((list(scheduled), now))


def test_the_dispatcher_wakes_first_then_offers_scheduled_tasks_to_the_owner() -> None:
    notifier = ReadyNotifier()
    told: list[dict[tuple[str, str], int]] = []
    notifier.on_notify = lambda counts: told.append(dict(counts))
    clock = ManualClock(NOW)
    scheduled = (("mine", NOW, ("ns", "q")), ("theirs", NOW, ("ns", "q")))
    Dispatch(notifier, clock).apply(Effects(scheduled=scheduled))  # no owner: the tick fires them
    owner = _Owner()
    dispatch = Dispatch(notifier, clock, owner)
    dispatch.apply(Effects(ready=Counter({("ns", "q"): 1}), scheduled=scheduled))
    assert told == [{("ns", "q"): 1}]  # nobody waits here: the other nodes hear of it
    assert owner.offered == [(list(scheduled), NOW)]  # the clock's now, unless given
    later = NOW + timedelta(seconds=5)
    dispatch.apply(Effects(scheduled=scheduled[:1]), later)
    assert owner.offered[-1][1] == later


def test_only_the_dispatcher_wakes_claims_or_offers_the_wheel() -> None:
    """A wake-up derived by hand beside the dispatcher would drift from it (or double it)."""
    node = Path(chronoq.node.__file__).parent
    # The dispatcher, the notifier itself, and the owner engine, where its offers end.
    allowed = {"dispatcher.py", "readiness.py", "engine.py"}
    calls = []
    for path in sorted(node.rglob("*.py")):
        if path.name in allowed:
            continue
        for n in ast.walk(ast.parse(path.read_text())):
            if (
                isinstance(n, ast.Call)
                and isinstance(n.func, ast.Attribute)
                and n.func.attr in {"notify", "offer"}
            ):
                calls.append(f"{path.name}:{n.lineno}")
    assert not calls, f"wake-ups outside the dispatcher: {calls}"
