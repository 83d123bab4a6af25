"""StoreWatch's decision: hand partitions off after `grace` without the store, resume after."""

from __future__ import annotations

from typing import Any

from chronoq.node.housekeeping import StoreWatch


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
