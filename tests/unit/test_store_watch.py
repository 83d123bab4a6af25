"""StoreWatch's decision: hand partitions off after `grace` without the store, resume after."""

from __future__ import annotations

from typing import Any

from chronoq.node.housekeeping import StoreWatch, reachable_elsewhere


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

    async def probe(self) -> bool:
        return self.up


async def test_suspends_after_grace_and_resumes_when_the_store_answers() -> None:
    now = [100.0]
    last_ok = [100.0]
    own, store = FakeOwnership(), FakeStore()
    watch = StoreWatch(
        store, own, lambda: last_ok[0], grace=6.0, monotonic=lambda: now[0]  # type: ignore[arg-type]
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
        store, own, lambda: 100.0, grace=6.0, monotonic=lambda: now[0],  # type: ignore[arg-type]
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
