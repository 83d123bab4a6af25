"""The submit's hand-off (pure parts): a due task of a quiet, unlimited queue takes one credit
and its bytes on a stream with room, streams take turns, and settling frees what the insert
did not use; anything else is submitted as usual."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta

import pytest

from chronoq.limits import TASK_FIXED_BYTES, task_bytes
from chronoq.models import SubmitOutcome, Task, TaskSpec, TaskState
from chronoq.node.dispatch.handoff import HandOff, Key
from chronoq.node.dispatch.readiness import ReadyNotifier
from chronoq.node.dispatch.submit_handoff import SubmitHandOff, spec_bytes

KEY: Key = ("default", "q")
NOW = datetime(2030, 1, 1, tzinfo=UTC)


class Taker:
    def __init__(self, worker_id: str, credits: int, room: int = 1 << 20) -> None:
        self.worker_id = worker_id
        self.credits = credits
        self.held = 0
        self.free_bytes = room
        self.delivered: list[Task] = []
        self.offers = 0

    def offered(self) -> None:
        self.offers += 1

    def available(self) -> int:
        return self.credits - self.held

    def room(self) -> int:
        return self.free_bytes

    def reserve(self, n: int, most: int | None = None) -> int:
        held = self.free_bytes if most is None else min(most, self.free_bytes)
        self.held += n
        self.free_bytes -= held
        return held

    def deliver(self, tasks: list[Task], reserved: int, reserved_bytes: int) -> None:
        self.held -= reserved
        self.free_bytes += reserved_bytes
        self.credits -= len(tasks)
        self.delivered += tasks


class NoStore:
    async def submit_leased(self, spec: TaskSpec, now: datetime, worker_id: str) -> None:
        raise AssertionError("not called in these tests")


def running(spec: TaskSpec, worker_id: str) -> Task:
    return Task(
        id="t1", namespace=spec.namespace, queue=spec.queue, state=TaskState.RUNNING,
        run_at=spec.run_at, partition=0, bucket=0, payload=spec.payload, worker_id=worker_id,
        fired_by="submit", idempotency_key=spec.idempotency_key,
    )  # fmt: skip


def test_the_bytes_of_a_spec_are_those_of_the_task_it_makes_less_the_worker() -> None:
    spec = TaskSpec(queue="q", run_at=NOW, payload=b"x" * 100, idempotency_key="key-1")
    assert spec_bytes(spec) + len(b"w-1") == task_bytes(running(spec, "w-1"))
    assert spec_bytes(TaskSpec(queue="q", run_at=NOW)) >= TASK_FIXED_BYTES


def test_take_holds_one_credit_and_the_tasks_bytes_and_streams_take_turns() -> None:
    handoff = HandOff(lambda: set())
    a, b = Taker("a", 1), Taker("b", 2)
    handoff.join(a, [KEY])
    handoff.join(b, [KEY])
    first = handoff.take(KEY, 300)
    assert first is not None and first.worker_id == "a"
    assert a.available() == 0 and a.room() == (1 << 20) - 301  # 300 + len("a")
    second = handoff.take(KEY, 300)
    assert second is not None and second.worker_id == "b"
    third = handoff.take(KEY, 300)
    assert third is not None and third.worker_id == "b"  # a has no credit left
    assert handoff.take(KEY, 300) is None
    assert first.settle(None) is False  # the insert leased nothing: all given back
    assert a.available() == 1 and a.room() == 1 << 20 and a.delivered == []
    spec = TaskSpec(queue="q", run_at=NOW)
    assert second.settle(running(spec, "b")) is True
    assert second.settle(running(spec, "b")) is False  # once only
    assert len(b.delivered) == 1 and b.credits == 1


def test_take_never_for_a_limited_queue_unknown_limits_or_no_room() -> None:
    a = Taker("a", 5, room=1000)
    for limited in (lambda: {KEY}, lambda: None):
        handoff = HandOff(limited)
        handoff.join(a, [KEY])
        assert handoff.take(KEY, 10) is None
    handoff = HandOff(lambda: set())
    handoff.join(a, [KEY])
    assert handoff.take(KEY, 1000) is None  # 1000 + len("a") does not fit
    assert handoff.take(("default", "other"), 10) is None
    assert a.held == 0


async def test_only_a_due_task_of_a_quiet_queue_is_offered_a_stream() -> None:
    handoff = HandOff(lambda: set())
    a = Taker("a", 5)
    handoff.join(a, [KEY])
    due = TaskSpec(queue="q", run_at=NOW)
    later = TaskSpec(queue="q", run_at=NOW + timedelta(milliseconds=1))
    busy = SubmitHandOff(NoStore(), handoff, ReadyNotifier())  # type: ignore[arg-type]
    assert busy.stream_for(due, NOW) is None  # no waiter found the queue empty: not quiet
    notifier = ReadyNotifier()
    quiet = SubmitHandOff(NoStore(), handoff, notifier)  # type: ignore[arg-type]
    with notifier.watch("default", ["q"]) as watch:
        waiting = asyncio.ensure_future(watch.wait(10))  # its claim found nothing: it waits
        await asyncio.sleep(0)
        assert quiet.stream_for(later, NOW) is None  # not due yet: the wheel's
        single = quiet.stream_for(due, NOW)
        assert single is not None and single.worker_id == "a" and a.held == 1
        notifier.wake({KEY: 1})  # a READY task woke it: no longer quiet
        assert await waiting
    assert quiet.stream_for(due, NOW) is None


class SlowStore:
    """An insert that commits when told to (``commit``), or fails (``fail``)."""

    def __init__(self) -> None:
        self.outcome: asyncio.Future[SubmitOutcome] = asyncio.get_running_loop().create_future()

    async def submit_leased(self, spec: TaskSpec, now: datetime, worker_id: str) -> SubmitOutcome:
        return await self.outcome

    def commit(self, spec: TaskSpec, worker_id: str) -> None:
        self.outcome.set_result(SubmitOutcome(running(spec, worker_id), True))

    def fail(self) -> None:
        self.outcome.set_exception(ConnectionResetError("the server went away mid-commit"))


async def _caller_leaves(fail: bool) -> tuple[Taker, SubmitHandOff]:
    handoff = HandOff(lambda: set())
    a = Taker("a", 2)
    handoff.join(a, [KEY])
    notifier = ReadyNotifier()
    store = SlowStore()
    submits = SubmitHandOff(store, handoff, notifier)
    spec = TaskSpec(queue="q", run_at=NOW)
    with notifier.watch("default", ["q"]) as watch:
        waiting = asyncio.ensure_future(watch.wait(10))
        await asyncio.sleep(0)
        call = asyncio.ensure_future(submits.submit(spec, NOW))
        await asyncio.sleep(0)
        call.cancel()  # the submitter went away while its insert runs
        with pytest.raises(asyncio.CancelledError):
            await call
        assert a.held == 1 and a.delivered == []  # the credit stays held meanwhile
        store.fail() if fail else store.commit(spec, "a")
        for _ in range(3):
            await asyncio.sleep(0)
        waiting.cancel()
    return a, submits


async def test_an_insert_whose_caller_left_still_reaches_its_stream() -> None:
    a, submits = await _caller_leaves(fail=False)
    assert len(a.delivered) == 1 and a.held == 0 and submits.handed_off == 1


async def test_an_insert_that_failed_frees_its_credit() -> None:
    a, submits = await _caller_leaves(fail=True)
    assert a.delivered == [] and a.held == 0 and a.room() == 1 << 20
    assert submits.handed_off == 0


class PushingTaker(Taker):
    """A stream that, as a worker stream does, pushes what it is given in a task of its own."""

    def __init__(self, worker_id: str, credits: int, events: list[str]) -> None:
        super().__init__(worker_id, credits)
        self.events = events
        self.pushes: set[asyncio.Task[None]] = set()

    def deliver(self, tasks: list[Task], reserved: int, reserved_bytes: int) -> None:
        super().deliver(tasks, reserved, reserved_bytes)

        async def push() -> None:
            self.events.append("push")

        job = asyncio.get_running_loop().create_task(push())
        self.pushes.add(job)
        job.add_done_callback(self.pushes.discard)


async def test_the_push_starts_before_the_submitter_answers() -> None:
    """The task's push runs as the insert ends, before the submit's caller resumes (which
    then makes and sends the answer): the handler does not wait for that answer."""
    handoff = HandOff(lambda: set())
    events: list[str] = []
    a = PushingTaker("a", 2, events)
    handoff.join(a, [KEY])
    notifier = ReadyNotifier()
    store = SlowStore()
    submits = SubmitHandOff(store, handoff, notifier)
    spec = TaskSpec(queue="q", run_at=NOW)

    async def submitter() -> None:
        outcome = await submits.submit(spec, NOW)
        assert outcome is not None and outcome.created
        events.append("answer")

    with notifier.watch("default", ["q"]) as watch:
        waiting = asyncio.ensure_future(watch.wait(10))
        await asyncio.sleep(0)
        call = asyncio.ensure_future(submitter())
        await asyncio.sleep(0)
        store.commit(spec, "a")
        await call
        await asyncio.sleep(0)
        waiting.cancel()
    assert events == ["push", "answer"] and submits.handed_off == 1
