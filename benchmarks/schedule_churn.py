"""Schedule churn against a submit quota: tasks made per second, and what outlives a delete.

A node (in this process, system clock, ``--quota`` tasks/s per namespace) serves a client that
creates ``--quota`` one-second schedules (all the quota reserves), waits for the owner's
pass, deletes them, and again, for ``--seconds``. Printed: occurrences made per second (the
pump's count) and tasks of the namespace still in the store afterwards. A report, not a
pass/fail test::

    python benchmarks/schedule_churn.py              # quota 100/s, 10 s
"""

from __future__ import annotations

import argparse
import asyncio
import time
from datetime import timedelta

from chronoq.client import Client
from chronoq.config import NodeSettings
from chronoq.embedded.postgres import scratch_database
from chronoq.node import Node


async def run(dsn: str, quota: float, seconds: float) -> None:
    node = Node(NodeSettings(dsn=dsn, port=0, submit_quota=quota))
    await node.start()
    try:
        assert node.pump is not None
        before = node.pump.created
        rounds = 0
        async with Client(node.address, namespace="churn", timeout=30) as client:
            started = time.monotonic()
            while time.monotonic() - started < seconds:
                names = [f"s{rounds}-{i}" for i in range(int(quota))]
                for name in names:
                    await client.create_schedule(name, "churn", every=timedelta(seconds=1))
                await asyncio.sleep(1.1)  # one pass of the owner's pump
                for name in names:
                    await client.delete_schedule(name)
                rounds += 1
            elapsed = time.monotonic() - started
        made = node.pump.created - before
        async with node.store.pool.acquire() as conn:
            left = await conn.fetchval(
                "SELECT count(*) FROM tasks_with_history WHERE namespace = 'churn'"
            )
            waiting = await conn.fetchval(
                "SELECT count(*) FROM tasks WHERE namespace = 'churn' AND state = 0"
            )
        print(
            f"quota {quota:g}/s, {rounds} rounds in {elapsed:.1f} s: {made / elapsed:,.0f} "
            f"occurrences/s made; {left:,} tasks left ({waiting:,} still to fire)"
        )
    finally:
        await node.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quota", type=float, default=100)
    parser.add_argument("--seconds", type=float, default=10)
    parser.add_argument("--dsn", help="an empty scratch database (default: embedded)")
    args = parser.parse_args()
    with scratch_database("churn", args.dsn) as dsn:
        asyncio.run(run(dsn, args.quota, args.seconds))


if __name__ == "__main__":
    main()
