"""What a store write did that someone else must hear of: its effects, as one value.

A write that makes tasks READY wakes claims, long polls and streams waiting on their queues;
one that makes tasks SCHEDULED offers the near-future ones to their owner's timing wheel. The
node's dispatcher (``chronoq.node.dispatch.dispatcher``) applies them in one place, after the
write committed, instead of each caller deriving its own wake-ups. Pure: built from the
store's outcomes.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime

from chronoq.models import AckOutcome, SubmitOutcome, Task, TaskSpec, TaskState

#: (namespace, queue)
Key = tuple[str, str]
#: A task made SCHEDULED, as the timing wheel takes it: (id, run_at, (namespace, queue)).
Scheduled = tuple[str, datetime, Key]


def scheduled_of(task: Task) -> Scheduled:
    """A SCHEDULED task as the wheel takes it."""
    return task.id, task.run_at, (task.namespace, task.queue)


@dataclass(frozen=True)
class Effects:
    """Tasks made READY per queue (each wakes one waiter) and tasks made SCHEDULED (the
    wheel takes those due within its horizon, in this order)."""

    ready: Counter[Key] = field(default_factory=Counter)
    scheduled: tuple[Scheduled, ...] = ()

    def __bool__(self) -> bool:
        return bool(self.ready or self.scheduled)

    def merge(self, other: Effects) -> Effects:
        """Both writes' effects (counts added, scheduled tasks in order: ``self``'s first)."""
        return Effects(
            ready=self.ready + other.ready,
            scheduled=self.scheduled + other.scheduled,
        )


#: A write that wakes nobody and offers nothing.
NO_EFFECTS = Effects()


def made_ready(counts: Mapping[Key, int] | Iterable[Key]) -> Effects:
    """Tasks made READY: counts per queue, or one queue per task."""
    return Effects(ready=+Counter(counts))


def of_tasks(tasks: Iterable[Task]) -> Effects:
    """The effects of writes that left ``tasks`` in their states: READY ones wake a waiter,
    SCHEDULED ones go to the wheel, DEAD and the rest wake nobody."""
    ready: Counter[Key] = Counter()
    scheduled: list[Scheduled] = []
    for task in tasks:
        if task.state is TaskState.READY:
            ready[(task.namespace, task.queue)] += 1
        elif task.state is TaskState.SCHEDULED:
            scheduled.append(scheduled_of(task))
    return Effects(ready=ready, scheduled=tuple(scheduled))


def released(tasks: Iterable[Task]) -> Effects:
    """Running tasks given back READY without an attempt spent (a release): each wakes a
    waiter."""
    return Effects(ready=Counter((t.namespace, t.queue) for t in tasks))


def freed(tasks: Iterable[Task]) -> Effects:
    """Tasks moved out of RUNNING (failed, reaped, cancelled) that had a concurrency key: a
    slot of their key is free, so each wakes one waiter of its queue, whose claim may start
    the key's next task (a READY task already wakes one through ``of_tasks``)."""
    return Effects(
        ready=Counter(
            (t.namespace, t.queue)
            for t in tasks
            if t.concurrency_key is not None and t.state is not TaskState.READY
        )
    )


def freed_by_acks(namespace: str, outcomes: Iterable[AckOutcome]) -> Effects:
    """Completions that freed a slot of a concurrency key: one waiter of the queue each."""
    return Effects(ready=Counter((namespace, o.freed) for o in outcomes if o.freed is not None))


def of_submits(outcomes: Iterable[SubmitOutcome]) -> Effects:
    """A submit's: the tasks it created (a repeated key made nothing new), and the pending
    task of a debounce key that it moved (the wheel must hold it at its new instant)."""
    return of_tasks(
        o.task
        for o in outcomes
        if o.created or (o.task.debounce_key is not None and o.task.state is TaskState.SCHEDULED)
    )


def of_accepted(
    specs: Sequence[TaskSpec], accepted: Sequence[tuple[str, bool]], now: datetime
) -> Effects:
    """An ids-only submit's (the store answers (id, created) per spec): a created task due
    by ``now`` was made READY, a later one SCHEDULED."""
    ready: Counter[Key] = Counter()
    scheduled: list[Scheduled] = []
    for spec, (task_id, created) in zip(specs, accepted, strict=True):
        if not created:
            continue
        key = (spec.namespace, spec.queue)
        if spec.run_at <= now:
            ready[key] += 1
        else:
            scheduled.append((task_id, spec.run_at, key))
    return Effects(ready=ready, scheduled=tuple(scheduled))
