"""A schedule owner's pass in steady state, and what its check of the task history costs.

``--schedules`` one-second schedules in one fresh migrated database (embedded PostgreSQL
unless ``--dsn``); each pass (``Schedules.materialize``, no lookahead) makes one occurrence
of each. After each pass the statement that checks the pass's inserts against the history
(``drop_retired_occurrences``) runs once more on the same ids, alone, in a transaction that
is rolled back. Printed: the median pass, the median check, and the median of each pass's own
ratio of the two. A report, not a pass/fail test::

    python benchmarks/schedule_pass.py                   # 100 schedules, 40 passes
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time
from datetime import UTC, datetime, timedelta

from chronoq.coordinator.local import LocalOwnership
from chronoq.embedded.postgres import scratch_database
from chronoq.models import ScheduleSpec
from chronoq.recurrence import Every
from chronoq.store import Store
from chronoq.store.schedules import Schedules
from chronoq.store.sql import q

#: The tasks a pass at $1 inserted.
PASS_IDS = "SELECT id FROM tasks WHERE queue = 'pass' AND created_at = $1"


async def run(dsn: str, schedules: int, passes: int) -> None:
    store = await Store.connect(dsn, min_size=1, max_size=2)
    try:
        pump = Schedules(store)
        at = datetime(2030, 1, 1, tzinfo=UTC)
        second = timedelta(seconds=1)
        for i in range(schedules):
            spec = ScheduleSpec(name=f"s{i}", queue="pass", rule=Every(second, at))
            await pump.create(spec, at)
        owner = LocalOwnership(store, "owner")
        await owner.start()
        await pump.materialize(owner.owned(), at, lookahead=timedelta(0), batch=schedules)
        pass_ms: list[float] = []
        check_ms: list[float] = []
        for _ in range(passes):
            at += second
            started = time.perf_counter()
            done = await pump.materialize(
                owner.owned(), at, lookahead=timedelta(0), batch=schedules
            )
            pass_ms.append((time.perf_counter() - started) * 1e3)
            assert done.created == schedules, done
            async with store.connection() as conn:
                made = await conn.fetch(PASS_IDS, at)
                ids = [r["id"] for r in made]
                tx = conn.transaction()
                await tx.start()
                started = time.perf_counter()
                await conn.execute(q("drop_retired_occurrences"), ids)
                check_ms.append((time.perf_counter() - started) * 1e3)
                await tx.rollback()
        med = statistics.median
        share = med(c / p for c, p in zip(check_ms, pass_ms, strict=True))
        print(
            f"{schedules} schedules, one occurrence each, {passes} passes: pass "
            f"{med(pass_ms):.1f} ms, its history check {med(check_ms):.2f} ms "
            f"(median share {share:.1%})"
        )
    finally:
        await store.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--schedules", type=int, default=100)
    parser.add_argument("--passes", type=int, default=40)
    parser.add_argument("--dsn", help="an empty scratch database (default: embedded)")
    args = parser.parse_args()
    with scratch_database("schedule_pass", args.dsn) as dsn:
        asyncio.run(run(dsn, args.schedules, args.passes))


if __name__ == "__main__":
    main()
