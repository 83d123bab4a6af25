"""``chronoq bench failover``: how fast partitions change hands, over repeated trials.

A real local cluster (etcd, PostgreSQL, ``nodes`` node processes) fires a steady stream of
tasks due across every partition. Each trial takes the node that owns the most partitions
and either SIGKILLs it (failover: the others wait for its etcd lease to expire) or SIGTERMs
it (graceful handoff: it revokes its lease and the watchers take over at once), then
measures, from the signal:

- *re-owned*: until etcd shows every one of its partitions owned by another node;
- *first fire*: until the first task of those partitions fired by a new owner (the store's
  ``fired_at`` and ``fired_by``).

The node is started again before the next trial. Results print as min / median / max.

With ``pg_members`` > 1 the store fails over instead (``chronoq.bench.store_failover``).
"""

from __future__ import annotations

import asyncio
import json
import signal
import statistics
import tempfile
import time
from collections import Counter
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path

from rich.console import Console
from rich.table import Table

from chronoq.bench import store_failover
from chronoq.bench.store_failover import StoreFailoverReport
from chronoq.client import Client, NewTask
from chronoq.coordinator.etcd import Keys, connect
from chronoq.coordinator.view import PrefixView
from chronoq.local.cluster import ClusterSpec, LocalCluster
from chronoq.store import Store


@dataclass
class Trial:
    kind: str  # "kill" or "graceful"
    victim: str
    partitions: int
    reowned_s: float
    first_fire_s: float | None


@dataclass
class FailoverReport:
    lease_ttl: int
    tick_ms: int
    nodes: int
    partitions: int
    trials: list[Trial] = field(default_factory=list)


def main(
    *,
    trials: int = 5,
    nodes: int = 3,
    partitions: int = 64,
    lease_ttl: int = 2,
    tick_ms: int = 50,
    data_dir: Path | None = None,
    json_out: Path | None = None,
    pg_members: int = 1,
) -> FailoverReport | StoreFailoverReport:
    """Run the trials on a fresh local cluster and print the table."""
    if pg_members > 1:
        return store_failover.main(
            trials=trials,
            pg_members=pg_members,
            nodes=nodes,
            partitions=partitions,
            lease_ttl=lease_ttl,
            tick_ms=tick_ms,
            data_dir=data_dir,
            json_out=json_out,
        )
    console = Console()
    workdir = data_dir or Path(tempfile.mkdtemp(prefix="cqfailover-"))
    spec = ClusterSpec(
        nodes=nodes,
        partitions=partitions,
        lease_ttl=lease_ttl,
        tick_ms=tick_ms,
        cluster="bench",
        durable=False,
    )
    cluster = LocalCluster(workdir, spec)
    console.print(f"starting etcd, PostgreSQL and {nodes} nodes in {workdir} …")
    cluster.start()
    try:
        report = asyncio.run(_run(cluster, trials, console))
    finally:
        cluster.stop()
    console.print(render(report))
    if json_out is not None:
        json_out.write_text(json.dumps(_as_dict(report), indent=2))
    return report


async def _run(cluster: LocalCluster, trials: int, console: Console) -> FailoverReport:
    s = cluster.spec
    report = FailoverReport(s.lease_ttl, s.tick_ms, s.nodes, s.partitions)
    keys = Keys(s.cluster)
    etcd = connect(cluster.etcd_settings(s.cluster))
    owners = PrefixView(etcd, keys.owners)
    await owners.start()
    store = await Store.connect(cluster.dsn, partitions=s.partitions, min_size=1, max_size=2)
    feeder = asyncio.create_task(_feed(cluster))
    try:
        for i in range(trials * 2):
            kind = "kill" if i % 2 == 0 else "graceful"
            await _settle(owners, keys, cluster, s.partitions)
            trial = await _trial(kind, cluster, owners, keys, store)
            report.trials.append(trial)
            console.print(
                f"  {kind:8} {trial.victim}: {trial.partitions} partitions re-owned in "
                f"{trial.reowned_s * 1000:.0f} ms, first fire after "
                + (f"{trial.first_fire_s * 1000:.0f} ms" if trial.first_fire_s is not None else "-")
            )
            cluster.restart_node(trial.victim)
    finally:
        feeder.cancel()
        await owners.stop()
        await etcd.close()
        await store.close()
    return report


