"""The dispatch gate: what it reads, how often, and a change made here while it reads."""

from __future__ import annotations

import asyncio
from datetime import timedelta

from prometheus_client import CollectorRegistry, generate_latest

from chronoq.node.dispatch.gate import Gate
from chronoq.node.metrics import PausedCollector
from chronoq.queue_settings import QueueSettings


class FakeStore:
    """The two reads of the gate, counted; a read can be held open."""

    def __init__(self) -> None:
        self.limits: dict[tuple[str, str], tuple[float, float]] = {}
        self.settings: list[QueueSettings] = []
        self.reads = 0
        self.hold: asyncio.Event | None = None

    async def queue_limits(self) -> dict[tuple[str, str], tuple[float, float]]:
        self.reads += 1
        if self.hold is not None:
            await self.hold.wait()
        return dict(self.limits)

    async def gated_queues(self) -> list[QueueSettings]:
        return list(self.settings)


async def test_the_gate_joins_limits_and_settings_and_reads_again_when_stale() -> None:
    store = FakeStore()
    store.limits = {("ns", "lim"): (1.0, 1.0)}
    store.settings = [
        QueueSettings("ns", "p", paused=True),
        QueueSettings("ns", "k", max_running_per_key=1),
    ]
    gate = Gate(refresh=timedelta(hours=1))
    assert gate.known() is None  # before the first read nothing may be handed off
    assert await gate.current(store) == {("ns", "lim")}
    assert gate.known() == {("ns", "lim"), ("ns", "p"), ("ns", "k")}
    assert gate.paused() == {("ns", "p")}
    settings = gate.settings(("ns", "k"))
    assert settings is not None and settings.max_running_per_key == 1
    store.settings = []
    await gate.current(store)  # fresh: not read again
    assert store.reads == 1 and ("ns", "p") in (gate.known() or ())
    await gate.refresh(store)
    assert gate.known() == {("ns", "lim")} and gate.paused() == frozenset()


async def test_concurrent_claims_share_one_read() -> None:
    store = FakeStore()
    store.hold = asyncio.Event()
    gate = Gate()
    waiting = [asyncio.ensure_future(gate.current(store)) for _ in range(50)]
    await asyncio.sleep(0)
    store.hold.set()
    await asyncio.gather(*waiting)
    assert store.reads == 1


async def test_a_change_made_here_holds_at_once_even_over_a_read_in_flight() -> None:
    store = FakeStore()
    gate = Gate(refresh=timedelta(0))
    await gate.refresh(store)
    store.hold = asyncio.Event()
    reading = asyncio.ensure_future(gate.refresh(store))
    await asyncio.sleep(0)
    gate.changed(QueueSettings("ns", "q", paused=True))  # written after the read began
    assert gate.paused() == {("ns", "q")}
    store.hold.set()
    await reading  # the read did not see it: the change stays
    assert gate.paused() == {("ns", "q")} and ("ns", "q") in (gate.known() or ())
    gate.changed(QueueSettings("ns", "q"))  # resumed, nothing set: no longer gated
    assert gate.known() == frozenset()


async def test_a_failed_read_is_raised_to_the_claim_and_tried_again() -> None:
    class Down(FakeStore):
        async def gated_queues(self) -> list[QueueSettings]:
            raise ConnectionError("down")

    gate = Gate()
    for _ in range(2):
        try:
            await gate.current(Down())
        except ConnectionError:
            pass
        else:
            raise AssertionError("the failure must reach the claim")
    assert gate.known() is None


def test_the_paused_gauge_is_bounded_like_the_depth() -> None:
    paused = [("ns", f"q{i:03d}") for i in range(50)] + [("other", "x")]
    registry = CollectorRegistry()
    registry.register(PausedCollector(lambda: paused, cap=10))
    text = generate_latest(registry).decode()
    series = [line for line in text.splitlines() if line.startswith("chronoq_queue_paused{")]
    assert len(series) <= 2 * 10 + 1
    total = sum(float(line.rsplit(" ", 1)[1]) for line in series)
    assert total == len(paused)  # every paused queue counted, some summed under (other)
