"""The demo's progress and end from the counts of ``tasks``, whose finished rows move into
the task history while a long run goes on."""

from __future__ import annotations

import asyncio
from datetime import timedelta
from typing import Any

from chronoq.demo import DemoOptions, _watch, run_counts
from chronoq.models import TaskState


class MovedStack:
    """A dev stack whose ``tasks`` holds 2 DEAD letters and 3 SUCCEEDED tasks of a run of
    10: the other 5 finished long enough ago to be in the history."""

    async def count_by_state(self) -> dict[TaskState, int]:
        return {TaskState.SUCCEEDED: 3, TaskState.DEAD: 2}


def test_tasks_no_longer_in_tasks_count_as_succeeded() -> None:
    assert run_counts({TaskState.SUCCEEDED: 3, TaskState.DEAD: 2}, 10) == {
        TaskState.SUCCEEDED: 8,
        TaskState.DEAD: 2,
    }
    live = {TaskState.SCHEDULED: 4, TaskState.RUNNING: 1}
    assert run_counts(live, 5) == live  # nothing has moved
    assert run_counts({}, 0) == {}


async def test_a_run_whose_finished_tasks_moved_ends() -> None:
    seen: list[dict[TaskState, int]] = []
    opts = DemoOptions(tasks=10, over=timedelta(0))
    stack: Any = MovedStack()
    finished = await asyncio.wait_for(_watch(stack, opts, asyncio.Event(), seen.append), 5)
    assert finished
    assert seen == [{TaskState.SUCCEEDED: 8, TaskState.DEAD: 2}]