def _owners(owners: PrefixView, keys: Keys) -> dict[int, str]:
    return {keys.partition_of(e.key): e.value.decode() for e in owners.items.values()}


async def _settle(owners: PrefixView, keys: Keys, cluster: LocalCluster, partitions: int) -> None:
    deadline = time.monotonic() + 30
    live = {n for n, p in cluster.nodes.items() if p.alive()}
    while True:
        current = _owners(owners, keys)
        if len(current) == partitions and set(current.values()) == live:
            await asyncio.sleep(0.5)
            if _owners(owners, keys) == current:
                return
        if time.monotonic() > deadline:
            raise TimeoutError(f"cluster did not settle: {Counter(current.values())}")
        await asyncio.sleep(0.02)


async def _trial(
    kind: str, cluster: LocalCluster, owners: PrefixView, keys: Keys, store: Store
) -> Trial:
    current = _owners(owners, keys)
    victim = Counter(current.values()).most_common(1)[0][0]
    lost = {p for p, n in current.items() if n == victim}
    signalled_at = datetime.now(UTC)
    t0 = time.monotonic()
    cluster.signal(victim, signal.SIGKILL if kind == "kill" else signal.SIGTERM)
    while True:
        now = _owners(owners, keys)
        if all(p in now and now[p] != victim for p in lost):
            reowned = time.monotonic() - t0
            break
        if time.monotonic() - t0 > 60:
            raise TimeoutError(f"{victim}'s partitions were not re-owned")
        await asyncio.sleep(0.002)
    first_fire = await _first_fire(store, lost, victim, signalled_at)
    cluster.terminate(victim)  # reap it (no-op when killed)
    return Trial(kind, victim, len(lost), reowned, first_fire)


async def _first_fire(store: Store, lost: set[int], victim: str, since: datetime) -> float | None:
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        async with store.pool.acquire() as conn:
            first = await conn.fetchval(
                "SELECT min(fired_at) FROM tasks_with_history WHERE partition = ANY($1::smallint[])"
                " AND fired_at > $2 AND fired_by <> $3 AND fire_token IS NOT NULL",
                sorted(lost),
                since,
                victim,
            )
        if first is not None:
            return float((first - since).total_seconds())
        await asyncio.sleep(0.2)
    return None


async def _feed(cluster: LocalCluster) -> None:
    """Keep tasks coming due every 5 ms (about 12 per partition per second at 64)."""
    client = Client(cluster.addresses[0])
    try:
        while True:
            live = cluster.addresses
            if live and client.target not in live:
                await client.close()
                client = Client(live[0])
            batch = [
                NewTask(queue="failover", delay=timedelta(milliseconds=5 * i)) for i in range(400)
            ]
            try:
                await client.submit_ids(batch)
            except Exception:  # noqa: BLE001 - the node we talk to may be the one killed
                await asyncio.sleep(0.1)
                continue
            await asyncio.sleep(1.5)
    finally:
        await client.close()


def render(report: FailoverReport) -> Table:
    table = Table(
        title=(
            f"failover and handoff, {report.nodes} nodes, {report.partitions} partitions, "
            f"lease TTL {report.lease_ttl} s, tick {report.tick_ms} ms"
        )
    )
    for col in ("trial", "n", "measure", "min", "median", "max", "aim"):
        table.add_column(col, justify="right" if col not in ("trial", "measure") else "left")
    aims = {"kill": f"≤ TTL + 1 s = {report.lease_ttl + 1} s", "graceful": "< 100 ms"}
    for kind in ("kill", "graceful"):
        runs = [t for t in report.trials if t.kind == kind]
        for label, values in (
            ("re-owned", [t.reowned_s for t in runs]),
            (
                "first fire by new owner",
                [t.first_fire_s for t in runs if t.first_fire_s is not None],
            ),
        ):
            if not values:
                continue
            table.add_row(
                kind,
                str(len(values)),
                label,
                _ms(min(values)),
                _ms(statistics.median(values)),
                _ms(max(values)),
                aims[kind],
            )
    return table


def _ms(seconds: float) -> str:
    return f"{seconds * 1000:.0f} ms"


def _as_dict(report: FailoverReport) -> dict[str, object]:
    return {
        "lease_ttl": report.lease_ttl,
        "tick_ms": report.tick_ms,
        "nodes": report.nodes,
        "partitions": report.partitions,
        "trials": [t.__dict__ for t in report.trials],
    }
