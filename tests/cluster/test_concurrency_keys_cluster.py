"""Concurrency keys across a cluster: 3 node processes and worker processes on one store,
200 tasks over 20 keys with ``max_running_per_key=1``. The workers' own ledgers (start and end
of every run) show that no two runs of one key ever overlapped, while a node and a worker are
SIGKILLed (by the PIDs this test started) in the middle of the work; and that a key's starts
keep to its ``max_starts_per_key``, counted in windows (never timed one by one)."""

from __future__ import annotations

import asyncio
import itertools
import json
import signal
import sys
import time
import uuid
from collections import defaultdict
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from chronoq.local.child import ChildProcess, stop_all
from chronoq.models import TaskSpec, TaskState
from chronoq.store import Store
from tests.cluster.conftest import ClusterFactory

pytestmark = pytest.mark.timeout(180)

QUEUE = "keyed"
KEYS = 20
TASKS = 200
RUN_MS = 80
#: Long enough that a worker whose node died re-heartbeats through another node in time (no
#: lease of a live worker runs out: that would be a legitimate second run, not this test's).
LEASE = timedelta(seconds=8)


@dataclass
class Run:
    task: str
    key: str
    worker: str
    start: int
    end: int | None


def read_runs(folder: Path) -> list[Run]:
    runs: dict[tuple[str, int, str], Run] = {}
    for path in folder.glob("*.jsonl"):
        for raw in path.read_bytes().splitlines():
            try:
                rec = json.loads(raw)
            except ValueError:
                continue  # a torn last line of a killed worker
            ident = (rec["task"], rec["attempt"], rec["worker"])
            if rec["e"] == "start":
                runs[ident] = Run(rec["task"], rec["key"], rec["worker"], rec["t"], None)
            elif ident in runs:
                runs[ident].end = rec["t"]
    return list(runs.values())


def overlaps(runs: list[Run], killed_at: dict[str, int]) -> list[tuple[Run, Run]]:
    """Pairs of runs of one key that overlapped in time (a run without an end ended when its
    worker was killed)."""
    by_key: dict[str, list[Run]] = defaultdict(list)
    for run in runs:
        by_key[run.key].append(run)
    bad = []
    for key_runs in by_key.values():
        key_runs.sort(key=lambda r: r.start)
        for before, after in itertools.pairwise(key_runs):
            end = before.end if before.end is not None else killed_at.get(before.worker)
            assert end is not None, f"run of {before.task} on {before.worker} never ended"
            if after.start < end:
                bad.append((before, after))
    return bad


class Workers:
    def __init__(self, folder: Path, addresses: list[str]) -> None:
        self.folder = folder
        self.addresses = addresses
        self.procs: dict[str, ChildProcess] = {}

    def spawn(self, name: str, index: int, queue: str = QUEUE) -> ChildProcess:
        n = len(self.addresses)
        target = "ipv4:" + ",".join(self.addresses[(index + i) % n] for i in range(n))
        proc = ChildProcess(self.folder / f"{name}.log")
        proc.spawn(
            [
                sys.executable, "-m", "tests.cluster.key_worker", "--target", target,
                "--queue", queue, "--ledger", str(self.folder / f"{name}.jsonl"),
                "--worker-id", name, "--concurrency", "8",
            ]
        )
        self.procs[name] = proc
        return proc

    def open_runs(self, name: str) -> int:
        return sum(
            1 for r in read_runs(self.folder) if r.worker == name and r.end is None
        )


async def succeeded(store: Store) -> int:
    counts = await store.count_by_state()
    return counts.get(TaskState.SUCCEEDED, 0)


async def until(predicate: object, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while True:
        assert callable(predicate)
        if await predicate():
            return
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.1)


