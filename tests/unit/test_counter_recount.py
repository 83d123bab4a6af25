"""The leader's recount of the namespace counters runs on the node that leads only, at the
node's clock's instant."""

from __future__ import annotations

from datetime import UTC, datetime

from chronoq.clock import ManualClock
from chronoq.node.housekeeping import CounterRecount

AT = datetime(2030, 1, 1, tzinfo=UTC)


async def test_only_the_leader_recounts_at_its_clocks_instant() -> None:
    asked: list[datetime] = []
    leading = False

    async def recount(now: datetime) -> int:
        asked.append(now)
        return 3

    loop = CounterRecount(recount, ManualClock(AT), leads=lambda: leading)
    assert await loop.run() == 0 and asked == []
    leading = True
    assert await loop.run() == 3 and asked == [AT]
    assert loop.recounted == 3
