"""The chaos workload: timed tasks submitted through the gRPC client while faults happen.

``plan_tasks`` (pure, seeded) decides every task up front: when it is submitted, its run_at,
what its handler does (succeed, fail a few attempts, exhaust its attempts, fail fatally, run
long enough to be caught mid-task) and whether it gets cancelled. ``Submitter`` plays the
plan: a batch every ``BATCH_EVERY`` seconds, round-robin over the nodes, and on UNAVAILABLE
(or a timeout) the same batch again, same idempotency keys, on the next node, so an ambiguous
submit is safe to retry. What each call was told is recorded with timestamps.
"""

from __future__ import annotations

import asyncio
import json
import random
import time
from collections.abc import Coroutine, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

import grpc

from chronoq import errors
from chronoq.api.v1 import tasks_pb2, tasks_pb2_grpc
from chronoq.chaos.history import (
    ACCEPTED,
    AMBIGUOUS,
    CANCELLED,
    REFUSED,
    REJECTED,
    CancelRecord,
    SubmitRecord,
)
from chronoq.chaos.ledger import now_us
from chronoq.chaos.worker import QUEUE
from chronoq.client import Client, NewTask
from chronoq.client.pacing import pacer
from chronoq.models import DEFAULT_NAMESPACE

BATCH_EVERY = 0.2  # seconds between submit batches
SUBMIT_TRIES = 8  # calls per batch (over all nodes) before it is recorded ambiguous
LEASE_TIMEOUT = timedelta(seconds=4)
BACKOFF_INITIAL = timedelta(milliseconds=500)
BACKOFF_MAX = timedelta(seconds=2)

# Answers that mean "not done"; anything else (UNAVAILABLE, a timeout, INTERNAL) may hide
# a commit whose reply was lost.
DEFINITE = (errors.BadRequest, errors.NotFound, errors.AccessDenied, errors.ResourceExhausted)

# kind → share of the tasks; see ``_spec``.
MIX: dict[str, float] = {
    "plain": 0.60, "long": 0.08, "retry": 0.10, "exhaust": 0.04, "fatal": 0.04,
    "cancel": 0.07, "immediate": 0.07,
}


@dataclass(frozen=True)
class TaskPlan:
    key: str
    kind: str
    submit_at: float  # seconds from the start of the run
    run_at: float  # seconds from the start of the run
    payload: dict[str, object]
    max_attempts: int
    expect: str  # succeeded, dead or cancelled
    cancel_at: float | None = None


def plan_tasks(
    seed: int, duration: float, rate: float, *, lead: tuple[float, float] = (1.0, 12.0)
) -> list[TaskPlan]:
    """Every task of a run, in submit order: ``rate`` per second over ``duration`` seconds.

    Submits stop a little before the end and (cancelled ones aside) no run_at lies past
    ``duration``, so the run's faults act on tasks that are pending, firing and running.
    """
    rng = random.Random(seed)
    kinds, weights = zip(*MIX.items(), strict=True)
    last_submit = max(1.0, duration - lead[0] - 1.0)
    count = int(last_submit * rate)
    plans = []
    for i in range(count):
        submit_at = last_submit * i / max(1, count)
        kind = rng.choices(kinds, weights)[0]
        room = max(lead[0], min(lead[1], duration - submit_at))  # no run_at past the end
        delay = 0.0 if kind == "immediate" else rng.uniform(lead[0], room)
        if kind == "cancel":
            delay = max(delay, 3.0)
        run_at = submit_at + delay
        payload, max_attempts, expect = _spec(kind, rng)
        cancel_at = (submit_at + run_at) / 2 if kind == "cancel" else None
        plans.append(
            TaskPlan(f"s{seed}-{i:06d}", kind, submit_at, run_at, payload, max_attempts,
                     expect, cancel_at)
        )
    return plans


