"""Near-future submit notices and local-first wake-ups (pure parts, no store)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable, Sequence

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from chronoq.node.dispatch.broadcast import NOTICE_BYTES
from chronoq.node.dispatch.readiness import ReadyNotifier
from chronoq.node.dispatch.soon import MAX_PENDING, SoonBroadcast, decode_soon, encode_soon
from chronoq.wheel import Due

dues = st.lists(
    st.builds(
        Due,
        st.uuids().map(str),
        st.integers(0, 32766),
        st.integers(0, 2**62),
    ),
    max_size=400,
)


@settings(max_examples=30, deadline=None)
@given(due=dues)
def test_a_notice_lists_every_task_or_names_their_partitions_and_fits(due: list[Due]) -> None:
    payload = encode_soon("node-a", due)
    assert len(payload.encode()) <= NOTICE_BYTES
    sender, listed, partitions = decode_soon(payload)
    assert sender == "node-a"
    if listed or not due:
        assert listed == due and partitions == []
    else:  # too many to list: every partition is named (or all of them)
        assert partitions is None or set(partitions) == {d.partition for d in due}


@pytest.mark.parametrize(
    "payload",
    ["[]", json.dumps({"due": [["x", "p", 1]]}), json.dumps({"partitions": ["a"]}), "{"],
)
def test_a_malformed_notice_is_refused(payload: str) -> None:
    with pytest.raises((ValueError, TypeError)):
        decode_soon(payload)


class FakeNotices:
    def __init__(self) -> None:
        self.sent: list[tuple[str, list[str]]] = []
        self.listener: Callable[[str], None] | None = None

    async def announce(self, channel: str, payloads: Sequence[str]) -> None:
        self.sent.append((channel, list(payloads)))

    async def listen(self, channel: str, on_notice: Callable[[str], None]) -> FakeNotices:
        self.listener = on_notice
        return self

    @property
    def closed(self) -> bool:
        return False

    async def close(self) -> None:
        pass


async def test_a_batch_sends_one_notice_and_others_hear_it() -> None:
    notices = FakeNotices()
    told: list[tuple[list[Due], list[int] | None]] = []
    mine = SoonBroadcast(notices, "a", lambda d, p: told.append((d, p)))
    batch = [Due(f"t{i}", i % 7, 1000 + i) for i in range(5000)]
    mine.publish(batch[:10])
    mine.publish(batch[10:])  # same turn of the loop: gathered
    await asyncio.sleep(0.05)
    assert len(notices.sent) == 1 and len(notices.sent[0][1]) == 1  # one NOTIFY, one payload
    await mine.keep_listening()
    assert notices.listener is not None
    notices.listener(notices.sent[0][1][0])  # our own: ignored
    assert told == []
    notices.listener(encode_soon("b", batch[:3]))
    assert told == [(batch[:3], [])]
    await mine.close()


async def test_a_backlog_of_notices_is_bounded_and_names_its_partitions() -> None:
    notices = FakeNotices()
    mine = SoonBroadcast(notices, "a", lambda d, p: None)
    mine.publish([Due(f"t{i}", i % 300, i) for i in range(MAX_PENDING + 1)])
    assert len(mine._pending) == 0 and len(mine._overflow) == 300  # bounded while it waits
    mine.publish([Due("late", 7, 1)])
    await asyncio.sleep(0.05)
    (payload,) = notices.sent[0][1]
    assert decode_soon(payload) == ("a", [], list(range(300)))
    await mine.close()


def test_a_fire_tells_the_other_nodes_only_what_local_waiters_cannot_take() -> None:
    async def run() -> None:
        notifier = ReadyNotifier()
        told: list[dict[tuple[str, str], int]] = []
        notifier.on_notify = lambda counts: told.append(dict(counts))
        watches = [notifier.watch("ns", ["q"]) for _ in range(2)]
        notifier.notify({("ns", "q"): 1})  # a local waiter takes it: nobody else is woken
        assert told == [] and sum(w.woken for w in watches) == 1
        notifier.notify({("ns", "q"): 3, ("ns", "other"): 2})  # one waiter left here
        assert told == [{("ns", "q"): 2, ("ns", "other"): 2}]
        assert all(w.woken for w in watches)

    asyncio.run(run())
