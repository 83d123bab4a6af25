"""The worker SDK: run handlers by queue, heartbeat for them, stop gracefully.

A worker runs at most ``concurrency`` tasks at a time (and holds up to ``prefetch`` more,
leased and ready to start, while its handlers are quick), runs each task's handler, renews
leases in one batched heartbeat, acknowledges successes in batches and reports failures with
the exception text. Tasks come over one stream to one node (``WorkerService.Work``): the
worker grants the slots it has free, the node pushes tasks into them as they become ready,
and acks go up the same stream with the slots they free. A stream that ends is opened again,
on another node while that one is suspect; a node without streams gets the previous
protocol: a long-polling claim loop, with the claim for the slots an ack batch frees riding
on that batch. Heartbeats, failures and releases are separate calls, each with its own
deadline, so none waits behind a call stuck on a frozen node. An ack that fails is retried
(completes are safe to repeat: the same lease token gets the same answer) until shortly
before its lease would expire, and only then given up with a log line: the task then runs
again, as at-least-once allows. On ``stop()`` (SIGINT/SIGTERM with
``install_signal_handlers``) it stops taking tasks, lets in-flight handlers finish within
``stop_grace`` and releases the rest (and whatever was pushed meanwhile), so no task waits
for a lease to expire.

Every loop beside the handlers is supervised (``chronoq.supervision``, as in a node): an
unexpected error in the heartbeats or the ack flusher is logged with its traceback and the
loop runs again after a backoff; a failed ack batch is sent again like one the node did not
answer; a push the stream's reader cannot take ends that stream with the reason, and the
worker opens another; taking tasks starts again after an unexpected error, and only a refusal
by the node (a bad token, a namespace it may not reach) ends ``run()``, raised. A loop that
keeps failing shows in ``problems()``.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import logging
import os
import socket
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from chronoq import errors, tracing
from chronoq.client.acks import ACK_RETRY_INITIAL, Ack, AckBatches
from chronoq.client.client import Client
from chronoq.client.context import FatalTaskError, Handler, TaskContext
from chronoq.client.outage import Outage
from chronoq.client.pacing import pacer
from chronoq.client.prefetch import HandlerPace, prefetch_limit
from chronoq.client.stream import WorkStream
from chronoq.client.worker_stats import WorkerStats
from chronoq.limits import MAX_STREAM_CREDITS
from chronoq.models import AckOutcome, Lease, Task
from chronoq.signals import on_stop_signals
from chronoq.supervision import Loop, Supervisor, retry_delay

__all__ = ["Worker", "WorkerStats"]

log = logging.getLogger("chronoq.worker")

#: Pause between claims that keep failing (the first retry goes at once, to another node).
CLAIM_RETRY_DELAY = 0.5
#: Seconds between looks for leases due a heartbeat (each is renewed at a third of its lease).
HEARTBEAT_POLL = 0.25
#: Longest pause before taking tasks again after an unexpected error.
WORK_RETRY_MAX = 5.0


@dataclass
class _Running:
    ctx: TaskContext
    job: asyncio.Task[None]
    lease: Lease
    lease_timeout: float
    last_beat: float  # loop time the last heartbeat that renewed the lease was sent
    started: bool = False  # False: held (prefetched), waiting for a free slot

    @property
    def lease_deadline(self) -> float:
        """Loop time by which the node may consider the lease expired."""
        return self.last_beat + self.lease_timeout


class Worker:
    """Runs ``handlers`` (queue → callable) against one node.

    ``rates`` (queue → handler starts per second in this process) paces queues whose
    downstream has a limit, e.g. ``Worker(client, handlers, rates={"emails": 50})``.
    ``stream`` (default on) uses the streaming protocol: one ``Work`` call to one node that
    pushes tasks as they become ready, within the slots the worker has said are free, and
    answers acks on the same call. Off, or against a node that does not know it, the worker
    long-polls with ``Claim``; then ``claim_on_ack`` (default on) lets each ack batch claim
    the slots it frees (see the module's docstring). ``prefetch`` (default: 4 x
    ``concurrency``) is the most tasks held leased beyond the running ones, so that a freed
    slot starts the next task without waiting for a round trip; only as many are held as the
    slots start within 20 ms at the handlers' recent pace (``chronoq.client.prefetch``), so
    slow handlers get none. Held tasks are heartbeated like running ones and released at stop.
    """

    def __init__(
        self,
        client: Client,
        handlers: Mapping[str, Handler],
        *,
        concurrency: int = 10,
        worker_id: str | None = None,
        claim_wait: timedelta = timedelta(seconds=1),
        stop_grace: timedelta = timedelta(seconds=10),
        ack_batch: int = 200,
        ack_delay: timedelta = timedelta(milliseconds=2),
        rates: Mapping[str, float] | None = None,
        claim_on_ack: bool = True,
        stream: bool = True,
        prefetch: int | None = None,
    ) -> None:
        if not handlers:
            raise errors.ConfigError("a worker needs at least one handler")
        if concurrency < 1:
            raise errors.ConfigError("concurrency must be >= 1")
        if prefetch is not None and prefetch < 0:
            raise errors.ConfigError("prefetch must be >= 0 (0: hold nothing beyond running)")
        unknown = sorted(set(rates or {}) - set(handlers))
        if unknown:
            raise errors.ConfigError(f"rates name queues without a handler: {', '.join(unknown)}")
        self.client = client
        self.handlers = dict(handlers)
        # Handler starts per second per process, per queue: a claimed task waits for its turn
        # (its lease is heartbeated meanwhile), so a slow downstream sees at most this rate.
        self._pacers = {queue: pacer(rate) for queue, rate in (rates or {}).items()}
        self.concurrency = concurrency
        self.prefetch = 4 * concurrency if prefetch is None else prefetch
        self._slots = asyncio.Semaphore(concurrency)  # handlers running at once
        self._pace = HandlerPace()
        self.worker_id = worker_id or f"{socket.gethostname()}-{os.getpid()}"
        self.claim_wait = claim_wait
        self.stop_grace = stop_grace.total_seconds()
        self.ack_delay = ack_delay.total_seconds()
        self.stats = WorkerStats()
        self._running: dict[str, _Running] = {}
        self._stopping = asyncio.Event()
        self._slot_free = asyncio.Event()
        self._acks = AckBatches(
            self.stats, self._complete, self._batch_claim, batch=ack_batch, delay=self.ack_delay
        )
        self.claim_on_ack = claim_on_ack
        self.stream = stream
        self._stream: WorkStream | None = None
        self._granted = 0  # credits the open stream's node holds (granted, not yet pushed)
        self._stream_outage = Outage("work stream", log)
        self._unwanted: list[Task] = []  # pushed while stopping: released after the stream
        self._reserved = 0  # slots promised to claims in flight (running + reserved <= cap)
        self._riding = 0  # ack batches in flight that carry a claim
        self._claim_outage = Outage("claims", log)
        self._heartbeat_outage = Outage("heartbeats", log)
        self._supervisor = Supervisor()

    def stop(self) -> None:
        """Ask the worker to stop: no new claims; in-flight tasks finish or are released."""
        self._stopping.set()
        self._slot_free.set()

    def problems(self) -> list[str]:
        """Why the worker's background loops are unhealthy (empty when they are fine)."""
        return self._supervisor.problems()

    def install_signal_handlers(self) -> None:
        """Stop on SIGINT and SIGTERM (call inside the running loop)."""
        on_stop_signals(self.stop)

    async def run(self) -> WorkerStats:
        """Work until ``stop()``; returns the counts of what happened."""
        beats = self._supervisor.every(
            "worker-heartbeats", self._heartbeat_pass, interval=HEARTBEAT_POLL
        )
        acks: Loop = self._supervisor.every(
            "worker-acks", self._acks.gather, interval=0, retry=ACK_RETRY_INITIAL
        )
        try:
            await self._work()
            await self._drain()
        finally:
            await self._supervisor.stop([beats])
            await self._acks.join()  # every ack landed, was refused or was given up
            await self._supervisor.stop([acks])
            await self._acks.cancel_senders()
        return self.stats

    async def _work(self) -> None:
        """Take tasks (streams, else claims) until stopped. An unexpected error is logged
        with its traceback and taking starts again after a backoff; a ``ChronoqError`` (the
        node refused: a bad token, a namespace out of reach) ends the worker, raised."""
        failures = 0
        while not self._stopping.is_set():
            try:
                if self.stream:
                    await self._stream_loop()
                if not self._stopping.is_set():
                    await self._claim_loop()
                return
            except errors.ChronoqError:
                raise
            except Exception as exc:  # a bug must not end the worker unseen
                failures += 1
                delay = retry_delay(failures, CLAIM_RETRY_DELAY, WORK_RETRY_MAX)
                if failures == 1:
                    log.error("taking tasks failed, again in %.1f s: %r", delay, exc, exc_info=exc)
                else:
                    log.error("taking tasks failed again (%d in a row): %r", failures, exc)
                await _sleep_unless(self._stopping, delay)

    def _free(self) -> int:
        """Room for more tasks: slots, plus what may be held beyond them at the handlers'
        pace, less what runs or is held and what claims in flight were promised."""
        held = prefetch_limit(self.prefetch, self.concurrency, self._pace.mean)
        return self.concurrency + held - len(self._running) - self._reserved

    def _grantable(self) -> int:
        """Slots free for the stream to fill: not running, not granted, not being claimed
        (and never past what a node lets a stream hold)."""
        return max(0, min(self._free(), MAX_STREAM_CREDITS) - self._granted)

    async def _stream_loop(self) -> None:
        """Work over one stream at a time until stopped; returns early (the claim loop takes
        over) only when the node does not know the streaming protocol."""
        queues = list(self.handlers)
        while not self._stopping.is_set():
            self._granted = self._grantable()
            try:
                stream = await self.client.open_work(
                    queues, worker_id=self.worker_id, credits=self._granted, on_tasks=self._pushed
                )
            except errors.Unavailable as exc:
                self._granted = 0
                if self._stream_outage.failures:
                    await _sleep_unless(self._stopping, CLAIM_RETRY_DELAY)
                self._stream_outage.failed(exc)
                continue
            self._stream = stream
            try:
                await self._feed(stream)
            finally:
                self._stream = None
                await stream.close()
                self._granted = 0
            await self._release_stopped()
            why = stream.ended.result()
            if why is None:
                self._stream_outage.ended()
                continue
            if why.code == "UNIMPLEMENTED":
                log.info("%s does not serve work streams: long-polling claims", stream.address)
                self.stream = False
                return
            if isinstance(why, errors.BadRequest):
                log.error("%s refused the work stream (claims instead): %s", stream.address, why)
                self.stream = False
                return
            self.client.stream_failed(stream)
            if self._stream_outage.failures:
                await _sleep_unless(self._stopping, CLAIM_RETRY_DELAY)
            self._stream_outage.failed(why)

    async def _feed(self, stream: WorkStream) -> None:
        """Grant the stream each slot that frees, until stopping or the stream ends. Credits
        wait ``ack_delay`` first: most then ride on the ack batch of the tasks that freed
        them, in the same message."""
        while not self._stopping.is_set() and stream.open:
            # Cleared before the count: a slot freed from here on wakes the wait below.
            self._slot_free.clear()
            credits = self._grantable()
            if credits:
                self._granted += credits
                try:
                    await stream.grant(credits)
                except errors.Unavailable:
                    return  # the stream ended: the loop opens another
            freed: asyncio.Future[Any] = asyncio.ensure_future(self._slot_free.wait())
            waits: set[asyncio.Future[Any]] = {freed, stream.ended}
            try:
                await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
            finally:
                freed.cancel()
            if self.ack_delay and not self._stopping.is_set():
                await asyncio.sleep(self.ack_delay)

    async def _pushed(self, tasks: list[Task]) -> None:
        """Tasks the node pushed: started, or (stopping) kept to be released once the stream
        is closed, so the stream's reader never waits on a release."""
        self._granted = max(0, self._granted - len(tasks))
        self._stream_outage.ended()
        if self._stopping.is_set():
            self.stats.claimed += len(tasks)
            self._unwanted.extend(tasks)
            return
        await self._take(tasks)

    async def _release_stopped(self) -> None:
        """Release, all at once, what was pushed while stopping."""
        tasks, self._unwanted = self._unwanted, []
        if tasks:
            await asyncio.shield(asyncio.gather(*(self._release(t) for t in tasks)))

    def _ack_will_claim(self) -> bool:
        """An ack batch is about to claim (or is claiming) for the free slots."""
        return self.claim_on_ack and (self._riding > 0 or self._acks.waiting())

    async def _claim_loop(self) -> None:
        queues = list(self.handlers)
        while not self._stopping.is_set():
            free = self._free()
            if free <= 0 or self._ack_will_claim():
                self._slot_free.clear()
                await self._slot_free.wait()
                continue
            self._reserved += free
            try:
                tasks = await self.client.claim(
                    queues, worker_id=self.worker_id, max_tasks=free, wait=self.claim_wait
                )
            except errors.Unavailable as exc:
                # The client now passes the failed node over: try the next one at once, and
                # pause only while claims keep failing.
                if self._claim_outage.failures:
                    await _sleep_unless(self._stopping, CLAIM_RETRY_DELAY)
                self._claim_outage.failed(exc)
                continue
            finally:
                self._reserved -= free
            self._claim_outage.ended()
            await self._take(tasks)

    async def _take(self, tasks: list[Task]) -> None:
        """Start claimed tasks, or give them back when stopping."""
        for task in tasks:
            self.stats.claimed += 1
            if self._stopping.is_set():
                await self._release(task)
            else:
                self._start(task)

    def _start(self, task: Task) -> None:
        ctx = TaskContext(task=task, worker_id=self.worker_id)
        job = asyncio.create_task(self._execute(ctx), name=f"chronoq-task-{task.id}")
        loop = asyncio.get_running_loop()
        self._running[task.id] = _Running(
            ctx, job, Lease(task.id, task.attempt), task.lease_timeout.total_seconds(), loop.time()
        )

    async def _execute(self, ctx: TaskContext) -> None:
        lease = Lease(ctx.id, ctx.attempt)
        ran = False
        try:
            async with self._slots:
                running = self._running.get(ctx.id)
                if running is not None:
                    running.started = True  # from here on, _drain waits for it
                if not self._stopping.is_set():
                    await self._handle(ctx)
                    ran = True
        except asyncio.CancelledError:
            # Cancelled by us: the task was cancelled, its lease was lost, or we are stopping
            # (in which case _drain releases it).
            self._finish(ctx.id)
            raise
        except Exception as exc:  # noqa: BLE001 - any handler error fails the task
            self._finish(ctx.id)
            await self._fail(lease, exc)
        else:
            if not ran:
                # Held until the worker was asked to stop: given back, not started.
                self._finish(ctx.id)
                await self._release(ctx.task)
                return
            running = self._running.get(ctx.id)
            deadline = (
                running.lease_deadline
                if running is not None
                else asyncio.get_running_loop().time() + ctx.task.lease_timeout.total_seconds()
            )
            self._finish(ctx.id)
            self.stats.succeeded += 1
            self._acks.add(lease, deadline)

    async def _handle(self, ctx: TaskContext) -> None:
        """Run the handler of a task that has its slot, timing the slot's use (a queue's
        pacing included) for the prefetch pace."""
        loop = asyncio.get_running_loop()
        began = loop.time()
        try:
            handler = tracing.traced_handler(self.handlers[ctx.queue], ctx.task)
            paced = self._pacers.get(ctx.queue)
            if paced is not None:
                await paced.wait()
            if inspect.iscoroutinefunction(handler):
                await handler(ctx)
            else:
                # A plain function may block: keep it off the event loop.
                result = await asyncio.to_thread(handler, ctx)
                if inspect.isawaitable(result):
                    await result
        finally:
            self._pace.add(loop.time() - began)

    def _finish(self, task_id: str) -> None:
        self._running.pop(task_id, None)
        self._slot_free.set()

    async def _fail(self, lease: Lease, exc: BaseException) -> None:
        self.stats.failed += 1
        message = f"{type(exc).__name__}: {exc}"
        try:
            await self.client.fail(lease, message, fatal=isinstance(exc, FatalTaskError))
        except errors.RemoteError as err:
            log.warning("could not report failure of %s: %s", lease.task_id, err)
        except Exception:  # the task runs again after its lease: say why
            log.exception("could not report failure of %s", lease.task_id)

    async def _release(self, task: Task) -> None:
        try:
            await self.client.release(Lease(task.id, task.attempt))
            self.stats.released += 1
        except errors.RemoteError as err:
            log.warning("could not release %s: %s", task.id, err)
        except Exception:  # the task runs again after its lease: say why
            log.exception("could not release %s", task.id)

    async def _heartbeat_pass(self) -> None:
        """Renew, in one call, the leases a third of the way to expiry; stop the handlers
        of tasks that were cancelled or whose lease is gone. Run by the supervisor, so an
        unexpected error is logged and the next pass comes after a backoff."""
        now = asyncio.get_running_loop().time()
        due = [r for r in self._running.values() if now - r.last_beat >= r.lease_timeout / 3]
        if not due:
            return
        try:
            outcomes = await self.client.heartbeat([r.lease for r in due])
        except errors.RemoteError as err:
            self._heartbeat_outage.failed(err)
            return
        self._heartbeat_outage.ended()
        for running, outcome in zip(due, outcomes, strict=True):
            running.last_beat = now
            if outcome.ok:
                continue
            # Cancelled, or the lease is gone (another worker may hold the task): stop.
            self.stats.lost += 1
            running.ctx.cancelled.set()
            running.job.cancel()
            log.info("task %s: stopping handler: %s", outcome.task_id, outcome.error)

    def _batch_claim(self) -> int:
        """How many tasks the next ack batch claims on its way (reserved here; 0: none)."""
        ask = 0
        if (
            self.claim_on_ack
            and not self.stream
            and not self._riding
            and not self._stopping.is_set()
        ):
            # One riding claim at a time: the slots freed meanwhile gather for the next
            # one instead of splitting the worker's capacity into small claims.
            ask = max(0, self._free())
        if ask:
            self._reserved += ask
            self._riding += 1
        else:
            self._slot_free.set()  # the claim loop was waiting for this batch
        return ask

    async def _complete(self, acks: list[Ack], ask: int) -> list[AckOutcome]:
        """One attempt at completing ``acks``, claiming ``ask`` more on the way if asked;
        the slots reserved for the claim are given back whatever happens."""
        leases = [a.lease for a in acks]
        stream = self._stream
        if stream is not None and stream.open:
            credits = 0 if self._stopping.is_set() else self._grantable()
            self._granted += credits
            return await stream.complete(leases, credits=credits, timeout=self.client.ack_timeout)
        if not ask:
            return await self.client.complete_many(leases)
        try:
            outcomes, tasks = await self.client.complete_and_claim(
                leases, list(self.handlers), worker_id=self.worker_id, max_tasks=ask
            )
            self.stats.claimed_on_ack += len(tasks)
            await self._take(tasks)
        finally:
            self._reserved -= ask
            self._riding -= 1
            self._slot_free.set()  # the claim loop takes over if the claim came back short
        return outcomes

    async def _drain(self) -> None:
        """Release the held tasks at once, give in-flight handlers ``stop_grace`` to finish,
        then release what is left."""
        held = [r for r in self._running.values() if not r.started]
        for r in held:
            r.job.cancel()
        await asyncio.gather(*(r.job for r in held), return_exceptions=True)
        await asyncio.gather(*(self._release(r.ctx.task) for r in held))
        jobs = [r.job for r in self._running.values()]
        if jobs:
            await asyncio.wait(jobs, timeout=self.stop_grace)
        leftovers = list(self._running.values())
        for r in leftovers:
            r.job.cancel()
        for r in leftovers:
            with contextlib.suppress(asyncio.CancelledError):
                await r.job
            await self._release(r.ctx.task)


async def _sleep_unless(event: asyncio.Event, seconds: float) -> None:
    with contextlib.suppress(TimeoutError):  # asyncio.timeout never swallows a cancel
        async with asyncio.timeout(seconds):
            await event.wait()
