"""The hand-off plan (pure): never more tasks than a stream's free credits, credits back for
what the statement did not lease, streams of a key take turns, limited queues never."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any, cast

from hypothesis import given
from hypothesis import strategies as st

from chronoq.limits import MAX_CLAIM_TASKS
from chronoq.models import Task, TaskState
from chronoq.node.dispatch.handoff import HandOff, Key
from chronoq.node.dispatch.work_stream import HANDOFF_MEMORY, QUIET_CLAIM, WorkSession, claim_size
from chronoq.wheel import Due

KEY: Key = ("default", "q")


class FakeTaker:
    def __init__(self, worker_id: str, credits: int) -> None:
        self.worker_id = worker_id
        self.credits = credits
        self.held = 0
        self.delivered: list[Task] = []
        self.offers = 0

    def offered(self) -> None:
        self.offers += 1

    def available(self) -> int:
        return self.credits - self.held

    def reserve(self, n: int) -> int:
        self.held += n
        return 1 << 20

    def deliver(self, tasks: list[Task], reserved: int, reserved_bytes: int) -> None:
        self.held -= reserved
        self.credits -= len(tasks)
        self.delivered += tasks


def due(n: int, key: Key | None = KEY, start: int = 0) -> list[Due]:
    return [Due(f"t{i}", 0, 1, key) for i in range(start, start + n)]


def task(task_id: str) -> Task:
    return Task(
        id=task_id,
        namespace="default",
        queue="q",
        state=TaskState.RUNNING,
        run_at=datetime(2030, 1, 1, tzinfo=UTC),
        partition=0,
        bucket=0,
    )


def test_a_plan_offers_no_more_than_the_free_credits() -> None:
    handoff = HandOff(lambda: set())
    a = FakeTaker("a", 3)
    handoff.join(a, [KEY])
    plan = handoff.plan(due(5))
    assert plan is not None
    assert len(plan.leases) == 3 and set(plan.leases.values()) == {"a"}
    assert a.available() == 0  # reserved while the statement runs
    assert handoff.plan(due(5, start=5)) is None  # nothing free to offer meanwhile
    assert a.offers == 2  # the stream hears it was wanted, credits or not (its claims)


def test_settling_delivers_the_leased_and_frees_the_rest() -> None:
    handoff = HandOff(lambda: set())
    a = FakeTaker("a", 4)
    handoff.join(a, [KEY])
    plan = handoff.plan(due(4))
    assert plan is not None
    leased = [task(t) for t in list(plan.leases)[:3]]  # one was fired elsewhere meanwhile
    assert plan.settle(leased) == 3
    assert a.delivered == leased and a.held == 0 and a.available() == 1
    assert plan.settle(leased) == 0  # settled once


def test_a_failed_statement_gives_every_credit_back() -> None:
    handoff = HandOff(lambda: set())
    a = FakeTaker("a", 2)
    handoff.join(a, [KEY])
    plan = handoff.plan(due(2))
    assert plan is not None
    plan.cancel()
    assert a.delivered == [] and a.available() == 2


def test_streams_of_a_key_take_turns() -> None:
    handoff = HandOff(lambda: set())
    a, b = FakeTaker("a", 1), FakeTaker("b", 1)
    handoff.join(a, [KEY])
    handoff.join(b, [KEY])
    first = handoff.plan(due(1))
    assert first is not None and set(first.leases.values()) == {"a"}
    first.cancel()
    second = handoff.plan(due(1))
    assert second is not None and set(second.leases.values()) == {"b"}


def test_unknown_keys_limited_queues_and_unread_limits_are_never_handed_off() -> None:
    a = FakeTaker("a", 10)
    limited = HandOff(lambda: {KEY})
    limited.join(a, [KEY])
    assert limited.plan(due(3)) is None
    unread = HandOff(lambda: None)  # limits not read yet: a limited queue cannot be told
    unread.join(a, [KEY])
    assert unread.plan(due(3)) is None
    open_ = HandOff(lambda: set())
    open_.join(a, [KEY])
    assert open_.plan(due(3, key=None)) is None  # told by another node: key unknown
    assert open_.plan(due(3, key=("default", "other"))) is None  # nobody works on it
    open_.leave(a, [KEY])
    assert open_.plan(due(3)) is None


@given(
    free=st.integers(1, 20_000),
    more=st.booleans(),
    last=st.integers(0, 20_000),
    handoff=st.booleans(),
)
def test_a_claim_fills_at_least_one_credit_and_never_more_than_are_free(
    free: int, more: bool, last: int, handoff: bool
) -> None:
    assert 1 <= claim_size(free, more=more, last=last, handoff=handoff) <= min(free, MAX_CLAIM_TASKS)


@given(free=st.integers(4, 20_000), last=st.integers(0, 20_000))
def test_under_load_a_claim_leaves_a_quarter_of_the_credits_to_the_hand_off(
    free: int, last: int
) -> None:
    n = claim_size(free, more=True, last=last, handoff=True)
    assert n == min(free, MAX_CLAIM_TASKS) - min(free, MAX_CLAIM_TASKS) // 4


@given(free=st.integers(2, 20_000), last=st.integers(0, 20_000))
def test_in_light_traffic_a_claim_leaves_half_the_credits_to_the_hand_off(
    free: int, last: int
) -> None:
    n = claim_size(free, more=False, last=last, handoff=True)
    assert n <= free - free // 2 or free > MAX_CLAIM_TASKS
    assert n >= min(free - free // 2, QUIET_CLAIM, MAX_CLAIM_TASKS)


def test_without_hand_offs_a_claim_takes_every_free_credit() -> None:
    assert claim_size(160, more=True, last=80, handoff=False) == 160
    assert claim_size(160, more=False, last=3, handoff=False) == 160
    assert claim_size(160, more=True, last=80, handoff=True) == 120  # a quarter left
    assert claim_size(160, more=False, last=3, handoff=True) == QUIET_CLAIM
    assert claim_size(160, more=False, last=30, handoff=True) == 60  # twice what it found


async def test_a_stream_keeps_room_for_the_hand_off_while_the_wheel_wants_it() -> None:
    def session(handoff: HandOff | None) -> WorkSession:
        unused = cast(Any, None)
        return WorkSession(unused, unused, unused, unused, unused, namespace="default",
                           queues=["q"], worker_id="w", handoff=handoff)

    wanted = session(HandOff(lambda: set()))
    assert not wanted._handing_off()  # claims take every free credit ...
    wanted.offered()
    assert wanted._handing_off()  # ... until the wheel has tasks for the stream ...
    wanted._offered_at -= HANDOFF_MEMORY
    assert not wanted._handing_off()  # ... and again once it has had none for a while
    alone = session(None)  # a node without the wheel's hand-off
    alone.offered()
    assert not alone._handing_off()
