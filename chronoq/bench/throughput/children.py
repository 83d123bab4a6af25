"""The benchmark's child processes, as ``chronoq.local.child.ChildProcess`` runs them.

A child prints ``READY <info>`` once it serves and one JSON line of its statistics when it
stops (SIGTERM, or its parent gone); both go to its log file, where the parent reads them.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import json
import logging
import os
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from chronoq.bench.raw import BenchError
from chronoq.bench.throughput.handler import noop, take_handler_legs, take_handler_starts
from chronoq.bench.throughput.results import PROTOCOLS, worker_protocol
from chronoq.client import Client, Worker
from chronoq.config import NodeSettings
from chronoq.diagnostics.task_rows import QUEUE
from chronoq.local.child import ChildProcess
from chronoq.node import Node
from chronoq.redact import split_password
from chronoq.signals import on_parent_gone, on_stop_signals, watched_parent

CHILD_MODULE = "chronoq.bench.throughput"


#: How often a starting child's log is read for its READY line (seconds).
READY_POLL_S = 0.05


class Child:
    """A child process running this package: ``READY <info>`` when up, a JSON line at exit;
    started, stopped and reaped by ``ChildProcess`` (the local stack's one way)."""

    def __init__(self, name: str, proc: ChildProcess, offset: int) -> None:
        self.name = name
        self.info = ""
        self._proc = proc
        self._offset = offset  # where this run's output starts in the (appended) log

    @property
    def pid(self) -> int:
        pid = self._proc.pid
        assert pid is not None
        return pid

    @property
    def alive(self) -> bool:
        return self._proc.alive()

    @classmethod
    async def spawn_node(cls, name: str, dsn: str, logs: Path) -> Child:
        """A node child on ``dsn``; its password goes in the environment, not the command line."""
        bare, password = split_password(dsn)
        return await cls.spawn(name, ["node", "--dsn", bare], logs, password=password)

    @classmethod
    async def spawn(
        cls,
        name: str,
        args: Sequence[str],
        logs: Path,
        within: float = 60.0,
        *,
        password: str | None = None,
    ) -> Child:
        """Start ``python -m chronoq.bench.throughput <args>``; wait ``within`` s for READY."""
        log = logs / f"{name}.log"
        offset = log.stat().st_size if log.exists() else 0
        proc = ChildProcess(log)
        proc.spawn(
            [sys.executable, "-m", CHILD_MODULE, *args],
            env={"PGPASSWORD": password} if password is not None else None,
        )
        child = cls(name, proc, offset)
        try:
            deadline = asyncio.get_running_loop().time() + within
            while not (ready := child._lines("READY ")):
                if not proc.alive() or asyncio.get_running_loop().time() > deadline:
                    raise BenchError(f"{name} did not start; {log} ends with:\n{tail(log)}")
                await asyncio.sleep(READY_POLL_S)
        except BaseException:
            await child.kill()
            raise
        child.info = ready[0].split(" ", 1)[1].strip()
        return child

    def _lines(self, prefix: str = "") -> list[str]:
        """This run's lines of the log that start with ``prefix``."""
        try:
            with self._proc.log_file.open("rb") as f:
                f.seek(self._offset)
                text = f.read().decode(errors="replace")
        except OSError:
            return []
        return [line for line in text.splitlines() if line.startswith(prefix)]

    async def stop(self, within: float = 30.0) -> dict[str, Any]:
        """SIGTERM it, wait for its exit, return its statistics; SIGKILL after ``within`` s."""
        await asyncio.to_thread(self._proc.terminate, within)
        for line in reversed(self._lines("{")):
            with contextlib.suppress(ValueError):
                stats = json.loads(line)
                if isinstance(stats, dict):
                    return stats
        return {}

    async def kill(self) -> None:
        await asyncio.to_thread(self._proc.kill)


def tail(log: Path, lines: int = 20) -> str:
    try:
        return "\n".join(log.read_text(errors="replace").splitlines()[-lines:])
    except OSError as exc:
        return f"<cannot read {log}: {exc}>"


def say(*words: object) -> None:
    print(*words, flush=True)


def on_stop(stop: Callable[[], None]) -> None:
    """Call ``stop`` on SIGTERM or SIGINT, or once the benchmark that started us is gone."""
    on_stop_signals(stop)
    parent = watched_parent()
    if parent is not None:
        on_parent_gone(parent, stop)


async def serve_node(dsn: str) -> None:
    node = Node(NodeSettings(dsn=dsn, port=0))
    await node.start()
    stats: dict[str, Any] = {}
    try:
        stopped = asyncio.Event()
        on_stop(stopped.set)
        say("READY", node.address)
        await stopped.wait()
        if node.firer is not None:
            stats = dataclasses.asdict(node.firer.stats)
    finally:
        await node.stop(grace=1.0)
    say(json.dumps(stats))


async def serve_worker(
    address: str, concurrency: int, worker_id: str, protocol: str, prefetch: int | None = None
) -> None:
    client = Client(address, timeout=60)
    try:
        await client.wait_ready(30)
        worker = Worker(
            client, {QUEUE: noop}, concurrency=concurrency, worker_id=worker_id,
            stream=worker_protocol(protocol)[0],
            claim_on_ack=worker_protocol(protocol)[1], prefetch=prefetch,
        )
        on_stop(worker.stop)
        say("READY", worker_id)
        stats = await worker.run()
    finally:
        await client.close()
    say(json.dumps({
        **dataclasses.asdict(stats), "start_lateness": take_handler_starts(),
        "start_legs": take_handler_legs(),
    }))


def child_main(argv: Sequence[str]) -> None:
    parser = argparse.ArgumentParser(prog=f"python -m {CHILD_MODULE}")
    roles = parser.add_subparsers(dest="role", required=True)
    node = roles.add_parser("node", help="serve a node until SIGTERM or its parent is gone")
    node.add_argument("--dsn", required=True)
    worker = roles.add_parser(
        "worker", help="run a no-op worker until SIGTERM or its parent is gone"
    )
    worker.add_argument("--address", required=True)
    worker.add_argument("--concurrency", type=int, default=64)
    worker.add_argument("--id", default=f"bench-{os.getpid()}")
    worker.add_argument("--protocol", choices=PROTOCOLS, default="stream")
    worker.add_argument("--prefetch", type=int, default=None)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(name)s %(message)s")
    if args.role == "node":
        asyncio.run(serve_node(args.dsn))
    else:
        asyncio.run(
            serve_worker(args.address, args.concurrency, args.id, args.protocol, args.prefetch)
        )
