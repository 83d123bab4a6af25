"""Worker claims on a node: at once or long-polling, within caps, never for a caller who left.

A long-poll waits in the node's ``ReadyNotifier`` (no store traffic while it waits), no longer
than the caller's own deadline, and holds one of its namespace's long-poll slots. A claim that
returns when its caller is gone (cancelled, or past its deadline) gives its tasks back at once
without using an attempt, instead of leaving them RUNNING until their lease expires.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import functools
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from datetime import timedelta
from typing import Protocol

from chronoq.clock import Clock
from chronoq.effects import Effects, released
from chronoq.errors import ChronoqError
from chronoq.limits import MAX_ANSWER_BYTES
from chronoq.models import Lease, Task
from chronoq.node.dispatch.dispatcher import Dispatch
from chronoq.node.dispatch.gate import Gate
from chronoq.node.dispatch.readiness import LongPollSlots, ReadyNotifier, Watch
from chronoq.store.port import ByQueue, ByTaskId

log = logging.getLogger("chronoq.node")

#: A long-poll answers this long before the caller's deadline, so its (empty) answer arrives
#: in time even from a busy node.
ANSWER_MARGIN = timedelta(milliseconds=250)
#: A woken long-poll that claimed a full batch wakes this many more waiters of its queues:
#: the notice of "N tasks ready" may have counted fewer than there are (one per submit).
WAKE_FANOUT = 2


def claim_lanes(pool_size: int) -> int:
    """Claim statements a node runs at once: half its connection pool (at least one)."""
    return max(1, pool_size // 2)


class FairLanes:
    """At most ``lanes`` claim statements at once; namespaces waiting for a lane take turns.

    A thousand workers polling at once would otherwise queue a thousand statements at the
    connection pool, in front of every other call of every namespace. Claims use part of the
    pool only (the rest stays free for submits, gets and acks), and a namespace with a thousand
    waiting claims delays another namespace's claim by one turn, not by a thousand.
    """

    def __init__(self, lanes: int) -> None:
        self.lanes = lanes
        self._free = lanes
        # namespace -> its waiters, oldest first; dict order is the round-robin order.
        self._waiting: dict[str, collections.deque[asyncio.Future[None]]] = {}

    def waiting(self) -> int:
        return sum(len(q) for q in self._waiting.values())

    @contextlib.asynccontextmanager
    async def lane(self, namespace: str) -> AsyncIterator[None]:
        """Hold one lane for the block, after the namespaces queued before have had a turn."""
        if self._free > 0 and not self._waiting:
            self._free -= 1
        else:
            turn = asyncio.get_running_loop().create_future()
            self._waiting.setdefault(namespace, collections.deque()).append(turn)
            try:
                await turn
            except asyncio.CancelledError:
                if turn.done() and not turn.cancelled():
                    self._pass_on()  # granted as we were cancelled: the next one gets it
                else:
                    self._withdraw(namespace, turn)
                raise
        try:
            yield
        finally:
            self._pass_on()

    def _pass_on(self) -> None:
        while self._waiting:
            namespace = next(iter(self._waiting))
            queue = self._waiting.pop(namespace)
            turn = queue.popleft()
            if queue:
                self._waiting[namespace] = queue  # to the back of the round
            if not turn.done():
                turn.set_result(None)
                return
        self._free += 1

    def _withdraw(self, namespace: str, turn: asyncio.Future[None]) -> None:
        queue = self._waiting.get(namespace)
        if queue is None:
            return
        with contextlib.suppress(ValueError):
            queue.remove(turn)
        if not queue:
            del self._waiting[namespace]


class Caller(Protocol):
    """What a claim needs to know of its caller (a gRPC servicer context fits)."""

    def time_remaining(self) -> float | None: ...

    def cancelled(self) -> bool: ...


def wait_within_deadline(wait: float, time_remaining: float | None) -> float:
    """The seconds a long-poll may wait: ``wait``, cut to the caller's deadline less a margin."""
    if time_remaining is None:
        return max(wait, 0.0)
    return max(0.0, min(wait, time_remaining - ANSWER_MARGIN.total_seconds()))


def caller_gone(caller: Caller) -> bool:
    remaining = caller.time_remaining()
    return caller.cancelled() or (remaining is not None and remaining <= 0)


class ClaimStore(ByQueue, ByTaskId, Protocol):
    """What claims ask of the store: claims, limits and settings by queue (the gate reads
    them), releases by task id."""


