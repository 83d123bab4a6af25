"""The long-poll registry: waiters are woken by count, leave nothing behind, and are capped."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping, Sequence

import pytest

from chronoq.errors import TooManyLongPolls
from chronoq.node.dispatch.claims import ANSWER_MARGIN, FairLanes, wait_within_deadline
from chronoq.node.dispatch.readiness import (
    NOTICE_BYTES,
    LongPollSlots,
    ReadyBroadcast,
    ReadyNotifier,
    ReadyProbe,
    decode_notice,
    encode_notices,
)

Key = tuple[str, str]


async def test_no_entry_is_left_after_waits_time_out_for_many_queue_names() -> None:
    notifier = ReadyNotifier()

    async def wait_once(i: int) -> bool:
        with notifier.watch("ns", [f"queue-{i}", f"other-{i}"]) as watch:
            return await watch.wait(0.01)

    results = await asyncio.gather(*(wait_once(i) for i in range(5000)))
    assert not any(results)
    assert len(notifier) == 0
    assert notifier.waiting() == {}


async def test_no_entry_is_left_after_waiters_are_cancelled() -> None:
    notifier = ReadyNotifier()

    async def wait_long(i: int) -> None:
        with notifier.watch("ns", [f"queue-{i}"]) as watch:
            await watch.wait(60)

    waiters = [asyncio.create_task(wait_long(i)) for i in range(2000)]
    await asyncio.sleep(0)
    assert len(notifier) == 2000
    for w in waiters:
        w.cancel()
    await asyncio.gather(*waiters, return_exceptions=True)
    assert len(notifier) == 0


async def test_notify_wakes_as_many_waiters_as_tasks_oldest_first() -> None:
    notifier = ReadyNotifier()
    watches = [notifier.watch("ns", ["q"]) for _ in range(10)]
    notifier.notify({("ns", "q"): 3})
    assert [w.woken for w in watches] == [True] * 3 + [False] * 7
    assert notifier.waiting() == {("ns", "q"): 7}  # woken waiters leave the registry
    notifier.notify([("ns", "q"), ("ns", "q")])  # an iterable counts each occurrence
    assert sum(w.woken for w in watches) == 5
    notifier.notify({("ns", "other"): 5, ("other-ns", "q"): 5})
    assert sum(w.woken for w in watches) == 5
    for w in watches:
        w.close()
    assert len(notifier) == 0


async def test_a_waiter_on_several_queues_is_woken_once_and_leaves_every_key() -> None:
    notifier = ReadyNotifier()
    both = notifier.watch("ns", ["a", "b"])
    only_b = notifier.watch("ns", ["b"])
    notifier.notify({("ns", "a"): 1, ("ns", "b"): 1})
    assert both.woken and only_b.woken  # b's one task goes to only_b: both already woke
    assert len(notifier) == 0
    assert await both.wait(60)  # already woken: no wait


async def test_a_wake_up_during_the_claim_is_not_lost() -> None:
    notifier = ReadyNotifier()
    with notifier.watch("ns", ["q"]) as watch:
        notifier.notify([("ns", "q")])  # ready while the waiter was still claiming
        assert await watch.wait(60)


async def test_probe_asks_once_for_every_waited_key_and_wakes_by_count() -> None:
    notifier = ReadyNotifier()
    asked: list[tuple[list[Key], list[int]]] = []

    async def ready_counts(keys: Sequence[Key], caps: Sequence[int]) -> Mapping[Key, int]:
        asked.append((list(keys), list(caps)))
        return {key: 2 for key in keys if key == ("ns", "busy")}

    probe = ReadyProbe(notifier, ready_counts, interval=0.5)
    await probe.probe()
    assert asked == []  # nobody waits: nothing is sent
    busy = [notifier.watch("ns", ["busy"]) for _ in range(5)]
    idle = [notifier.watch("ns", [f"idle-{i}"]) for i in range(1500)]
    await probe.probe()
    assert len(asked) == 2  # 1501 keys: two statements of at most 1000 keys
    assert dict(zip(*asked[0], strict=True))[("ns", "busy")] == 5
    assert sum(w.woken for w in busy) == 2
    assert not any(w.woken for w in idle)


def test_slots_cap_each_namespace_and_the_node() -> None:
    slots = LongPollSlots(per_namespace=2, per_node=3)
    with slots.hold("a"), slots.hold("a"):
        with pytest.raises(TooManyLongPolls, match="namespace 'a' has 2 long-polling"):
            with slots.hold("a"):
                pass
        with slots.hold("b"):
            with pytest.raises(TooManyLongPolls, match="this node has 3") as refused:
                with slots.hold("c"):
                    pass
            assert refused.value.scope == "node"
        assert slots.total == 2
    assert slots.total == 0 and slots.open("a") == 0


def test_a_long_poll_waits_no_longer_than_the_callers_deadline() -> None:
    margin = ANSWER_MARGIN.total_seconds()
    assert wait_within_deadline(30.0, None) == 30.0
    assert wait_within_deadline(30.0, 5.0) == pytest.approx(5.0 - margin)
    assert wait_within_deadline(2.0, 5.0) == 2.0
    assert wait_within_deadline(30.0, margin / 2) == 0.0
    assert wait_within_deadline(30.0, 0.0) == 0.0


async def test_lanes_let_namespaces_take_turns() -> None:
    lanes = FairLanes(1)
    order: list[str] = []
    gate = asyncio.Event()

    async def claim(namespace: str) -> None:
        async with lanes.lane(namespace):
            order.append(namespace)
            await gate.wait()

    first = asyncio.create_task(claim("crowd"))
    await asyncio.sleep(0)
    crowd = [asyncio.create_task(claim("crowd")) for _ in range(50)]
    await asyncio.sleep(0)
    quiet = asyncio.create_task(claim("quiet"))
    await asyncio.sleep(0)
    assert lanes.waiting() == 51
    gate.set()
    await asyncio.gather(first, quiet, *crowd)
    assert order.index("quiet") == 2  # one crowd claim ahead of it, not fifty
    assert lanes.waiting() == 0


async def test_a_cancelled_waiter_gives_up_its_turn_and_no_lane_is_lost() -> None:
    lanes = FairLanes(2)
    held = asyncio.Event()
    gate = asyncio.Event()

    async def hold(namespace: str) -> None:
        async with lanes.lane(namespace):
            held.set()
            await gate.wait()

    holders = [asyncio.create_task(hold("a")) for _ in range(2)]
    await asyncio.sleep(0)
    waiters = [asyncio.create_task(hold(f"ns-{i}")) for i in range(10)]
    await asyncio.sleep(0)
    for w in waiters[:5]:
        w.cancel()
    gate.set()
    await asyncio.gather(*holders, *waiters[5:])
    await asyncio.gather(*waiters[:5], return_exceptions=True)
    assert lanes.waiting() == 0
    got: list[int] = []
    async with lanes.lane("x"), lanes.lane("y"):  # both lanes are free again
        got.append(1)
    assert got == [1]


async def test_a_queue_is_quiet_while_a_waiter_found_nothing_and_was_not_woken() -> None:
    notifier = ReadyNotifier()
    assert not notifier.quiet("ns", ["q"])
    claiming = notifier.watch("ns", ["q"])
    assert not notifier.quiet("ns", ["q"])  # its claim has not come back yet
    waiting = asyncio.create_task(claiming.wait(60))
    await asyncio.sleep(0)
    assert notifier.quiet("ns", ["q"])
    assert not notifier.quiet("ns", ["q", "other"])
    notifier.notify([("ns", "q")])
    assert await waiting
    assert not notifier.quiet("ns", ["q"])  # woken: tasks may be ready
    claiming.close()
    assert len(notifier) == 0 and not notifier.quiet("ns", ["q"])


def test_notices_round_trip_and_stay_under_the_notify_limit() -> None:
    ready = {("ns", f"queue-{i:04}-" + "x" * 100): i + 1 for i in range(500)}
    payloads = encode_notices("node-1", ready)
    assert len(payloads) > 1
    assert all(len(p.encode()) <= NOTICE_BYTES + 100 for p in payloads)
    heard: dict[tuple[str, str], int] = {}
    for payload in payloads:
        sender, counts = decode_notice(payload)
        assert sender == "node-1"
        heard.update(counts)
    assert heard == ready
    for garbage in ("[]", '{"ready": [[1, 2, 3]]}', '{"ready": 5}'):
        with pytest.raises((ValueError, TypeError)):
            decode_notice(garbage)


class FakeNotices:
    def __init__(self) -> None:
        self.sent: list[list[str]] = []
        self.listener: Callable[[str], None] | None = None

    async def announce(self, channel: str, payloads: Sequence[str]) -> None:
        self.sent.append(list(payloads))

    async def listen(self, channel: str, on_notice: Callable[[str], None]) -> FakeListening:
        self.listener = on_notice
        return FakeListening()


class FakeListening:
    closed = False

    async def close(self) -> None:
        self.closed = True


async def test_local_notices_are_sent_together_and_heard_ones_wake_without_echo() -> None:
    notices = FakeNotices()
    notifier = ReadyNotifier()
    broadcast = ReadyBroadcast(notifier, notices, "me")
    notifier.on_notify = broadcast.publish
    for _ in range(20):
        notifier.notify([("ns", "q")])
    await asyncio.sleep(0.1)
    assert len(notices.sent) == 1  # twenty notices, one NOTIFY statement
    assert decode_notice(notices.sent[0][0]) == ("me", {("ns", "q"): 20})

    assert broadcast.probe_interval(0.5) == 0.5  # nothing heard yet: the probe at full rate
    await broadcast.keep_listening()
    assert broadcast.probe_interval(0.5) == 5.0  # notices heard: the probe is a fallback
    assert notices.listener is not None
    watches = [notifier.watch("ns", ["q"]) for _ in range(3)]
    notices.listener(encode_notices("me", {("ns", "q"): 3})[0])  # our own: woke them already
    assert not any(w.woken for w in watches)
    notices.listener(encode_notices("other", {("ns", "q"): 2})[0])
    assert sum(w.woken for w in watches) == 2
    notices.listener("not json")  # ignored
    await asyncio.sleep(0.1)
    assert len(notices.sent) == 1  # heard notices are not passed on
    await broadcast.close()
