"""The streaming worker protocol on a node: tasks pushed within credits, acks streamed.

One ``Work`` call serves one worker for as long as it runs. The worker opens it with its
queues and grants *credits* (the slots it has free); the node keeps one long-poll open for
the stream whenever it has credits and pushes each claim at once, so a task that becomes
ready reaches a waiting worker after one claim statement and one message, with no request
in between. Acks come on the same stream, each batch answered with its ``ack_seq``; freed
slots come back as credits, usually in the same message as their acks.

A stream holds one of its namespace's long-poll slots while it is open (streams are capped
like long-polls). What a stream owns when it ends: tasks already pushed stay leased to the
worker, which may finish and ack them elsewhere (or let the leases expire); tasks claimed for
it but not written are released at once, without using an attempt.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
from collections.abc import AsyncIterator, Callable
from datetime import timedelta
from typing import Any

from chronoq import tracing
from chronoq.api import convert
from chronoq.api.v1 import worker_pb2
from chronoq.clock import Clock
from chronoq.errors import InvalidArgument
from chronoq.limits import (
    MAX_CLAIM_TASKS,
    MAX_LEASES_PER_CALL,
    MAX_QUEUES_PER_CLAIM,
    MAX_STREAM_CREDITS,
    MAX_WORKER_ID,
    check_count,
    check_name,
    check_text,
)
from chronoq.models import AckOutcome, Task
from chronoq.node.claims import Caller, Claims
from chronoq.node.handoff import HandOff
from chronoq.node.readiness import Watch
from chronoq.store import Store
from chronoq.timeslice import converted

log = logging.getLogger("chronoq.node")

#: Each long-poll of a stream waits at most this long, then registers again (a queue limit
#: changed meanwhile applies, and a stream whose caller left is noticed).
STREAM_WAIT = timedelta(seconds=5)
#: Ack batches of one stream in the store at once; the next message waits (back-pressure).
ACKS_IN_FLIGHT = 4
#: The least a claim asks for while claims come back short (see ``claim_size``).
QUIET_CLAIM = 16
#: Seconds a stream keeps room for the wheel's hand-off after the wheel last had tasks for
#: it: claims leave a quarter of its credits free meanwhile (see ``claim_size``).
HANDOFF_MEMORY = 1.0

Write = Callable[[worker_pb2.WorkResponse], Any]


def claim_size(free: int, *, more: bool, last: int, handoff: bool) -> int:
    """Credits a stream's next claim may fill, of its ``free`` ones.

    A claim in flight holds the credits it may fill, and the timing wheel's hand-off, the
    quicker path (one write from the instant to the push, where a claim adds a second), needs
    free ones at the instants it fires. So while the wheel hands off to this stream
    (``handoff``), a claim leaves it a quarter of the free credits: were it to take them all,
    every fire meanwhile would find none free and make its tasks READY, the next claim would
    come back full, take them all again, and the stream would stay on the slower path for as
    long as the load lasts (at 5,000 due/s on three nodes, a handler-start p99 of 66 ms
    instead of 29). While claims come back short (light traffic) a claim asks for about what
    the ``last`` one found (twice that, at least ``QUIET_CLAIM``, at most half the free
    credits). Without hand-offs a claim takes every free credit: there, batches decide the
    throughput.
    """
    n = min(free, MAX_CLAIM_TASKS)
    if not handoff:
        return n
    if more:
        return max(1, n - n // 4)
    return max(1, min(n - n // 2, max(QUIET_CLAIM, 2 * last)))


def opened(first: worker_pb2.WorkRequest | None, peer: str) -> tuple[str, list[str], str]:
    """(namespace, queues, worker id) of a stream's first message, checked."""
    if first is None or not first.HasField("open"):
        raise InvalidArgument("open", "the first message of a Work stream must open it")
    request = first.open
    namespace = check_name("open.namespace", convert.namespace_of(request.namespace))
    if not request.queues:
        raise InvalidArgument("open.queues", "name at least one queue to work on")
    check_count("open.queues", len(request.queues), MAX_QUEUES_PER_CLAIM)
    queues = list(dict.fromkeys(check_name("open.queues", q) for q in request.queues))
    check_text("open.worker_id", request.worker_id, MAX_WORKER_ID)
    return namespace, queues, request.worker_id or peer or "unknown"


