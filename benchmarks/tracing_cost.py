"""The cost of OpenTelemetry tracing, on and off, for tasks that carry a trace context.

``chronoq bench throughput`` loads its end-to-end tasks with COPY, so they carry no trace
context and a tracing node makes no spans for them: it measures tracing switched on but idle.
This measures traced tasks: each run submits ``--tasks`` tasks through the API (``submit_ids``
batches of 1,000, due a few seconds later), then in-process workers with a no-op handler run
them; runs alternate tracing off and on (on: every span, ``submit`` client and node, ``fire``,
``claim``, ``run``, is exported over OTLP/gRPC to a sink on loopback that counts them). Per run:
submit rate, end to end rate (first fire to last completion, from the store's timestamps), and
this process's CPU time per task (client, node and workers all run here; PostgreSQL does
not), which a loaded machine disturbs less than the rates.
A report, not a pass/fail test::

    python benchmarks/tracing_cost.py                      # embedded PostgreSQL, temp directory
    python benchmarks/tracing_cost.py --runs 3 --tasks 5000
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
import time
from concurrent import futures
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import asyncpg
import grpc
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc

from chronoq import tracing
from chronoq.client import Client, NewTask, TaskContext, Worker
from chronoq.config import NodeSettings
from chronoq.embedded.postgres import EmbeddedPostgres
from chronoq.node import Node

BATCH = 1000
QUEUE = "bench"
#: Tasks come due this long after the submit phase starts, per task submitted (at least
#: LEAD_MIN): the submit should finish first, or late tasks go READY at once, unfired.
LEAD_PER_TASK = timedelta(milliseconds=4)
LEAD_MIN = timedelta(seconds=5)


class Sink(trace_service_pb2_grpc.TraceServiceServicer):
    """An OTLP trace receiver on loopback that counts spans and keeps nothing."""

    def __init__(self) -> None:
        self.spans = 0

    def Export(self, request: Any, context: Any) -> Any:
        self.spans += sum(len(s.spans) for r in request.resource_spans for s in r.scope_spans)
        return trace_service_pb2.ExportTraceServiceResponse()


async def _noop(ctx: TaskContext) -> None:
    pass


async def one_run(dsn: str, tasks: int, workers: int, concurrency: int) -> dict[str, float]:
    node = Node(NodeSettings(dsn=dsn, port=0))
    await node.start()
    client = Client(node.address, timeout=60)
    pool = [Client(node.address, timeout=60) for _ in range(workers)]
    runners = [Worker(c, {QUEUE: _noop}, concurrency=concurrency) for c in pool]
    runs = [asyncio.create_task(w.run()) for w in runners]
    try:
        lead = max(LEAD_MIN, LEAD_PER_TASK * tasks)
        due = datetime.now(UTC) + lead
        started, cpu_started = time.perf_counter(), time.process_time()
        for i in range(0, tasks, BATCH):
            n = min(BATCH, tasks - i)
            await client.submit_ids([NewTask(queue=QUEUE, run_at=due) for _ in range(n)])
        submit_s = time.perf_counter() - started
        submit_cpu = time.process_time() - cpu_started
        conn = await asyncpg.connect(dsn)
        try:
            deadline = time.monotonic() + 120 + tasks / 100
            while (
                await conn.fetchval("SELECT count(*) FROM tasks_with_history WHERE state = 3")
                < tasks
            ):
                assert time.monotonic() < deadline, "tasks did not all complete"
                await asyncio.sleep(0.1)
            run_cpu = time.process_time() - cpu_started - submit_cpu
            row = await conn.fetchrow(
                "SELECT min(fired_at) AS first, max(finished_at) AS last,"
                " count(*) FILTER (WHERE trace_context IS NOT NULL) AS traced"
                " FROM tasks_with_history"
            )
        finally:
            await conn.close()
    finally:
        for w in runners:
            w.stop()
        await asyncio.gather(*runs)
        for c in (client, *pool):
            await c.close()
        await node.stop(grace=1)
    e2e_s = (row["last"] - row["first"]).total_seconds()
    return {
        "submit_per_s": tasks / submit_s,
        "e2e_per_s": tasks / e2e_s,
        "submit_cpu_us": submit_cpu / tasks * 1e6,
        "run_cpu_us": run_cpu / tasks * 1e6,
        "traced_tasks": float(row["traced"]),
        "late_submit": float(submit_s > lead.total_seconds()),
    }


async def run(runs: int, tasks: int, workers: int, concurrency: int) -> None:
    sink = Sink()
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    trace_service_pb2_grpc.add_TraceServiceServicer_to_server(sink, server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    results: dict[str, list[dict[str, float]]] = {"off": [], "on": []}
    try:
        with tempfile.TemporaryDirectory(prefix="chronoq-tracing-") as tmp:
            pg = EmbeddedPostgres(Path(tmp) / "pgdata", durable=False)
            pg.start()
            try:
                for i in range(runs):
                    for mode in ("off", "on"):
                        if mode == "on":
                            tracing.configure(
                                f"http://127.0.0.1:{port}", service_name="chronoq-bench"
                            )
                        dsn = pg.create_database(f"tracing_{mode}_{i}")
                        before = sink.spans
                        try:
                            figures = await one_run(dsn, tasks, workers, concurrency)
                        finally:
                            tracing.shutdown()  # flushes what the batch processor holds
                        figures["spans"] = float(sink.spans - before)
                        results[mode].append(figures)
                        print(
                            f"run {i + 1} tracing {mode:>3}: submit {figures['submit_per_s']:,.0f}"
                            f" tasks/s, end to end {figures['e2e_per_s']:,.0f} tasks/s, "
                            f"CPU per task: submit {figures['submit_cpu_us']:,.0f} µs, fire to "
                            f"completion {figures['run_cpu_us']:,.0f} µs; "
                            f"{figures['traced_tasks']:,.0f} traced tasks, "
                            f"{figures['spans']:,.0f} spans exported"
                            + (" (submit outlasted the lead)" if figures["late_submit"] else ""),
                            flush=True,
                        )
            finally:
                pg.stop()
    finally:
        server.stop(None)
    for key in ("submit_per_s", "e2e_per_s", "submit_cpu_us", "run_cpu_us"):
        off = statistics.median(r[key] for r in results["off"])
        on = statistics.median(r[key] for r in results["on"])
        print(f"median {key}: off {off:,.0f}, on {on:,.0f} ({(on - off) / off:+.1%})")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3, help="pairs of runs (off, then on)")
    parser.add_argument("--tasks", type=int, default=5000)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--concurrency", type=int, default=64)
    args = parser.parse_args()
    asyncio.run(run(args.runs, args.tasks, args.workers, args.concurrency))


if __name__ == "__main__":
    main()
