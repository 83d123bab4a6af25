"""StoreWatch's decision: hand partitions off after `grace` without the store, resume after."""

from __future__ import annotations

import asyncio
import time
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from chronoq.node.housekeeping import (
    MIN_PROBE_S,
    PROBE_AFTER,
    StoreWatch,
    probe_budget,
    reachable_elsewhere,
)


class FakeOwnership:
    def __init__(self) -> None:
        self.suspended = False
        self.calls: list[str] = []

    async def suspend(self) -> None:
        self.suspended = True
        self.calls.append("suspend")

    async def resume(self) -> None:
        self.suspended = False
        self.calls.append("resume")


class FakeStore:
    def __init__(self) -> None:
        self.up = False
        self.timeouts: list[float] = []

    async def probe(self, timeout: float = 2.0) -> bool:
        self.timeouts.append(timeout)
        return self.up

    async def probe_any(self, timeout: float = 2.0) -> bool:
        return await self.probe(timeout)  # one server: all of the store


async def test_suspends_after_grace_and_resumes_when_the_store_answers() -> None:
    now = [100.0]
    last_ok = [100.0]
    own, store = FakeOwnership(), FakeStore()
    watch = StoreWatch(
        store,
        own,
        lambda: last_ok[0],
        grace=6.0,
        monotonic=lambda: now[0],  # type: ignore[arg-type]
    )
    now[0] = 105.9
    await watch.check()
    assert own.calls == []  # within the grace period
    now[0] = 106.1
    await watch.check()
    assert own.calls == ["suspend"]
    await watch.check()
    assert own.calls == ["suspend"]  # still down: stays suspended, no repeat
    store.up = True
    await watch.check()
    assert own.calls == ["suspend", "resume"]


async def test_a_healthy_node_is_left_alone() -> None:
    now = [0.0]
    own: Any = FakeOwnership()
    watch = StoreWatch(FakeStore(), own, lambda: now[0] - 0.1, grace=6.0, monotonic=lambda: now[0])  # type: ignore[arg-type]
    for t in range(100):
        now[0] = float(t)
        await watch.check()
    assert own.calls == []


async def test_when_nobody_reaches_the_store_the_partitions_stay() -> None:
    now = [100.0]
    elsewhere = [False]
    own, store = FakeOwnership(), FakeStore()
    watch = StoreWatch(
        store,
        own,
        lambda: 100.0,
        grace=6.0,
        monotonic=lambda: now[0],  # type: ignore[arg-type]
        reachable_elsewhere=lambda: elsewhere[0],
    )
    now[0] = 120.0
    await watch.check()
    assert own.calls == [] and watch.holding  # a store-wide outage: nothing to gain by leaving
    elsewhere[0] = True  # the others reach it again, this node still does not
    await watch.check()
    assert own.calls == ["suspend"] and not watch.holding


def test_reachable_elsewhere_reads_the_members_fresh_figures() -> None:
    stats = {
        "me": {"store_ok_at": 100.0},
        "stale": {"store_ok_at": 80.0},
        "junk": {"store_ok_at": "soon"},  # type: ignore[dict-item]
        "silent": {},
    }
    assert not reachable_elsewhere(stats, "me", 100.0, fresh=8.0)  # only I am fresh
    stats["fresh"] = {"store_ok_at": 95.0}
    assert reachable_elsewhere(stats, "me", 100.0, fresh=8.0)
    assert not reachable_elsewhere(stats, "me", 104.0, fresh=8.0)  # 9 s old by then


async def test_a_slow_store_that_answers_the_probe_keeps_the_node_in() -> None:
    """Slow links: the last tick's answer is past the grace (its statements wait on a slow,
    resetting link), yet the store answers a trivial query: the node stays, so its
    partitions are not handed off and back a second later."""
    now = [100.0]
    own, store = FakeOwnership(), FakeStore()
    store.up = True
    watch = StoreWatch(
        store,
        own,
        lambda: 100.0,
        grace=1.2,
        monotonic=lambda: now[0],  # type: ignore[arg-type]
    )
    for step in range(1, 40):  # 9.75 s of ticks stuck, a check every 0.25 s
        now[0] = 100.0 + 0.25 * step
        await watch.check()
    assert own.calls == [] and watch.slow == watch.probes > 0
    assert all(t <= 1.2 / 2 for t in store.timeouts)
    store.up = False  # now it is out of reach: out at the grace after its last answer
    answered = watch.answered
    while own.calls == []:
        now[0] += 0.25
        await watch.check()
    assert own.calls == ["suspend"]
    assert answered + 1.2 < now[0] <= answered + 1.2 + 0.25


async def test_a_cut_off_node_still_steps_out_at_the_grace() -> None:
    now = [100.0]
    own, store = FakeOwnership(), FakeStore()  # never answers
    watch = StoreWatch(
        store,
        own,
        lambda: 100.0,
        grace=1.2,
        monotonic=lambda: now[0],  # type: ignore[arg-type]
    )
    while own.calls == []:
        now[0] += 0.24
        await watch.check()
    assert 101.2 < now[0] <= 101.2 + 0.24 and watch.probes > 0 and watch.slow == 0


async def test_a_probe_that_never_answers_ends_at_its_budget() -> None:
    class Hanging(FakeStore):
        async def probe(self, timeout: float = 2.0) -> bool:
            await asyncio.sleep(3600)
            return True

    start = time.monotonic()
    own = FakeOwnership()
    watch = StoreWatch(Hanging(), own, lambda: start - 0.5, grace=1.2)  # type: ignore[arg-type]
    await asyncio.wait_for(watch.check(), 5)
    assert time.monotonic() - start < 1.2 and watch.probes == 1 and watch.slow == 0
    assert own.calls == []


@given(
    st.floats(0, 100, allow_nan=False),
    st.floats(0, 100, allow_nan=False),
    st.floats(0.1, 60, allow_nan=False),
)
def test_the_probe_budget_never_outlasts_the_grace(
    firing: float, reached: float, grace: float
) -> None:
    budget = probe_budget(firing, min(firing, reached), grace)
    if firing <= grace * PROBE_AFTER:
        assert budget is None
    else:
        assert budget is not None
        assert MIN_PROBE_S <= budget <= max(MIN_PROBE_S, grace / 2)
        assert budget <= max(MIN_PROBE_S, grace - min(firing, reached))
