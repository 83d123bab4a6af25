"""The benchmark's figures (one dataclass per phase), its options and targets."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any

from rich.console import Console

from chronoq.bench.raw import (
    Databases,
    RawCeilings,
)

PHASES = ("raw", "submit", "fire", "e2e", "lateness", "rss", "keys", "backlog", "shards")


#: What runs unless ``phases`` says otherwise: all but the backlog phase (minutes of loading)
#: and the shards phase (a local stack per shard count, on request: ``store_shards``).
DEFAULT_PHASES = PHASES[:-2]
#: What runs when ``store_shards`` is given and ``phases`` is not: the ceilings of one server,
#: then a stack per shard count.
SHARD_PHASES = ("raw", "shards")
#: Nodes of each shard count's stack: node processes on an etcd for every count alike (one
#: shard would otherwise run its node in the benchmark's process, and compare unfairly).
SHARD_NODES = 2


#: The backlog penalty allowed: throughput and lateness within this fraction of the empty case.
BACKLOG_TOLERANCE = 0.10


#: The largest backlog the phase loads (100M: the design's headline; ~40 GB of disk).
MAX_BACKLOG = 100_000_000


#: Tasks of the backlog are due from this far ahead, over one day: none fires during a run.
BACKLOG_FROM = timedelta(days=1)
#: Measurements per backlog size at most (each is seconds; the load is the long part).
MAX_BACKLOG_RUNS = 20


LAYOUTS = ("in-process", "processes")


#: The goals the benchmark prints its figures against (issue "ten thousand tasks a second").
TARGET_SUBMIT_PER_S = 30_000
#: End to end, tasks/s by (workers, concurrency); other shapes are held to the 4 x 64 goal.
TARGET_E2E_PER_S = {(4, 64): 10_000, (2, 20): 6_000}
#: End to end at 4 x 64 as a share of the same run's raw pipeline.
TARGET_E2E_VS_RAW = 0.45
TARGET_P99_MS = 250.0
TARGET_DUE_RATE = 1_000


def e2e_target(workers: int, concurrency: int) -> int:
    """The end-to-end goal for this worker shape."""
    return TARGET_E2E_PER_S.get((workers, concurrency), TARGET_E2E_PER_S[(4, 64)])


SUBMIT_BATCH = 1000


@dataclass
class SubmitRun:
    submitters: int
    tasks: int
    seconds: float
    tasks_per_s: float
    # CPU time per task while submitting: the submitting clients (this process), the node,
    # PostgreSQL's processes
    client_cpu_us_per_task: float = 0.0
    node_cpu_us_per_task: float = 0.0
    postgres_cpu_us_per_task: float = 0.0


@dataclass
class FireRun:
    tasks: int
    seconds: float
    tasks_per_s: float
    statements: int
    ticks: int


@dataclass
class KeyedRun:
    """The end-to-end run with every task under one of ``keys`` concurrency keys of its queue
    (``max_running_per_key`` = ``limit``), beside the same run without keys."""

    keys: int
    limit: int
    plain: EndToEndRun
    keyed: EndToEndRun

    @property
    def cost(self) -> float:
        """The share of the plain run's rate that the keys cost (0.2: 20 % slower)."""
        if self.plain.tasks_per_s <= 0:
            return 0.0
        return 1 - self.keyed.tasks_per_s / self.plain.tasks_per_s


@dataclass
class EndToEndRun:
    layout: str
    workers: int
    concurrency: int
    tasks: int
    completed: int
    seconds: float  # first fire to last completion, from the store's timestamps
    tasks_per_s: float
    claimed: int
    # PostgreSQL transactions (statements, here) per task: fire, claim, complete, pool resets,
    # idle polls; batching shows up as a small number
    pg_transactions_per_task: float
    # CPU time per task over the run (user + system), robust where wall time is not on a
    # shared machine: the benchmark process (the node, and the workers when in-process), the
    # worker processes, and the PostgreSQL server's processes.
    node_cpu_us_per_task: float = 0.0
    workers_cpu_us_per_task: float = 0.0
    postgres_cpu_us_per_task: float = 0.0
    claimed_on_ack: int = 0
    protocol: str = "stream"  # how the workers got tasks (``PROTOCOLS``)
    prefetch: int | None = None  # tasks a worker may hold beyond its slots (None: its default)


@dataclass
class LatenessRun:
    due_rate: int
    seconds: float
    tasks: int
    fired: int
    completed: int
    worker_layout: str
    submit_seconds: float
    submit_overran: bool  # the first run_at passed before the last batch was accepted
    store_p50_ms: float
    store_p99_ms: float
    store_max_ms: float
    node_p50_ms: float
    node_p99_ms: float
    node_max_ms: float
    # run_at to the handler's start (fire, commit, wake-up, claim, gRPC): what a user sees
    handler_p50_ms: float
    handler_p99_ms: float
    handler_max_ms: float


@dataclass
class RssRun:
    pending: int
    load_seconds: float
    settle_seconds: float
    rss_kib: int
    hwm_kib: int
    ticks: int


@dataclass
class BacklogRun:
    """End to end and lateness with ``pending`` tasks due tomorrow, beside the same phase's
    run on an empty table (``pending`` 0), measured back to back."""

    pending: int
    load_seconds: float
    end_to_end: EndToEndRun  # the median run by throughput
    lateness: LatenessRun  # the median run by firing lateness p99
    #: Every measurement, in order (``backlog_runs`` of each).
    end_to_end_runs: list[EndToEndRun] = field(default_factory=list)
    lateness_runs: list[LatenessRun] = field(default_factory=list)


