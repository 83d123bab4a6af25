"""Chaos worker processes: the chronoq Worker with a handler that writes the ledger.

Run as ``python -m chronoq.chaos.worker --target T --ledger FILE --worker-id w0.1``. The
handler's behaviour comes from the task's JSON payload, decided by the workload's seed, and is
the demo's (``chronoq.client.demo.scripted_failure``):
``{"sleep_ms": 120, "fail_attempts": 1, "fatal": false}`` sleeps, then fails while
``attempt <= fail_attempts`` (attempt-based, so a retry after a fault behaves the same), or
fails fatally. Workers are separate processes so the harness can SIGKILL or SIGSTOP them
mid-task; ``WorkerPool`` starts, signals and reaps them by PID.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import signal
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from chronoq.chaos.history import ERROR, FATAL, OK, STOPPED, to_us
from chronoq.chaos.ledger import SUFFIX, LedgerWriter, open_executions
from chronoq.client import Client, FatalTaskError, Handler, TaskContext, Worker
from chronoq.client.demo import DemoPayload, scripted_failure
from chronoq.local.child import ChildProcess, stop_all

QUEUE = "chaos"
#: How long stopping workers may let in-flight handlers finish (seconds).
STOP_GRACE_S = 15.0


def make_handler(ledger: LedgerWriter) -> Handler:
    async def handle(ctx: TaskContext) -> None:
        spec = DemoPayload.decode(ctx.payload)
        ledger.start(ctx.id, ctx.attempt, to_us(ctx.run_at), ctx.idempotency_key)
        try:
            await asyncio.sleep(spec.sleep_ms / 1000)
        except asyncio.CancelledError:
            ledger.end(ctx.id, ctx.attempt, STOPPED)
            raise
        failure = scripted_failure(spec, ctx.attempt)
        if failure is None:
            ledger.end(ctx.id, ctx.attempt, OK)
            return
        ledger.end(ctx.id, ctx.attempt, FATAL if isinstance(failure, FatalTaskError) else ERROR)
        raise failure

    return handle


async def _main(args: argparse.Namespace) -> None:
    ledger = LedgerWriter(Path(args.ledger), args.worker_id)
    client = Client(args.target, timeout=args.timeout)
    worker = Worker(
        client,
        {QUEUE: make_handler(ledger)},
        concurrency=args.concurrency,
        worker_id=args.worker_id,
    )
    worker.install_signal_handlers()
    try:
        await worker.run()
    finally:
        await client.close()
        ledger.close()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--target", required=True, help="gRPC target, e.g. ipv4:a:1,b:2")
    parser.add_argument("--ledger", required=True)
    parser.add_argument("--worker-id", required=True)
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--timeout", type=float, default=5.0)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(name)s %(message)s")
    asyncio.run(_main(args))


# ---------------------------------------------------------------------- the harness side


@dataclass
class WorkerProcess(ChildProcess):
    """One worker slot (``w1``) and its current process incarnation (``w1.3``)."""

    slot: str = ""
    incarnation: int = 0
    history: list[str] = field(default_factory=list)

    @property
    def name(self) -> str:
        return f"{self.slot}.{self.incarnation}"


class WorkerPool:
    """Starts worker processes, signals them mid-task, restarts them; reaps all by PID."""

    def __init__(
        self, addresses: list[str], ledger_dir: Path, log_dir: Path, *, count: int,
        concurrency: int = 16,
    ) -> None:
        self.addresses = addresses
        self.ledger_dir = ledger_dir
        self.log_dir = log_dir
        self.concurrency = concurrency
        self.workers = [WorkerProcess(log_dir / f"w{i}.log", slot=f"w{i}") for i in range(count)]

    def target_for(self, index: int) -> str:
        """Each worker lists the nodes in a different order: pick-first spreads them, and a
        dead node's workers fail over to the next one."""
        n = len(self.addresses)
        rotated = [self.addresses[(index + i) % n] for i in range(n)]
        return "ipv4:" + ",".join(rotated)

    def ledger_of(self, w: WorkerProcess) -> Path:
        return self.ledger_dir / f"{w.name}{SUFFIX}"

    def start_all(self) -> None:
        for i in range(len(self.workers)):
            self.spawn(i)

    def spawn(self, index: int) -> WorkerProcess:
        w = self.workers[index]
        w.incarnation += 1
        w.history.append(w.name)
        args = [
            sys.executable, "-m", "chronoq.chaos.worker", "--target", self.target_for(index),
            "--ledger", str(self.ledger_of(w)), "--worker-id", w.name,
            "--concurrency", str(self.concurrency),
        ]
        w.spawn(args)
        return w

    def in_flight(self, index: int) -> int:
        return open_executions(self.ledger_of(self.workers[index]))

    def wait_mid_task(self, index: int, timeout: float = 5.0) -> int:
        """Wait (bounded) until the worker has a handler running; returns how many."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            n = self.in_flight(index)
            if n:
                return n
            time.sleep(0.05)
        return 0

    def signal(self, index: int, sig: signal.Signals) -> None:
        self.workers[index].signal(sig)

    def kill(self, index: int) -> None:
        self.workers[index].kill()

    def stop_all(self, grace: float = STOP_GRACE_S) -> None:
        """Wake and SIGTERM every worker (graceful: in-flight handlers finish), then reap;
        SIGKILL whatever is still there after ``grace``."""
        stop_all(self.workers, grace)


if __name__ == "__main__":
    main()