def _spec(kind: str, rng: random.Random) -> tuple[dict[str, object], int, str]:
    sleep_ms = rng.randint(10, 200)
    if kind == "long":
        return {"sleep_ms": rng.randint(1500, 3000)}, 3, "succeeded"
    if kind == "retry":
        return {"sleep_ms": sleep_ms, "fail_attempts": rng.choice([1, 1, 2])}, 4, "succeeded"
    if kind == "exhaust":
        return {"sleep_ms": sleep_ms, "fail_attempts": 99}, 2, "dead"
    if kind == "fatal":
        return {"sleep_ms": sleep_ms, "fatal": True}, 3, "dead"
    if kind == "cancel":
        return {"sleep_ms": sleep_ms}, 3, "cancelled"
    return {"sleep_ms": sleep_ms}, 3, "succeeded"


def new_task(plan: TaskPlan, t0: datetime) -> NewTask:
    return NewTask(
        queue=QUEUE,
        run_at=t0 + timedelta(seconds=plan.run_at),
        payload=json.dumps(plan.payload).encode(),
        idempotency_key=plan.key,
        max_attempts=plan.max_attempts,
        backoff_initial=BACKOFF_INITIAL,
        backoff_max=BACKOFF_MAX,
        lease_timeout=LEASE_TIMEOUT,
    )