@dataclass
class ShardServerRun:
    """One store shard's server during a ``ShardRun``: the tasks it took and its CPU."""

    name: str
    tasks: int  # of the run's submitted tasks, the ones this shard holds
    submit_cpu_s: float  # the server's CPU seconds while the tasks were submitted
    e2e_cpu_s: float  # ... while the end-to-end tasks fired and ran


@dataclass
class ShardRun:
    """``shards`` store shards, each its own PostgreSQL server on this machine, behind the
    same nodes: submit, fire and end-to-end rates, and each server's share and CPU."""

    shards: int
    nodes: int
    tasks: int
    submit_per_s: float
    fire_per_s: float
    e2e_per_s: float
    servers: list[ShardServerRun] = field(default_factory=list)

    def share(self, server: ShardServerRun) -> float:
        """The fraction of the submitted tasks that this server holds (ideally 1/N)."""
        total = sum(s.tasks for s in self.servers)
        return server.tasks / total if total else 0.0

    def cpu_us_per_task(self, server: ShardServerRun, *, e2e: bool = False) -> float:
        """The server's CPU per task of the whole run (all shards' tasks)."""
        cpu = server.e2e_cpu_s if e2e else server.submit_cpu_s
        return cpu * 1e6 / self.tasks if self.tasks else 0.0

    def cpu_us_per_own_task(self, server: ShardServerRun, *, e2e: bool = False) -> float:
        """The server's CPU per task it holds: what one more of its tasks costs it."""
        cpu = server.e2e_cpu_s if e2e else server.submit_cpu_s
        return cpu * 1e6 / server.tasks if server.tasks else 0.0

    def total_cpu_us_per_task(self, *, e2e: bool = False) -> float:
        """Every server's CPU per task, summed: N servers should cost what one did."""
        return sum(self.cpu_us_per_task(s, e2e=e2e) for s in self.servers)


@dataclass
class Report:
    started_at: str
    machine: dict[str, Any]
    postgres: dict[str, Any]
    params: dict[str, Any]
    raw: RawCeilings | None = None
    submit: list[SubmitRun] = field(default_factory=list)
    fire: FireRun | None = None
    end_to_end: list[EndToEndRun] = field(default_factory=list)
    lateness: LatenessRun | None = None
    rss: list[RssRun] = field(default_factory=list)
    backlog: list[BacklogRun] = field(default_factory=list)
    shards: list[ShardRun] = field(default_factory=list)
    keyed: list[KeyedRun] = field(default_factory=list)

    def best_end_to_end(self) -> EndToEndRun | None:
        return max(self.end_to_end, key=lambda r: r.tasks_per_s, default=None)

    def ratios(self) -> dict[str, float]:
        """chronoq figure / raw ceiling, for each figure that has one."""
        out: dict[str, float] = {}
        raw = self.raw
        if raw is None:
            return out
        for run in self.submit:
            out[f"submit_{run.submitters}_vs_raw_insert"] = (
                run.tasks_per_s / raw.insert_with(run.submitters)
            )
        if self.fire is not None:
            out["fire_vs_raw_fire"] = self.fire.tasks_per_s / raw.fire_per_s
        for e2e in self.end_to_end:
            out[f"e2e_{e2e.layout}_vs_raw_pipeline"] = e2e.tasks_per_s / raw.pipeline_per_s
        return out

    def to_json(self) -> dict[str, Any]:
        data = dataclasses.asdict(self)
        if self.raw is not None:
            data["raw"]["pipeline_per_s"] = self.raw.pipeline_per_s
        best = self.best_end_to_end()
        data["end_to_end_best"] = None if best is None else {
            "layout": best.layout, "tasks_per_s": best.tasks_per_s,
        }
        if len(self.rss) >= 2:
            data["rss_growth_kib"] = self.rss[-1].rss_kib - self.rss[0].rss_kib
        data["ratios"] = self.ratios()
        data["targets"] = {
            "submit_batched_per_s": TARGET_SUBMIT_PER_S,
            "end_to_end_per_s": {f"{w}x{c}": t for (w, c), t in TARGET_E2E_PER_S.items()},
            "end_to_end_vs_raw_pipeline": TARGET_E2E_VS_RAW,
            "lateness_p99_ms": TARGET_P99_MS,
            "lateness_due_rate": TARGET_DUE_RATE,
        }
        return data


#: How benchmark workers get tasks (``Options.protocol``).
PROTOCOLS = ("stream", "riding", "claims")


def worker_protocol(protocol: str) -> tuple[bool, bool]:
    """The ``Worker`` arguments ``(stream, claim_on_ack)`` of a protocol of ``PROTOCOLS``."""
    return protocol == "stream", protocol != "claims"


@dataclass(frozen=True, kw_only=True)
class Options:
    tasks: int
    workers: int
    concurrency: int
    due_rate: int
    lateness_seconds: float
    pending_sizes: tuple[int, ...]
    backlog_sizes: tuple[int, ...]
    submitters: tuple[int, ...]
    layouts: tuple[str, ...]
    phases: tuple[str, ...]
    rss_settle_seconds: float
    logs: Path
    #: How workers get tasks: ``stream`` (pushed on a Work stream), ``riding`` (claims that
    #: ride on ack batches, plus long-polls), ``claims`` (long-polls only).
    protocol: str = "stream"
    #: Tasks each worker may hold beyond its running ones (``Worker(prefetch=)``; None: the
    #: worker's default).
    prefetch: int | None = None
    #: Measurements of each backlog size (and of the empty table) on its once-loaded table;
    #: the backlog phase compares their medians.
    backlog_runs: int = 1
    #: Store shard counts of the shards phase, each its own local stack.
    store_shards: tuple[int, ...] = (1, 2)


@dataclass
class Context:
    opts: Options
    db: Databases
    console: Console
    report: Report
    postgres: int | None = None  # the embedded server's postmaster, for its CPU time
