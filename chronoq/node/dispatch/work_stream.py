"""The streaming worker protocol on a node: tasks pushed within credits, acks streamed.

One ``Work`` call serves one worker for as long as it runs. The worker opens it with its
queues and grants *credits* (the slots it has free); the node keeps one long-poll open for
the stream whenever it has credits and pushes each claim at once, so a task that becomes
ready reaches a waiting worker after one claim statement and one message, with no request
in between. Acks come on the same stream, each batch answered with its ``ack_seq``; freed
slots come back as credits, usually in the same message as their acks.

A stream holds one of its namespace's long-poll slots while it is open (streams are capped
like long-polls), and before that, from its first byte, one of the node's slots for streams
not opened yet (``Openings``): it must send its open message within
``STREAM_OPEN_DEADLINE``. What a stream owns when it ends: tasks already pushed stay leased to
the worker, which may finish and ack them elsewhere (or let the leases expire); tasks claimed
for it but not written are released at once, without using an attempt.

Credits count tasks; bytes are bounded too. A stream holds at most ``STREAM_BYTES`` of tasks
claimed or handed off for it and not yet written (claims and hand-offs stop at its room, one
task always), and every write has ``STREAM_WRITE_DEADLINE``: a worker that does not read
(its transport's flow control blocks the write) has its stream closed, and what was not
delivered goes back to READY at once, no attempt used.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
from collections import Counter
from collections.abc import AsyncIterator, Callable
from datetime import timedelta
from typing import Any, Protocol

from chronoq import tracing
from chronoq.api import convert
from chronoq.api.v1 import worker_pb2
from chronoq.clock import Clock
from chronoq.errors import InvalidArgument, StreamNotOpened, StreamStalled, TooManyOpenings
from chronoq.limits import (
    MAX_ANSWER_BYTES,
    MAX_CLAIM_TASKS,
    MAX_LEASES_PER_CALL,
    MAX_QUEUES_PER_CLAIM,
    MAX_STREAM_CREDITS,
    MAX_WORKER_ID,
    STREAM_OPEN_DEADLINE,
    STREAM_WRITE_DEADLINE,
    check_count,
    check_name,
    check_text,
    task_bytes,
)
from chronoq.models import AckOutcome, Task
from chronoq.node.dispatch.claims import Caller, Claims
from chronoq.node.dispatch.handoff import HandOff
from chronoq.node.dispatch.readiness import Watch
from chronoq.store.port import ByTaskId
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
#: Bytes of tasks a stream holds claimed or handed off but not written yet: the answer budget.
STREAM_BYTES = MAX_ANSWER_BYTES
#: Streams of a node that have not sent their open message yet (each at most
#: ``STREAM_OPEN_DEADLINE``); beyond it a new stream is refused with RESOURCE_EXHAUSTED.
MAX_OPENING_STREAMS = 256
#: Of those, the streams of one caller (one token, where the node requires tokens): one
#: tenant cannot keep another's workers from opening theirs.
MAX_OPENING_PER_CALLER = 32

Write = Callable[[worker_pb2.WorkResponse], Any]


class StreamCaller(Caller, Protocol):
    """What a stream needs of its call (a gRPC servicer context fits): when it ends."""

    def done(self) -> bool: ...

    def add_done_callback(self, callback: Any, /) -> None: ...  # called with the call


class Openings:
    """The node's streams that have not sent their first message yet: at most ``cap`` at once
    (``per_key`` of one caller, e.g. one token), each for at most ``deadline`` seconds,
    counted from the stream's first byte, before its namespace is known."""

    cap = MAX_OPENING_STREAMS
    per_key = MAX_OPENING_PER_CALLER
    deadline = STREAM_OPEN_DEADLINE

    def __init__(self) -> None:
        self.open: Counter[str] = Counter()
        self.total = 0
        self.refused = 0  # streams refused over a cap
        self.expired = 0  # streams closed for not opening in time

    async def first(self, requests: AsyncIterator[Any], key: str | None = None) -> Any:
        """The first message of ``requests`` (None when the caller closed at once), within
        the deadline and the caps (``per_key`` for a caller ``key``, none without one):
        ``TooManyOpenings`` or ``StreamNotOpened`` otherwise. A stream that opened here
        already (``Opened``, from the auth interceptor) is neither counted nor timed again."""
        if isinstance(requests, Opened):
            return await first_of(requests)
        if self.total >= self.cap:
            self.refused += 1
            raise TooManyOpenings(self.cap, "node")
        key = "" if key is None else f"caller:{key}"
        if key and self.open[key] >= self.per_key:
            self.refused += 1
            raise TooManyOpenings(self.per_key, "caller")
        self.open[key] += 1
        self.total += 1
        try:
            async with asyncio.timeout(self.deadline):
                return await first_of(requests)
        except TimeoutError:
            self.expired += 1
            raise StreamNotOpened(self.deadline) from None
        finally:
            self.total -= 1
            self.open[key] -= 1
            if not self.open[key]:
                del self.open[key]


