"""The statement of a single keyed submit (``TaskInserts._submit_one``), before and after it
became the function ``chronoq_insert_task_once`` (migration 0026).

One non-durable embedded PostgreSQL (unless ``--dsn``), one connection of the store (so its
``plan_cache_mode = force_custom_plan``), ``--backlog`` keyed tasks in ``tasks`` first. Each
round times ``--calls`` single keyed inserts of a task due now (fresh keys, one statement each,
as the submit sends it) of one arm; rounds alternate the arms, so a slow minute of a shared
machine lands on both. Then ``--explain`` calls of each arm under EXPLAIN (ANALYZE), for the
server's own planning and execution times. Arms:

- ``old``: ``insert_tasks`` over its column arrays with the key checked in tasks and the
  history in the same statement, the text the submit sent before 0026 (built here as its
  ``retired_keys.checked_in_statement`` built it), planned at every call;
- ``new``: ``insert_task_once``, whose function keeps one generic plan per session.

Printed: per round its median; per arm the median of the rounds' medians and EXPLAIN's
medians; the range of each pair of rounds' own ratio new/old. A report, not a pass/fail test::

    python benchmarks/single_submit.py                  # 6 rounds of 300 calls
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import time
import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

from chronoq.embedded.postgres import scratch_database
from chronoq.models import TaskSpec
from chronoq.store import Store
from chronoq.store.sql import queries

#: The statement before 0026: the key's check, added before insert_tasks' conflict clause.
_CONFLICT = "\nON CONFLICT (namespace, idempotency_key)"
_NOWHERE = """
  AND (u.idempotency_key IS NULL
       OR (NOT EXISTS (SELECT 1 FROM tasks k
                       WHERE k.namespace = u.namespace AND k.idempotency_key = u.idempotency_key)
           AND NOT chronoq_key_retired(u.namespace, u.idempotency_key)))"""


def old_statement(store: Store) -> str:
    insert = store._q("insert_tasks")
    named = insert.replace("/* chronoq insert_tasks */", "/* chronoq insert_task_once */")
    return named.replace(_CONFLICT, _NOWHERE + _CONFLICT)


def spec(now: datetime) -> TaskSpec:
    return TaskSpec(queue="single", run_at=now, payload=b"x" * 64, idempotency_key=uuid.uuid4().hex)


class Arms:
    """Each arm's statement and the arguments of one fresh task."""

    def __init__(self, store: Store) -> None:
        self.store = store
        self.old = old_statement(store)
        self.new = store._q("insert_task_once") if "insert_task_once" in queries() else None

    def call(self, arm: str) -> tuple[str, list[Any]]:
        now = datetime.now(UTC)
        _ids, cols = self.store._insert_columns([spec(now)], now)
        if arm == "old":
            return self.old, [*cols, now]
        assert self.new is not None, "no insert_task_once here (before migration 0026)"
        return self.new, [*(col[0] for col in cols), now]


async def timed_round(conn: Any, arms: Arms, arm: str, calls: int) -> float:
    spent: list[float] = []
    for _ in range(calls):
        statement, args = arms.call(arm)
        started = time.perf_counter()
        row = await conn.fetchrow(statement, *args)
        spent.append((time.perf_counter() - started) * 1e3)
        assert row is not None
    return statistics.median(spent)


async def explained(conn: Any, arms: Arms, arm: str, calls: int) -> tuple[float, float]:
    planning: list[float] = []
    execution: list[float] = []
    for _ in range(calls):
        statement, args = arms.call(arm)
        (plan,) = json.loads(
            await conn.fetchval(f"EXPLAIN (ANALYZE, FORMAT JSON) {statement}", *args)
        )
        planning.append(plan["Planning Time"])
        execution.append(plan["Execution Time"])
    return statistics.median(planning), statistics.median(execution)


async def run(dsn: str, args: argparse.Namespace) -> None:
    store = await Store.connect(dsn, min_size=1, max_size=1)
    try:
        now = datetime.now(UTC)
        for start in range(0, args.backlog, 1000):
            batch = [spec(now) for _ in range(min(1000, args.backlog - start))]
            await store.submit_ids(batch, now)
        later = [spec(now + timedelta(hours=1)) for _ in range(args.backlog // 10)]
        await store.submit_ids(later, now)
        arms = Arms(store)
        names = args.arms.split(",")
        rounds: dict[str, list[float]] = {a: [] for a in names}
        async with store.connection() as conn:
            await conn.execute("ANALYZE tasks")
            for a in names:  # warm: each statement prepared, the function's plan made
                await timed_round(conn, arms, a, 20)
            for r in range(args.rounds):
                order = names if r % 2 == 0 else names[::-1]
                for a in order:
                    rounds[a].append(await timed_round(conn, arms, a, args.calls))
                    print(f"round {r + 1} {a}: median {rounds[a][-1]:.3f} ms", flush=True)
            plans = {a: await explained(conn, arms, a, args.explain) for a in names}
        med = statistics.median
        for a in names:
            planning, execution = plans[a]
            print(
                f"{a}: median of round medians {med(rounds[a]):.3f} ms; EXPLAIN (ANALYZE) "
                f"planning {planning:.3f} ms, execution {execution:.3f} ms"
            )
        if set(names) == {"old", "new"}:
            ratios = [n / o for n, o in zip(rounds["new"], rounds["old"], strict=True)]
            print(f"round ratios new/old: {min(ratios):.2f}-{max(ratios):.2f}")
    finally:
        await store.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--calls", type=int, default=300)
    parser.add_argument("--explain", type=int, default=50)
    parser.add_argument("--backlog", type=int, default=20_000)
    parser.add_argument("--arms", default="old,new", help="old,new (old alone before 0026)")
    parser.add_argument("--dsn", help="an empty scratch database (default: embedded)")
    args = parser.parse_args()
    with scratch_database("single_submit", args.dsn) as dsn:
        asyncio.run(run(dsn, args))


if __name__ == "__main__":
    main()
