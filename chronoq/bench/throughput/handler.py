"""The benchmark's handler: a no-op that notes how late each task started (s after run_at).

Worker processes and in-process workers alike run it; each process collects its own starts.
"""

from __future__ import annotations

from datetime import UTC, datetime

from chronoq.client import TaskContext

handler_starts: list[float] = []  # this process's handlers: seconds from run_at to start


async def noop(ctx: TaskContext) -> None:
    """The benchmark's handler: does nothing but note how late it started."""
    handler_starts.append((datetime.now(UTC) - ctx.run_at).total_seconds())


def take_handler_starts() -> list[float]:
    taken = list(handler_starts)
    handler_starts.clear()
    return taken