class Submitter:
    """Plays a plan against the nodes at ``addresses``; fills ``submits`` and ``cancels``."""

    def __init__(
        self, addresses: Sequence[str], plans: Sequence[TaskPlan], *, timeout: float = 3.0,
        in_flight: int = 8,
    ) -> None:
        self.clients = [Client(a, timeout=timeout) for a in addresses]
        self.plans = list(plans)
        self.submits: list[SubmitRecord] = []
        self.cancels: list[CancelRecord] = []
        self._ids: dict[str, str] = {}
        self._next = 0
        self._slots = asyncio.Semaphore(in_flight)
        self._jobs: set[asyncio.Task[None]] = set()
        self._addresses = list(addresses)
        self._timeout = timeout
        self._probes = 0
        self._t0: datetime | None = None
        self._channels: dict[str, grpc.aio.Channel] = {}

    def _client(self) -> Client:
        self._next += 1
        return self.clients[self._next % len(self.clients)]

    async def run(self, t0: datetime) -> None:
        """Submit every batch on time, and cancel the tasks planned to be cancelled.

        The plan fixes what is submitted and when each task runs (so a seed replays the same
        tasks); a throttle paces the batches, each taking what the plan has due by then.
        """
        self._t0 = t0
        start = time.monotonic() - (datetime.now(UTC) - t0).total_seconds()
        batch: list[TaskPlan] = []
        cancels = sorted((p for p in self.plans if p.cancel_at is not None),
                         key=lambda p: p.cancel_at or 0.0)
        pending = iter(self.plans)
        nxt = next(pending, None)
        batches = pacer(1 / BATCH_EVERY)
        while nxt is not None or cancels:
            await batches.wait()
            due = time.monotonic() - start
            while nxt is not None and nxt.submit_at <= due:
                batch.append(nxt)
                nxt = next(pending, None)
            if batch:
                await self._spawn(self._submit(batch, t0))
                batch = []
            while cancels and (cancels[0].cancel_at or 0.0) <= due:
                await self._spawn(self._cancel(cancels.pop(0)))
        await self.drain()

    async def _spawn(self, coro: Coroutine[Any, Any, None]) -> None:
        await self._slots.acquire()
        job = asyncio.create_task(coro)
        self._jobs.add(job)
        job.add_done_callback(self._done)

    def _done(self, job: asyncio.Task[None]) -> None:
        self._jobs.discard(job)
        self._slots.release()

    async def drain(self) -> None:
        while self._jobs:
            await asyncio.gather(*self._jobs, return_exceptions=True)

    async def _submit(self, batch: list[TaskPlan], t0: datetime) -> None:
        sent = now_us()
        tasks = [new_task(p, t0) for p in batch]
        outcome, error, ids, calls = AMBIGUOUS, "", [], 0
        for calls in range(1, SUBMIT_TRIES + 1):
            try:
                ids = [i for i, _created in await self._client().submit_ids(tasks)]
                outcome = ACCEPTED
                break
            except DEFINITE as exc:  # a definite answer: not stored
                outcome, error = REJECTED, exc.message
                break
            except errors.RemoteError as exc:  # UNAVAILABLE, timeout, INTERNAL: maybe
                error = exc.message  # committed, so retry with the same keys
                await asyncio.sleep(min(2.0, 0.1 * 2**calls))
        answered = now_us()
        for i, p in enumerate(batch):
            task_id = ids[i] if outcome == ACCEPTED else None
            if task_id is not None:
                self._ids[p.key] = task_id
            self.submits.append(
                SubmitRecord(p.key, p.kind, _us(t0, p.run_at), p.expect, outcome, task_id,
                             sent, answered, calls, error)
            )

    async def probe(self) -> tuple[str, str]:
        """One task, one ``SubmitBatch`` call to one node, no retry: what that node answers
        (the code's name and its message), where the SDK would ride an outage out. The probe
        is recorded like every submit, so the checker holds it to the same rules."""
        t0 = self._t0 or datetime.now(UTC)
        self._probes += 1
        address = self._addresses[self._probes % len(self._addresses)]
        at = (datetime.now(UTC) - t0).total_seconds()
        plan = TaskPlan(f"probe-{self._probes:05d}", "plain", at, at + 1.0, {"sleep_ms": 10}, 3,
                        "succeeded")
        channel = self._channels.get(address)
        if channel is None:
            channel = self._channels[address] = grpc.aio.insecure_channel(address)
        stub = tasks_pb2_grpc.TaskServiceStub(channel)  # type: ignore[no-untyped-call]
        req = tasks_pb2.SubmitBatchRequest(tasks=[new_task(plan, t0).to_pb(DEFAULT_NAMESPACE)],
                                           ids_only=True)
        sent = now_us()
        code, message, outcome, task_id = "OK", "", ACCEPTED, None
        try:
            resp = await stub.SubmitBatch(req, timeout=self._timeout)
            task_id = resp.ids[0]
            self._ids[plan.key] = task_id
        except grpc.aio.AioRpcError as exc:
            code, message = exc.code().name, exc.details() or ""
            definite = exc.code() in (grpc.StatusCode.INVALID_ARGUMENT,
                                      grpc.StatusCode.RESOURCE_EXHAUSTED)
            outcome = REJECTED if definite else AMBIGUOUS
        self.submits.append(SubmitRecord(plan.key, plan.kind, _us(t0, plan.run_at), plan.expect,
                                         outcome, task_id, sent, now_us(), 1, message))
        return code, message

    async def _cancel(self, plan: TaskPlan) -> None:
        task_id = self._ids.get(plan.key)
        if task_id is None:
            return  # never accepted (or not yet answered): nothing to cancel
        sent = now_us()
        outcome, error = AMBIGUOUS, ""
        for attempt in range(3):
            try:
                await self._client().cancel(task_id)
                outcome = CANCELLED
                break
            except errors.PreconditionFailed as exc:
                # After an unanswered try, "not cancellable" may mean "we cancelled it".
                outcome, error = (REFUSED if attempt == 0 else AMBIGUOUS), exc.message
                break
            except errors.RemoteError as exc:
                error = exc.message
                await asyncio.sleep(0.2 * (attempt + 1))
        self.cancels.append(CancelRecord(plan.key, task_id, sent, now_us(), outcome, error))

    async def close(self) -> None:
        await self.drain()
        for c in self.clients:
            await c.close()
        for ch in self._channels.values():
            await ch.close()


def _us(t0: datetime, offset: float) -> int:
    return round((t0.timestamp() + offset) * 1_000_000)
