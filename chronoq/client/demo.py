"""The built-in demo workload: a handler that fails on request, and the payloads that ask it to.

Payload format (UTF-8 JSON object; every key is optional)::

    {"n": 17, "sleep_ms": 5, "fail_attempts": 1, "fatal": false}

- ``n``: a sequence number, only for people reading the task.
- ``sleep_ms``: how long the handler pretends to work (default 5 ms).
- ``fail_attempts``: attempts 1..``fail_attempts`` raise ``DemoRetryableError`` (retried with
  backoff); later attempts succeed. More than the task's ``max_attempts`` sends it DEAD.
- ``fatal``: raise ``FatalTaskError`` on every attempt: the task goes DEAD without retrying.

A payload that is not such JSON (``chronoq submit q --payload hello``) just succeeds after the
default sleep. The outcome depends on the payload and the attempt number only, so a run can be
predicted from what was submitted.
"""

from __future__ import annotations

import asyncio
import json
import random
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from chronoq import stats
from chronoq.client.context import FatalTaskError, Handler, TaskContext
from chronoq.models import Task, TaskState

DEMO_QUEUE = "demo"
DEFAULT_SLEEP_MS = 5
MAX_SLEEP_MS = 60_000


class DemoRetryableError(Exception):
    """The demo handler failing on purpose; the task is retried."""


@dataclass(frozen=True)
class DemoPayload:
    """What a demo task asks its handler to do."""

    n: int = 0
    sleep_ms: int = DEFAULT_SLEEP_MS
    fail_attempts: int = 0
    fatal: bool = False

    def encode(self) -> bytes:
        fields: dict[str, Any] = {"n": self.n, "sleep_ms": self.sleep_ms}
        if self.fail_attempts:
            fields["fail_attempts"] = self.fail_attempts
        if self.fatal:
            fields["fatal"] = True
        return json.dumps(fields, separators=(",", ":")).encode()

    @classmethod
    def decode(cls, payload: bytes) -> DemoPayload:
        """The flags in ``payload``; defaults for anything that is not a JSON object."""
        try:
            fields = json.loads(payload)
        except (ValueError, UnicodeDecodeError):
            return cls()
        if not isinstance(fields, dict):
            return cls()
        return cls(
            n=_int(fields.get("n"), 0),
            sleep_ms=min(max(_int(fields.get("sleep_ms"), DEFAULT_SLEEP_MS), 0), MAX_SLEEP_MS),
            fail_attempts=max(_int(fields.get("fail_attempts"), 0), 0),
            fatal=fields.get("fatal") is True,
        )


def _int(value: object, default: int) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) else default


def scripted_failure(spec: DemoPayload, attempt: int) -> Exception | None:
    """The exception ``attempt`` of a task with payload ``spec`` raises; None when it succeeds.

    The one definition of the scripted outcome, shared by the demo handler and the chaos
    workers: ``fatal`` fails every attempt without retrying, attempts 1..``fail_attempts``
    fail and are retried, later attempts succeed.
    """
    if spec.fatal:
        return FatalTaskError(f"demo task {spec.n}: fatal on purpose")
    if attempt <= spec.fail_attempts:
        return DemoRetryableError(
            f"demo task {spec.n}: failing attempt {attempt} of {spec.fail_attempts} on purpose"
        )
    return None


async def demo_handler(ctx: TaskContext) -> None:
    """Sleep ``sleep_ms``, then fail or succeed as the payload says (see the module doc)."""
    spec = DemoPayload.decode(ctx.payload)
    await asyncio.sleep(spec.sleep_ms / 1000)
    failure = scripted_failure(spec, ctx.attempt)
    if failure is not None:
        raise failure


HANDLERS: dict[str, Handler] = {DEMO_QUEUE: demo_handler}


def handlers_for(queues: Iterable[str]) -> dict[str, Handler]:
    """The demo handler serving each of ``queues``."""
    return dict.fromkeys(queues, demo_handler)


def demo_payloads(count: int, *, fail_rate: float, seed: int = 0) -> list[DemoPayload]:
    """``count`` payloads: about ``fail_rate`` of them fail at least once, a tenth of those fatally.

    Of the retryable failures most fail once, some twice, and one in twenty fails three times
    (DEAD with the demo's ``max_attempts`` of 3). Deterministic for a given ``seed``.
    """
    if not 0.0 <= fail_rate <= 1.0:
        raise ValueError("fail_rate must be between 0 and 1")
    rng = random.Random(seed)
    out = []
    for n in range(count):
        draw = rng.random()
        sleep_ms = rng.randint(1, 10)
        if draw < fail_rate * 0.1:
            out.append(DemoPayload(n, sleep_ms, fatal=True))
        elif draw < fail_rate:
            fails = rng.choices((1, 2, 3), weights=(80, 15, 5))[0]
            out.append(DemoPayload(n, sleep_ms, fail_attempts=fails))
        else:
            out.append(DemoPayload(n, sleep_ms))
    return out


@dataclass(frozen=True)
class DemoSummary:
    """What happened to a demo run's tasks, read back from the store."""

    submitted: int
    fired: int
    succeeded: int
    retried: int
    dead: int
    unfinished: dict[str, int]
    lateness_p50: timedelta | None
    lateness_p99: timedelta | None
    lateness_max: timedelta | None


def summarize(tasks: Iterable[Task]) -> DemoSummary:
    """Count outcomes; lateness is ``fired_at - run_at`` of each task's latest firing."""
    counts: dict[TaskState, int] = dict.fromkeys(TaskState, 0)
    fired = retried = 0
    lateness: list[timedelta] = []
    for task in tasks:
        counts[task.state] += 1
        if task.attempt > 0 or task.state in (TaskState.READY, TaskState.RUNNING):
            fired += 1
        if task.attempt > 1:
            retried += 1
        if task.fired_at is not None:
            lateness.append(task.fired_at - task.run_at)
    lateness.sort()
    return DemoSummary(
        submitted=sum(counts.values()),
        fired=fired,
        succeeded=counts[TaskState.SUCCEEDED],
        retried=retried,
        dead=counts[TaskState.DEAD],
        unfinished={s.name: n for s, n in counts.items() if n and not s.terminal},
        lateness_p50=percentile(lateness, 0.50),
        lateness_p99=percentile(lateness, 0.99),
        lateness_max=lateness[-1] if lateness else None,
    )


def percentile(ordered: list[timedelta], q: float) -> timedelta | None:
    """The ``q``-th quantile (0..1) of ``ordered``, as ``chronoq.stats`` defines it."""
    return stats.percentile(ordered, q * 100)
