"""Keeps the child processes of a local stack running: PostgreSQL, etcd members, nodes.

One watcher per child, all alike: it polls the child's PID (which also reaps an exited child,
so no zombie stays behind), and when the child is gone it logs one line and starts it again
after a ``RestartBackoff`` delay. With ``restart=False`` it only reaps and reports, so faults
injected by hand stay in place. Processes that another program restarts (a postmaster under
Patroni) are not children; ``observe`` watches their PIDs, so the state file follows them too.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass

from chronoq.embedded.restarts import RestartBackoff

log = logging.getLogger("chronoq.supervisor")

#: How often each child's PID is looked at, in seconds.
POLL_INTERVAL_S = 0.2


@dataclass(frozen=True)
class Child:
    """A supervised process. ``pid()`` is None once it has exited (and reaps it);
    ``start()`` blocks until it serves again, or raises."""

    name: str
    pid: Callable[[], int | None]
    start: Callable[[], None]


class Supervisor:
    """Watches ``children``; ``on_change`` is called after each restart or, without
    restarts, each exit (e.g. to rewrite a state file with the PIDs), and whenever what
    ``observe`` returns (PIDs that others restart) changes. ``start()``, then ``await stop()``
    before stopping the children themselves."""

    def __init__(
        self,
        children: list[Child],
        *,
        restart: bool = True,
        on_change: Callable[[], None] = lambda: None,
        poll_interval: float = POLL_INTERVAL_S,
        backoff: Callable[[], RestartBackoff] = RestartBackoff,
        observe: Callable[[], object] | None = None,
    ) -> None:
        self.children = children
        self.restart = restart
        self.restarts: dict[str, int] = {c.name: 0 for c in children}
        self._on_change = on_change
        self._poll = poll_interval
        self._backoff = backoff
        self._observe = observe
        self._tasks: list[asyncio.Task[None]] = []

    def start(self) -> None:
        """Start one watcher per child on the running loop."""
        self._tasks = [
            asyncio.create_task(
                self._watch(child, child.pid()), name=f"chronoq-supervise-{child.name}"
            )
            for child in self.children
        ]
        if self._observe is not None:
            self._tasks.append(
                asyncio.create_task(self._follow(self._observe), name="chronoq-supervise-observed")
            )

    async def stop(self) -> None:
        """Stop watching; a restart in progress finishes first (it runs in a thread)."""
        tasks, self._tasks = self._tasks, []
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task

    async def _watch(self, child: Child, last_pid: int | None) -> None:
        backoff = self._backoff()
        backoff.started(time.monotonic())
        reported = False
        while True:
            await asyncio.sleep(self._poll)
            pid = child.pid()
            if pid is not None:
                last_pid, reported = pid, False
            elif self.restart:
                last_pid = await self._restart(child, backoff, last_pid)
            elif not reported:
                reported = True
                log.warning(
                    "%s (pid %s) exited; not restarting it (--no-restart)", child.name, last_pid
                )
                self._on_change()

    async def _follow(self, observe: Callable[[], object]) -> None:
        """``on_change`` whenever ``observe()`` differs from the last look."""
        seen = observe()
        while True:
            await asyncio.sleep(self._poll)
            now = observe()
            if now != seen:
                seen = now
                self._on_change()

    async def _restart(self, child: Child, backoff: RestartBackoff, last_pid: int | None) -> int:
        """Start ``child`` again, with growing delays while it fails; returns its new PID."""
        failed = 0
        while True:
            delay = backoff.delay(time.monotonic())
            if failed == 0:
                log.warning(
                    "%s (pid %s) exited; restarting it in %.1f s", child.name, last_pid, delay
                )
            await asyncio.sleep(delay)
            backoff.started(time.monotonic())
            try:
                await finish_in_thread(child.start)
            except Exception as exc:  # noqa: BLE001 - any failure to start is retried
                failed += 1
                first_line = (str(exc).splitlines() or [type(exc).__name__])[0]
                log.warning("%s did not start (attempt %d): %s", child.name, failed, first_line)
                continue
            pid = child.pid()
            if pid is None:
                failed += 1
                continue
            self.restarts[child.name] += 1
            log.warning(
                "%s restarted: pid %d%s",
                child.name,
                pid,
                f" after {failed + 1} attempts" if failed else "",
            )
            self._on_change()
            return pid


async def finish_in_thread(fn: Callable[[], None]) -> None:
    """Run blocking ``fn`` in a thread; if cancelled meanwhile, let it finish, then re-raise.

    A thread cannot be interrupted: returning early would let the stack stop a server while
    it is still starting, and leave it behind.
    """
    job = asyncio.ensure_future(asyncio.to_thread(fn))
    try:
        await asyncio.shield(job)
    except asyncio.CancelledError:
        with contextlib.suppress(Exception):
            await job
        raise