class Opened:
    """A stream whose first message was taken within the node's ``Openings``, replayed with
    the rest: what the auth interceptor hands the servicer after checking that message."""

    def __init__(self, first: Any, rest: AsyncIterator[Any]) -> None:
        self._first = first
        self._rest = rest

    def __aiter__(self) -> Opened:
        return self

    async def __anext__(self) -> Any:
        if self._first is not None:
            first, self._first = self._first, None
            return first
        return await anext(self._rest)


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
        store: ByTaskId,
        clock: Clock,
        caller: StreamCaller,
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
        self.unwritten = 0  # bytes of tasks claimed or handed off for us, not written yet
        self.held_bytes = 0  # bytes a claim or a hand-off in flight may fill
        self.unwritten_tasks = 0  # tasks of ``unwritten``
        self._stalled: StreamStalled | None = None  # a write passed its deadline
        self._stalled_write: asyncio.Future[Any] | None = None  # that write, still pending
        # The tasks of a message that was written when the stream was cancelled (the cancel
        # came between the write and its waiter): delivered, so not given back.
        self._written_on_cancel: list[Task] | None = None
        self._cancelled_after_write = False  # the last write's waiter was cancelled after it
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
        self._claims.slots.take(self.namespace)
        try:
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
        finally:
            if not self._slot_kept():
                self._claims.slots.give(self.namespace)

    def _slot_kept(self) -> bool:
        """After a stalled write, keep the stream's slot until the transport ends the call.

        The call ends at once (its status queues behind the stalled message, which the worker
        still gets if it reads), but that message stays in the transport until the worker
        reads it or leaves: the slot stays held meanwhile, so stalled streams count against
        the caps while they hold memory, without the session waiting on the write."""
        write = self._stalled_write
        if write is None:
            return False
        write.cancel()  # only our waiter: the transport keeps the message and its order
        if self._caller.done():
            return False
        namespace = self.namespace
        self._caller.add_done_callback(lambda _call: self._claims.slots.give(namespace))
        return True

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
        """Credits neither pushed nor held by a claim or hand-off in flight; none while the
        stream holds its byte budget unwritten (its worker reads slowly, or not at all)."""
        if self._closed or self.unwritten >= STREAM_BYTES:
            return 0
        return self.credits - self.held

    def room(self) -> int:
        """Bytes a claim or hand-off may still fill (one task goes even at none)."""
        return max(0, STREAM_BYTES - self.unwritten - self.held_bytes)

    def reserve(self, n: int, most: int | None = None) -> int:
        """Hold ``n`` credits and the free bytes (at most ``most``) for a hand-off (settled
        by ``deliver``); returns the bytes held."""
        room = self.room() if most is None else min(self.room(), most)
        self.held += n
        self.held_bytes += room
        if self.available() <= 0:
            self._drained.set()  # the pusher stops waiting for notices it could not act on
        return room

    def deliver(self, tasks: list[Task], reserved: int, reserved_bytes: int) -> None:
        """A hand-off is settled: push ``tasks`` (leased to this worker by the fire
        statement) and free the ``reserved`` credits and bytes they did not use."""
        self.held -= reserved
        self.held_bytes -= reserved_bytes
        if reserved > len(tasks):
            self._credited.set()
        if not tasks:
            return
        self.credits -= len(tasks)
        if self._closed:
            self._claims.give_back(self.namespace, tasks)
            return
        size = self._hold(tasks)
        job = asyncio.get_running_loop().create_task(
            self._send(tasks, size), name="chronoq-work-handoff"
        )
        self._deliveries.add(job)
        job.add_done_callback(functools.partial(self._delivered, tasks))

    def _delivered(self, tasks: list[Task], job: asyncio.Task[None]) -> None:
        """A hand-off's push ended: counted, or (failed, or cancelled even before it began)
        its tasks go back to READY at once, no attempt used."""
        self._deliveries.discard(job)
        if (job.cancelled() or job.exception() is not None) and not self._written(tasks):
            self._claims.give_back(self.namespace, tasks)
        else:
            self.pushed += len(tasks)

    def _written(self, tasks: list[Task]) -> bool:
        """Whether ``tasks`` reached the worker's transport although their push was
        cancelled: they stay leased to the worker, like any pushed task."""
        return self._written_on_cancel is tasks

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
                free = self.available()
                n = claim_size(free, more=more, last=last, handoff=self._handing_off())
                # The claim's share of the free bytes is its share of the free credits: what
                # it leaves to the hand-off, it leaves in both.
                room = self.room() if n >= free else self.room() * n // max(1, free)
                self.held += n
                self.held_bytes += room
                try:
                    tasks = await self._claims.claim_once(
                        self._caller,
                        self.namespace,
                        self.queues,
                        self.worker_id,
                        n,
                        unless_quiet=not more,
                        max_bytes=max(1, room),
                    )
                finally:
                    self.held -= n
                    self.held_bytes -= room
                last = len(tasks)
                if not tasks:
                    more = await self._wait(watch, keys)
                    continue
            # Full, or cut at its bytes (another task like these would not have fitted).
            size = sum(task_bytes(t) for t in tasks)
            more = len(tasks) == n or size + size // len(tasks) > room
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
        size = self._hold(tasks)
        try:
            await self._send(tasks, size)
        except BaseException:
            if self._written(tasks):
                self.pushed += len(tasks)
            else:  # not seen by the worker: back to READY at once, no attempt used
                self._claims.give_back(self.namespace, tasks)
            raise
        self.pushed += len(tasks)

    def _hold(self, tasks: list[Task]) -> int:
        """Count ``tasks`` as held for this stream, unwritten; returns their bytes."""
        size = sum(task_bytes(t) for t in tasks)
        self.unwritten += size
        self.unwritten_tasks += len(tasks)
        return size

    async def _send(self, tasks: list[Task], size: int) -> None:
        """Push ``tasks`` (``size`` bytes of ``unwritten``, freed once written or failed)."""
        try:
            tracing.claimed(tasks, self.worker_id)  # no-op unless tracing is on
            pushed = await converted(tasks, convert.task_to_pb)
            await self._write(worker_pb2.WorkResponse(tasks=pushed))
        except asyncio.CancelledError:
            if self._cancelled_after_write:
                self._written_on_cancel = tasks
            raise
        finally:
            self.unwritten -= size
            self.unwritten_tasks -= len(tasks)
            self._credited.set()  # room again: the pusher may claim

    async def _write(self, response: worker_pb2.WorkResponse) -> None:
        """One message to the worker, taken within ``STREAM_WRITE_DEADLINE`` once it is this
        message's turn; past it the stream ends (``StreamStalled``): what was not delivered
        is given back by the callers, this message's tasks included (if the worker reads it
        later, their leases are stale)."""
        async with self._writing:
            if self._stalled is not None:
                raise self._stalled  # an earlier write timed out: the stream is ending
            write = asyncio.ensure_future(self._write_raw(response))
            self._cancelled_after_write = False
            try:
                await asyncio.wait({write}, timeout=STREAM_WRITE_DEADLINE)
            except asyncio.CancelledError:
                self._cancelled_after_write = (
                    write.done() and not write.cancelled() and write.exception() is None
                )
                raise
            if write.done():
                write.result()
                return
            self._stalled_write = write
            self._stalled = StreamStalled(STREAM_WRITE_DEADLINE, self._undelivered())
            log.info("worker stream of %s stalled: %s", self.worker_id, self._stalled.message)
            if not self._failed.done():
                self._failed.set_exception(self._stalled)
            raise self._stalled

    def _undelivered(self) -> int:
        """Tasks claimed or handed off for this stream and not written (given back)."""
        return self.unwritten_tasks


async def first_of(requests: AsyncIterator[Any]) -> Any:
    """The first message of a stream, or None when the worker closed it at once."""
    with contextlib.suppress(StopAsyncIteration):
        return await anext(requests)
    return None
