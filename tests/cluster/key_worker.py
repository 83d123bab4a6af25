"""A worker process for the concurrency-key cluster test: runs the tasks of one queue, each a
JSON payload ``{"key": ..., "ms": ...}`` that sleeps ``ms``, and appends a start and an end
line per run to a ledger file of its own (one per process, so no locking).

Run as ``python -m tests.cluster.key_worker --target T --queue Q --ledger FILE --worker-id W``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import time
from typing import Any

from chronoq.client import Client, TaskContext, Worker


async def _main(args: argparse.Namespace) -> None:
    fd = os.open(args.ledger, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)

    def record(event: str, ctx: TaskContext, key: str) -> None:
        line: dict[str, Any] = {
            "e": event, "task": ctx.id, "attempt": ctx.attempt, "key": key,
            "t": time.time_ns(), "worker": args.worker_id,
        }
        os.write(fd, (json.dumps(line) + "\n").encode())  # one small O_APPEND write: whole

    async def handle(ctx: TaskContext) -> None:
        body = json.loads(ctx.payload)
        record("start", ctx, body["key"])
        await asyncio.sleep(body["ms"] / 1000)
        record("end", ctx, body["key"])

    client = Client(args.target, timeout=5.0)
    worker = Worker(
        client, {args.queue: handle}, concurrency=args.concurrency, worker_id=args.worker_id
    )
    worker.install_signal_handlers()
    try:
        await worker.run()
    finally:
        await client.close()
        os.close(fd)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--target", required=True)
    parser.add_argument("--queue", required=True)
    parser.add_argument("--ledger", required=True)
    parser.add_argument("--worker-id", required=True)
    parser.add_argument("--concurrency", type=int, default=8)
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)
    asyncio.run(_main(args))


if __name__ == "__main__":
    main()
