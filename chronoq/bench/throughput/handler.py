"""The benchmark's handler: a no-op that notes how late each task started (s after run_at).

Worker processes and in-process workers alike run it; each process collects its own starts.
"""

from __future__ import annotations

from datetime import UTC, datetime

from chronoq.client import TaskContext

handler_starts: list[float] = []  # this process's handlers: seconds from run_at to start
#: Per start, its legs in seconds (every process reads the same clock): run_at to the
#: insert's ``now`` (``created_at``), that to the claim's ``now`` (the lease's start), and
#: that to the handler's start. Bounded: the first ``MAX_LEGS`` starts only.
handler_legs: list[tuple[float, float, float]] = []
MAX_LEGS = 100_000


async def noop(ctx: TaskContext) -> None:
    """The benchmark's handler: does nothing but note how late it started."""
    now = datetime.now(UTC)
    handler_starts.append((now - ctx.run_at).total_seconds())
    task = ctx.task
    if task.created_at is not None and task.lease_until is not None and (
        len(handler_legs) < MAX_LEGS
    ):
        claimed = task.lease_until - task.lease_timeout
        handler_legs.append((
            (task.created_at - task.run_at).total_seconds(),
            (claimed - task.created_at).total_seconds(),
            (now - claimed).total_seconds(),
        ))


def take_handler_starts() -> list[float]:
    taken = list(handler_starts)
    handler_starts.clear()
    return taken


def take_handler_legs() -> list[tuple[float, float, float]]:
    taken = list(handler_legs)
    handler_legs.clear()
    return taken