class Claims:
    """READY → RUNNING for workers, at once or after waiting for tasks to become ready."""

    def __init__(
        self,
        store: ClaimStore,
        clock: Clock,
        notifier: ReadyNotifier,
        slots: LongPollSlots,
        lanes: FairLanes,
        *,
        dispatch: Callable[[Effects], None] | None = None,
        gate: Gate | None = None,
    ) -> None:
        self._store = store
        self._clock = clock
        self._notifier = notifier
        #: Applies what its give-backs did (the node's dispatcher; default: one waking
        #: ``notifier``, no wheel).
        self._dispatch = dispatch or Dispatch(notifier, clock).apply
        self.slots = slots
        self.lanes = lanes
        #: The node's dispatch gate (shared with its hand-offs): the queues whose claims
        #: take tokens from a dispatch limit, read again as it says.
        self.gate = gate if gate is not None else Gate()
        self._releasing: set[asyncio.Task[None]] = set()
        self.released = 0  # tasks given back because their caller had gone

    async def claim(
        self,
        caller: Caller,
        namespace: str,
        queues: Sequence[str],
        worker_id: str,
        max_tasks: int,
        wait: timedelta,
    ) -> list[Task]:
        """Claim up to ``max_tasks``; wait up to ``wait`` (clipped to the caller's deadline)
        for one to become ready. ``TooManyLongPolls`` if a waiting claim is over a cap."""
        seconds = wait_within_deadline(wait.total_seconds(), caller.time_remaining())
        once = functools.partial(self.claim_once, caller, namespace, queues, worker_id, max_tasks)
        if seconds <= 0:
            return await once()
        with self.slots.hold(namespace):
            return await self._long_poll(namespace, queues, max_tasks, seconds, once)

    async def _long_poll(
        self,
        namespace: str,
        queues: Sequence[str],
        max_tasks: int,
        seconds: float,
        once: Callable[..., Awaitable[list[Task]]],
    ) -> list[Task]:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + seconds
        woken = False
        while True:
            # Watch before claiming, so tasks made ready during the claim wake us.
            with self._notifier.watch(namespace, queues) as watch:
                # A first claim where others wait already and nothing woke them would find
                # nothing: it joins them at no cost (also after queueing for a lane, so a
                # thousand workers arriving at once at an idle queue cost a few statements).
                tasks = await once(unless_quiet=not woken)
                remaining = deadline - loop.time()
                if tasks or remaining <= 0:
                    break
                if not await watch.wait(remaining):
                    return []  # the deadline: the caller asks again
                woken = True
        if len(tasks) == max_tasks:
            # Local only: the other nodes heard of these tasks from whoever made them ready.
            self.wake_more(watch.keys)
        return tasks

    async def claim_once(
        self,
        caller: Caller,
        namespace: str,
        queues: Sequence[str],
        worker_id: str,
        max_tasks: int,
        *,
        unless_quiet: bool = False,
        max_bytes: int = MAX_ANSWER_BYTES,
    ) -> list[Task]:
        """One claim statement: up to ``max_tasks`` within ``max_bytes`` (always one task if any
        is ready; see ``Store.claim``)."""
        if unless_quiet and self._notifier.quiet(namespace, queues):
            return []
        async with self.lanes.lane(namespace):
            if unless_quiet and self._notifier.quiet(namespace, queues):
                return []
            limited = await self.gate.current(self._store)
            job = asyncio.ensure_future(
                self._store.claim(
                    namespace,
                    queues,
                    worker_id,
                    max_tasks,
                    self._clock.now(),
                    limited=limited,
                    keyed=self._keyed(namespace, queues),
                    max_bytes=max_bytes,
                )
            )
            try:
                # Shielded: a cancelled caller must not leave a committed claim unseen.
                tasks = await asyncio.shield(job)
            except asyncio.CancelledError:
                job.add_done_callback(functools.partial(self._release_result, namespace))
                raise
        if tasks and caller_gone(caller):
            self._release_soon(namespace, tasks)
            return []
        return tasks

    def _keyed(self, namespace: str, queues: Sequence[str]) -> frozenset[tuple[str, str]]:
        """The queues among ``queues`` the gate knows to be limited per concurrency key: their
        claim counts each key's running tasks (a queue limited since the gate's last read is
        claimed by no one until it reads it: the plain claim statement skips keyed queues)."""
        out = []
        for queue in queues:
            settings = self.gate.settings((namespace, queue))
            if settings is not None and settings.keyed:
                out.append((namespace, queue))
        return frozenset(out)

    def watch(self, namespace: str, queues: Sequence[str]) -> Watch:
        """Register a waiter on ``queues`` (before its claim, so no wake-up is missed)."""
        return self._notifier.watch(namespace, queues)

    def wake_more(self, keys: Sequence[tuple[str, str]]) -> None:
        """A claim took a full batch: wake a few more waiters of its queues on this node
        (a notice of "N tasks ready" may have counted fewer than there are)."""
        self._notifier.wake(dict.fromkeys(keys, WAKE_FANOUT))

    def pass_on(self, keys: Sequence[tuple[str, str]]) -> None:
        """A waiter was woken but cannot claim (no credit left): wake another in its place."""
        self._notifier.wake(dict.fromkeys(keys, 1))

    def gated_keys(self) -> frozenset[tuple[str, str]] | None:
        """The gated queues (never handed off) as last read, None before the first read."""
        return self.gate.known()

    def give_back(self, namespace: str, tasks: list[Task]) -> None:
        """Release ``tasks`` claimed for a caller that will not get them (its call failed
        after the claim), without using an attempt."""
        self._release_soon(namespace, tasks)

    def _release_result(self, namespace: str, job: asyncio.Future[list[Task]]) -> None:
        if job.cancelled() or job.exception() is not None:
            return
        self._release_soon(namespace, job.result())

    def _release_soon(self, namespace: str, tasks: list[Task]) -> None:
        if not tasks:
            return
        release = asyncio.get_running_loop().create_task(
            self._release(namespace, tasks), name="chronoq-release-unclaimed"
        )
        self._releasing.add(release)
        release.add_done_callback(self._releasing.discard)

    async def _release(self, namespace: str, tasks: list[Task]) -> None:
        given: list[Task] = []
        for task in tasks:
            try:
                given.append(await self._store.release(namespace, Lease(task.id, task.attempt)))
            except ChronoqError as exc:
                # The lease then expires as usual and the reaper makes the task ready again.
                log.warning(
                    "could not give back task %s claimed for a gone caller: %s", task.id, exc
                )
        self.released += len(given)
        if given:
            log.info("gave back %d tasks claimed for a caller that had gone", len(given))
            self._dispatch(released(given))