async def test_no_two_runs_of_a_key_overlap_while_a_node_and_a_worker_are_killed(
    make_cluster: ClusterFactory, tmp_path: Path
) -> None:
    cluster = make_cluster(nodes=3)
    folder = tmp_path / "ledgers"
    folder.mkdir()
    store = await Store.connect(cluster.dsn, partitions=16, min_size=1, max_size=4)
    workers = Workers(folder, list(cluster.addresses))
    try:
        now = datetime.now(UTC)
        await store.set_queue("default", QUEUE, now, max_running_per_key=1, cap=100)
        specs = [
            TaskSpec(
                queue=QUEUE,
                run_at=now,
                concurrency_key=f"customer-{i % KEYS}",
                payload=json.dumps({"key": f"customer-{i % KEYS}", "ms": RUN_MS}).encode(),
                lease_timeout=LEASE,
                idempotency_key=f"t-{uuid.uuid4().hex}",
            )
            for i in range(TASKS)
        ]
        await store.submit(specs, now)
        for i in range(3):
            workers.spawn(f"w{i}", i)
        await until(lambda: _at_least(store, 40), 60, "40 tasks done")
        # Mid-work: SIGKILL a node, then a worker with a task in its hands.
        victim_node = sorted(cluster.nodes)[0]
        cluster.kill(victim_node)
        killed_at: dict[str, int] = {}
        await until(lambda: _has_open(workers, "w0"), 20, "w0 mid-task")
        workers.procs["w0"].kill()
        killed_at["w0"] = time.time_ns()
        workers.spawn("w3", 1)  # the capacity back; w0's leases come back when reaped
        await until(lambda: _at_least(store, TASKS), 90, "every task done")
        runs = read_runs(folder)
        assert {r.key for r in runs} == {f"customer-{i}" for i in range(KEYS)}
        assert overlaps(runs, killed_at) == []
        # The kill really happened mid-run: w0 left runs without an end, run again elsewhere.
        assert any(r.worker == "w0" and r.end is None for r in runs)
        # The workers had more slots than keys: they ran as many keys at once as they could
        # (more than one), never two of one key.
        assert max(_concurrent(runs)) > 1
    finally:
        stop_all(list(workers.procs.values()), 10.0)
        for proc in workers.procs.values():
            if proc.alive():
                proc.signal(signal.SIGKILL)
        await store.close()


async def _at_least(store: Store, n: int) -> bool:
    return await succeeded(store) >= n


async def _has_open(workers: Workers, name: str) -> bool:
    return workers.open_runs(name) > 0


def _concurrent(runs: list[Run]) -> list[int]:
    """How many runs were in progress at each run's start (runs with an end)."""
    done = [r for r in runs if r.end is not None]
    return [sum(1 for o in done if o.start <= r.start < (o.end or 0)) for r in done]


RATE = 2.0  # starts per key and second
RATED_TASKS = 12  # per key
WINDOW_S = 2.0
#: How much later than its claim a handler may record its start (delivery over the stream,
#: a busy worker): generous, so that the bound below holds on a loaded machine.
JITTER_S = 1.0


async def test_starts_of_a_key_keep_to_its_rate_across_nodes(
    make_cluster: ClusterFactory, tmp_path: Path
) -> None:
    cluster = make_cluster(nodes=3)
    folder = tmp_path / "ledgers"
    folder.mkdir()
    store = await Store.connect(cluster.dsn, partitions=16, min_size=1, max_size=4)
    workers = Workers(folder, list(cluster.addresses))
    try:
        now = datetime.now(UTC)
        await store.set_queue("default", "rated", now, max_starts_per_key=RATE, cap=100)
        keys = [f"account-{i}" for i in range(4)]
        specs = [
            TaskSpec(
                queue="rated",
                run_at=now,
                concurrency_key=key,
                payload=json.dumps({"key": key, "ms": 10}).encode(),
            )
            for key in keys
            for _ in range(RATED_TASKS)
        ]
        await store.submit(specs, now)
        for i in range(3):  # 24 slots: without the rate, every task would start at once
            workers.spawn(f"r{i}", i, queue="rated")
        await until(lambda: _at_least(store, len(specs)), 60, "every rated task done")
        runs = read_runs(folder)
        for key in keys:
            starts = sorted(r.start / 1e9 for r in runs if r.key == key)
            assert len(starts) >= RATED_TASKS
            # A bucket of one token refilled at RATE: at most 1 + RATE x (window + jitter)
            # claims start in any window, whichever nodes claim them.
            most = max(sum(1 for t in starts if s <= t < s + WINDOW_S) for s in starts)
            assert most <= 1 + RATE * (WINDOW_S + JITTER_S), (key, most)
            # and the key's starts took at least (n - 1) / RATE, less the jitter
            assert starts[-1] - starts[0] >= (RATED_TASKS - 1) / RATE - JITTER_S
    finally:
        stop_all(list(workers.procs.values()), 10.0)
        await store.close()