class WorkSession:
    """One open ``Work`` stream: its credits, the loop that claims and pushes within them,
    and the acks it is answering."""

    def __init__(
        self,
        claims: Claims,
        store: Store,
        clock: Clock,
        caller: Caller,
        write: Write,
        *,
        namespace: str,
        queues: list[str],
        worker_id: str,
        on_completed: Callable[[list[AckOutcome]], None] = lambda _o: None,
        handoff: HandOff | None = None,
    ) -> None:
        self._claims = claims
        self._store = store
        self._clock = clock
        self._caller = caller
        self._write_raw = write
        self.namespace = namespace
        self.queues = queues
        self.worker_id = worker_id
        self._on_completed = on_completed
        self._handoff = handoff
        self.credits = 0  # granted by the worker, not pushed yet
        self.held = 0  # of ``credits``, those a claim or a hand-off in flight may fill
        self.pushed = 0
        self._offered_at = -HANDOFF_MEMORY  # loop time the wheel last had tasks for us
        self._closed = False
        self._deliveries: set[asyncio.Task[None]] = set()
        self._credited = asyncio.Event()
        self._drained = asyncio.Event()  # a hand-off took the last free credit
        self._writing = asyncio.Lock()
        self._ack_slots = asyncio.Semaphore(ACKS_IN_FLIGHT)
        self._acks: set[asyncio.Task[None]] = set()
        # Set by an ack that failed: the stream ends with its error.
        self._failed: asyncio.Future[None] = asyncio.get_running_loop().create_future()

    async def run(self, first: worker_pb2.WorkRequest, rest: AsyncIterator[Any]) -> None:
        """Serve the stream until the worker closes it; a store error ends it with that error
        (the worker opens another, possibly on another node)."""
        keys = [(self.namespace, q) for q in self.queues]
        with self._claims.slots.hold(self.namespace):
            if self._handoff is not None:
                self._handoff.join(self, keys)
            pusher = asyncio.create_task(self._push(), name="chronoq-work-push")
            reader = asyncio.create_task(self._read(first, rest), name="chronoq-work-read")
            jobs: set[asyncio.Future[None]] = {pusher, reader, self._failed}
            try:
                done, _ = await asyncio.wait(jobs, return_when=asyncio.FIRST_COMPLETED)
                for job in done:
                    job.result()  # an error of any ends the call with it
                # The worker closed its side: push nothing more (what a claim in flight took
                # goes back), answer the acks it is waiting for, then end.
                self._close(keys)
                pusher.cancel()
                await asyncio.gather(pusher, return_exceptions=True)
                await asyncio.gather(*self._acks, return_exceptions=True)
                if self._failed.done():
                    self._failed.result()
            finally:
                self._close(keys)
                jobs = {pusher, reader, *self._acks, *self._deliveries}
                for job in (*jobs, self._failed):
                    job.cancel()
                await asyncio.gather(*jobs, return_exceptions=True)

    def _close(self, keys: list[tuple[str, str]]) -> None:
        """Take no more hand-offs (one settled from now on gives its tasks back)."""
        if not self._closed:
            self._closed = True
            if self._handoff is not None:
                self._handoff.leave(self, keys)

    # ---------------------------------------------------------------- worker → node

    async def _read(self, first: worker_pb2.WorkRequest, rest: AsyncIterator[Any]) -> None:
        self._take(first)
        async for request in rest:
            if request.HasField("open"):
                raise InvalidArgument("open", "a Work stream is opened once, by its first message")
            self._take(request)
            if request.complete:
                await self._ack_slots.acquire()
                job = asyncio.create_task(self._ack(request), name="chronoq-work-ack")
                self._acks.add(job)
                job.add_done_callback(self._acks.discard)

    def _take(self, request: worker_pb2.WorkRequest) -> None:
        """Credits and the acks' shape of one message, checked before anything is written."""
        if request.credits:
            if self.credits + request.credits > MAX_STREAM_CREDITS:
                raise InvalidArgument(
                    "credits",
                    f"would make {self.credits + request.credits} outstanding; the limit is "
                    f"{MAX_STREAM_CREDITS} per stream",
                )
            self.credits += request.credits
            self._credited.set()
        check_count("complete", len(request.complete), MAX_LEASES_PER_CALL)
        if request.complete and not request.ack_seq:
            raise InvalidArgument("ack_seq", "must be set (non-zero) on a message with acks")

    async def _ack(self, request: worker_pb2.WorkRequest) -> None:
        try:
            leases = [convert.lease_from_pb(pb) for pb in request.complete]
            outcomes = await self._store.complete(self.namespace, leases, self._clock.now())
            self._on_completed(outcomes)
            await self._write(
                worker_pb2.WorkResponse(
                    ack_seq=request.ack_seq,
                    acked=[
                        worker_pb2.AckResult(task_id=o.task_id, ok=o.ok, error=o.error)
                        for o in outcomes
                    ],
                )
            )
        except Exception as exc:  # noqa: BLE001 - ends the stream, with the error's status
            if self._caller.cancelled():
                return  # the worker is gone: nobody to answer (it sends its acks again)
            # The worker sends these acks again (completes are safe to repeat).
            if not self._failed.done():
                self._failed.set_exception(exc)
        finally:
            self._ack_slots.release()

    # ---------------------------------------------------------------- node → worker

    def offered(self) -> None:
        self._offered_at = asyncio.get_running_loop().time()

    def _handing_off(self) -> bool:
        """The wheel had tasks for this stream lately: claims leave it room."""
        return (
            self._handoff is not None
            and asyncio.get_running_loop().time() - self._offered_at < HANDOFF_MEMORY
        )

    def available(self) -> int:
        """Credits neither pushed nor held by a claim or hand-off in flight."""
        return 0 if self._closed else self.credits - self.held

    def reserve(self, n: int) -> None:
        """Hold ``n`` credits for a hand-off (settled by ``deliver``)."""
        self.held += n
        if self.available() <= 0:
            self._drained.set()  # the pusher stops waiting for notices it could not act on

    def deliver(self, tasks: list[Task], reserved: int) -> None:
        """A hand-off is settled: push ``tasks`` (leased to this worker by the fire
        statement) and free the ``reserved`` credits they did not use."""
        self.held -= reserved
        if reserved > len(tasks):
            self._credited.set()
        if not tasks:
            return
        self.credits -= len(tasks)
        if self._closed:
            self._claims.give_back(self.namespace, tasks)
            return
        job = asyncio.get_running_loop().create_task(self._send(tasks), name="chronoq-work-handoff")
        self._deliveries.add(job)
        job.add_done_callback(functools.partial(self._delivered, tasks))

    def _delivered(self, tasks: list[Task], job: asyncio.Task[None]) -> None:
        """A hand-off's push ended: counted, or (failed, or cancelled even before it began)
        its tasks go back to READY at once, no attempt used."""
        self._deliveries.discard(job)
        if job.cancelled() or job.exception() is not None:
            self._claims.give_back(self.namespace, tasks)
        else:
            self.pushed += len(tasks)

    async def _push(self) -> None:
        """Claim within the free credits whenever tasks may be ready; push what comes."""
        more = True  # the last claim took all it asked for: there may be more at once
        last = 0  # tasks the last claim found
        keys = [(self.namespace, q) for q in self.queues]
        while True:
            while self.available() <= 0:
                self._credited.clear()
                await self._credited.wait()
            with self._claims.watch(self.namespace, self.queues) as watch:
                n = claim_size(
                    self.available(), more=more, last=last, handoff=self._handing_off()
                )
                self.held += n
                try:
                    tasks = await self._claims.claim_once(
                        self._caller,
                        self.namespace,
                        self.queues,
                        self.worker_id,
                        n,
                        unless_quiet=not more,
                    )
                finally:
                    self.held -= n
                last = len(tasks)
                if not tasks:
                    more = await self._wait(watch, keys)
                    continue
            more = len(tasks) == n
            if more:
                self._claims.wake_more(keys)
            self.credits -= len(tasks)
            await self._push_tasks(tasks)

    async def _wait(self, watch: Watch, keys: list[tuple[str, str]]) -> bool:
        """Wait for a notice (True) until ``STREAM_WAIT`` (False), or until a hand-off takes
        the last free credit: a notice heard then is passed on to another waiter, since this
        stream cannot act on it."""
        self._drained.clear()
        notice = asyncio.ensure_future(watch.wait(STREAM_WAIT.total_seconds()))
        drained = asyncio.ensure_future(self._drained.wait())
        try:
            await asyncio.wait({notice, drained}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            drained.cancel()
            notice.cancel()
        woken = watch.woken
        if woken and self.available() <= 0:
            self._claims.pass_on(keys)
        return woken

    async def _push_tasks(self, tasks: list[Task]) -> None:
        try:
            await self._send(tasks)
        except BaseException:
            # Not seen by the worker: back to READY at once, no attempt used.
            self._claims.give_back(self.namespace, tasks)
            raise
        self.pushed += len(tasks)

    async def _send(self, tasks: list[Task]) -> None:
        tracing.claimed(tasks, self.worker_id)  # no-op unless tracing is on
        await self._write(worker_pb2.WorkResponse(tasks=await converted(tasks, convert.task_to_pb)))

    async def _write(self, response: worker_pb2.WorkResponse) -> None:
        async with self._writing:
            await self._write_raw(response)


async def first_of(requests: AsyncIterator[Any]) -> Any:
    """The first message of a stream, or None when the worker closed it at once."""
    with contextlib.suppress(StopAsyncIteration):
        return await anext(requests)
    return None
