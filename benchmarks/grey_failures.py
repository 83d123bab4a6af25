"""Run lateness and duplicates on a 3-node cluster, without faults and with a node freeze.

A local cluster (embedded etcd and PostgreSQL, three ``chronoq node`` processes, lease TTL
2 s) and three workers in this process, each given all three addresses. Tasks come due at a
steady rate for ``--seconds``; with ``--freeze``, one node is SIGSTOPped for that many seconds
from a third of the way in, then SIGCONTed (``--postgres-outage``: PostgreSQL is stopped
instead; ``--no-ack-retry``: workers forget an ack batch that fails, as they used to).
Printed: run lateness (handler start - run_at) p50/p99/max, the longest time without a task
start while tasks were due, and duplicate executions (a handler run of a task beyond its
first). Tasks have a short lease (``--lease-seconds``, 5 s) so a dropped
ack shows as a re-run within the run. A report, not a pass/fail test::

    python benchmarks/grey_failures.py                  # no fault
    python benchmarks/grey_failures.py --freeze 10      # one node frozen for 10 s
    python benchmarks/grey_failures.py --postgres-outage 3 [--no-ack-retry]
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import signal
import tempfile
import time
from collections import Counter
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from chronoq import errors, stats
from chronoq.client import Client, NewTask, TaskContext, Worker
from chronoq.local.cluster import ClusterSpec, LocalCluster


class OneShotAcks(Worker):
    """For comparison: the worker as it was, an ack batch that fails is logged and forgotten."""

    async def _send_acks(self, batch: list[Any]) -> None:
        try:
            await self.client.complete_many([a.lease for a in batch])
        except errors.RemoteError:
            self.stats.acks_dropped += len(batch)
        finally:
            self._ack_slots.release()
            for _ in batch:
                self._acks.task_done()


async def workload(cluster: LocalCluster, args: argparse.Namespace) -> None:
    everyone = ",".join(cluster.addresses)
    runs: list[tuple[str, int, float, float]] = []  # id, attempt, lateness, monotonic start

    async def handle(ctx: TaskContext) -> None:
        late = (datetime.now(UTC) - ctx.run_at).total_seconds()
        runs.append((ctx.id, ctx.attempt, late, time.monotonic()))
        await asyncio.sleep(args.handler_ms / 1000)

    clients = [Client(everyone, timeout=30) for _ in range(args.workers + 1)]
    submitter = clients[-1]
    kind = OneShotAcks if args.no_ack_retry else Worker
    workers = [
        kind(c, {"grey": handle}, concurrency=16, worker_id=f"w{i}")
        for i, c in enumerate(clients[:-1])
    ]
    running = [asyncio.create_task(w.run()) for w in workers]
    lead = 3.0
    count = int(args.seconds * args.rate)
    tasks = [
        NewTask(
            queue="grey",
            delay=timedelta(seconds=lead + i / args.rate),
            lease_timeout=timedelta(seconds=args.lease_seconds),
        )
        for i in range(count)
    ]
    ids: list[str] = []
    for i in range(0, count, 500):
        ids += [s.task.id for s in await submitter.submit_many(tasks[i : i + 500])]
    due_from = time.monotonic() + lead - 0.5
    fault_at = float("nan")
    victim = "node-1"
    if args.freeze:
        await asyncio.sleep(max(0.0, due_from - time.monotonic()) + args.seconds / 3)
        cluster.signal(victim, signal.SIGSTOP)
        fault_at = time.monotonic() - due_from
        await asyncio.sleep(args.freeze)
        cluster.signal(victim, signal.SIGCONT)
    if args.postgres_outage:
        assert cluster.postgres is not None
        await asyncio.sleep(max(0.0, due_from - time.monotonic()) + args.seconds / 3)
        await asyncio.to_thread(cluster.postgres.stop)
        fault_at = time.monotonic() - due_from
        await asyncio.sleep(args.postgres_outage)
        await asyncio.to_thread(cluster.postgres.start)
    for _ in range(int((args.seconds + 120) * 5)):  # until every task ran, or give up
        if {r[0] for r in runs} >= set(ids):
            break
        await asyncio.sleep(0.2)
    await asyncio.sleep(args.lease_seconds + 3)  # room for re-runs of tasks whose ack was lost
    for w in workers:
        w.stop()
    await asyncio.gather(*running, return_exceptions=True)
    never = set(ids) - {r[0] for r in runs}
    if never:
        states = Counter([(await submitter.get(i)).state.name for i in sorted(never)[:200]])
        print(f"{len(never)} tasks never ran; their states: {dict(states)}", flush=True)
    for c in clients:
        await c.close()

    first: dict[str, float] = {}
    for task_id, _, late, _ in sorted(runs, key=lambda r: r[3]):
        first.setdefault(task_id, late)
    lateness = sorted(first.values())
    executions = Counter(r[0] for r in runs)
    starts = sorted(r[3] for r in runs if due_from + 0.5 <= r[3] <= due_from + args.seconds)
    gap, gap_at = max(
        ((b - a, a - due_from) for a, b in itertools.pairwise(starts)), default=(0, 0)
    )
    p50, p99 = (stats.percentile(lateness, p) or 0.0 for p in (50, 99))
    print(
        f"freeze {args.freeze:g} s, PostgreSQL outage {args.postgres_outage:g} s"
        f"{', acks sent once' if args.no_ack_retry else ''}: {len(first)}/{len(ids)} tasks "
        f"ran; run lateness p50 {p50:.3f} s, p99 {p99:.3f} s, max {lateness[-1]:.3f} s; "
        f"longest gap in starts {gap:.2f} s (from +{gap_at:.1f} s; fault at +{fault_at:.1f} s); "
        f"duplicate executions "
        f"{sum(n - 1 for n in executions.values())}; "
        f"later attempts {sum(1 for r in runs if r[1] > 1)}; ack retries "
        f"{sum(getattr(w.stats, 'ack_retries', 0) for w in workers)}, failovers "
        f"{sum(getattr(c, 'failovers', 0) for c in clients)}",
        flush=True,
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=45.0, help="how long tasks come due")
    parser.add_argument("--rate", type=int, default=50, help="tasks due per second")
    parser.add_argument("--workers", type=int, default=3)
    parser.add_argument("--handler-ms", type=float, default=10.0, help="how long a task runs")
    parser.add_argument("--lease-seconds", type=float, default=5.0, help="the tasks' lease")
    parser.add_argument("--freeze", type=float, default=0.0, help="SIGSTOP one node this long")
    parser.add_argument(
        "--postgres-outage", type=float, default=0.0, help="stop PostgreSQL this long"
    )
    parser.add_argument(
        "--no-ack-retry", action="store_true", help="workers drop an ack batch that fails"
    )
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="chronoq-grey-") as tmp:
        spec = ClusterSpec(nodes=3, partitions=64, lease_ttl=2, tick_ms=50, durable=False)
        with LocalCluster(Path(tmp), spec) as cluster:
            asyncio.run(workload(cluster, args))


if __name__ == "__main__":
    main()
