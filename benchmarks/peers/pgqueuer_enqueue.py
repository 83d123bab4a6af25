"""PgQueuer's batch enqueue, for ``benchmarks/submit_batch.py`` to run beside chronoq.

Runs in an interpreter that has ``pgqueuer`` and ``asyncpg`` (a scratch virtual environment,
never chronoq's own: PgQueuer is no dependency of chronoq). Installs PgQueuer's schema in the
database it is given, then enqueues ``--tasks`` jobs in batches of ``--batch``: one
``Queries.enqueue`` call, one INSERT statement, per batch, on one connection, as its own
benchmark does. ``--keyed`` gives every job a dedupe key (``on_conflict="skip"``), the
closest to chronoq's idempotent submit. Prints one JSON line: tasks, seconds, per_s and
cpu_seconds (its process's, while enqueueing). The password comes from ``PGPASSWORD``, not
the command line.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
import uuid
from datetime import timedelta

import asyncpg
from pgqueuer.queries import Queries


async def enqueue(dsn: str, tasks: int, batch: int, keyed: bool) -> dict[str, float]:
    conn = await asyncpg.connect(dsn)
    try:
        queries = Queries.from_asyncpg_connection(conn)
        await queries.install()
        entrypoints = ["bench"] * batch
        payloads: list[bytes | None] = [b"x" * 100] * batch  # chronoq's benchmark payload
        priorities = [0] * batch
        after: list[timedelta | None] = [
            timedelta(minutes=5) + timedelta(hours=1) * i / batch for i in range(batch)
        ]

        async def one() -> None:
            if keyed:
                keys: list[str | None] = [str(uuid.uuid4()) for _ in range(batch)]
                await queries.enqueue(
                    entrypoints, payloads, priorities, after, keys, on_conflict="skip"
                )
            else:
                await queries.enqueue(entrypoints, payloads, priorities, after)

        await one()  # warm-up: statement prepared, as chronoq's node and raw loop are
        cpu = time.process_time()
        started = time.perf_counter()
        for _ in range(tasks // batch):
            await one()
        seconds = time.perf_counter() - started
        cpu = time.process_time() - cpu
    finally:
        await conn.close()
    done = tasks // batch * batch
    return {"tasks": done, "seconds": seconds, "per_s": done / seconds, "cpu_seconds": cpu}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--dsn", required=True)
    parser.add_argument("--tasks", type=int, default=20_000)
    parser.add_argument("--batch", type=int, default=1000)
    parser.add_argument("--keyed", action="store_true")
    args = parser.parse_args()
    print(json.dumps(asyncio.run(enqueue(args.dsn, args.tasks, args.batch, args.keyed))))


if __name__ == "__main__":
    main()
