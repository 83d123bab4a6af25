"""``chronoq bench failover --pg-members 3``: how long a store failover stops submits and
firing, over repeated trials, and whether any acknowledged task is lost.

A real local cluster (etcd, N PostgreSQL members under Patroni, ``nodes`` node processes on
the multi-host DSN) takes a steady stream of submits: ``SUBMITTERS`` loops, each one task at
a time, due ``DUE_MS`` later. Each trial injects one store fault:

- *postmaster*: SIGKILL of the primary's postmaster (its Patroni restarts it);
- *member*: SIGKILL of the primary's Patroni and postgres (a lost machine: the others wait
  for Patroni's leader key to expire, then promote the synchronous standby);
- *switchover*: a graceful switchover through Patroni's REST API.

and measures, from the fault: *submits back*, until the first acknowledgement after the
longest gap between acknowledgements; *firing back*, until the first task submitted after
that gap fired (it was due ``DUE_MS`` after its submit, so that much is included). At the end
every acknowledged task is looked up: *acked lost* must be 0.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import statistics
import tempfile
import time
import uuid
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path

from rich.console import Console
from rich.table import Table

from chronoq.client import Client, NewTask
from chronoq.embedded.etcd import EmbeddedEtcd
from chronoq.embedded.ha import PatroniCluster
from chronoq.errors import StoreUnavailable
from chronoq.local.cluster import ClusterSpec, LocalCluster
from chronoq.store import Store

KINDS = ("postmaster", "member", "switchover")
#: Concurrent submit loops; each has one submit in flight at a time.
SUBMITTERS = 4
#: Each task is due this long after its submit (longer than a submit takes under load).
DUE_MS = 300
#: Seconds of steady acknowledgements before a fault, and after recovery.
SETTLE_S = 2.0
#: Seconds a trial may take before it is given up (a lost member takes ~20 s: Patroni's TTL).
TRIAL_TIMEOUT_S = 90.0
AIMS = {"postmaster": "≤ 5 s to firing", "member": "≈ TTL 20 s", "switchover": "≤ 6 s"}


@dataclass
class StoreTrial:
    kind: str
    member: str
    submit_back_s: float
    fire_back_s: float | None
    write_gap_s: float


@dataclass
class StoreFailoverReport:
    pg_members: int
    nodes: int
    partitions: int
    trials: list[StoreTrial] = field(default_factory=list)
    acked: int = 0
    acked_lost: int = 0


@dataclass
class _Acks:
    """(monotonic time of the ack, monotonic time the submit started, task id)."""

    rows: list[tuple[float, float, str]] = field(default_factory=list)
    failed: int = 0


def main(
    *,
    trials: int = 3,
    pg_members: int = 3,
    nodes: int = 2,
    partitions: int = 64,
    lease_ttl: int = 2,
    tick_ms: int = 50,
    kinds: tuple[str, ...] = KINDS,
    data_dir: Path | None = None,
    json_out: Path | None = None,
) -> StoreFailoverReport:
    """Run ``trials`` trials of each kind on a fresh local cluster and print the table."""
    console = Console()
    workdir = data_dir or Path(tempfile.mkdtemp(prefix="cqstorefail-"))
    workdir.mkdir(parents=True, exist_ok=True)
    etcd = EmbeddedEtcd(workdir / "etcd", durable=False)
    ha = PatroniCluster(workdir / "pg", [], members=pg_members, etcd_auth=etcd.patroni_auth())
    cluster: LocalCluster | None = None
    console.print(f"starting etcd, {pg_members} PostgreSQL members (Patroni), {nodes} nodes …")
    try:
        etcd.start()
        ha.etcd_endpoints = etcd.endpoints
        started = time.monotonic()
        ha.start(timeout=180)
        console.print(f"  PostgreSQL members ready in {time.monotonic() - started:.1f} s")
        dsn = ha.ensure_database("chronoq")
        spec = ClusterSpec(
            nodes=nodes,
            partitions=partitions,
            lease_ttl=lease_ttl,
            tick_ms=tick_ms,
            cluster="storebench",
            durable=False,
        )
        cluster = LocalCluster(workdir / "nodes", spec, etcd=etcd, dsn=dsn)
        cluster.start()
        report = asyncio.run(_run(ha, cluster, dsn, trials, kinds, console))
    finally:
        if cluster is not None:
            cluster.stop()
        ha.stop()
        etcd.stop()
    console.print(render(report))
    if json_out is not None:
        json_out.write_text(json.dumps(asdict(report), indent=2))
    return report


async def _run(
    ha: PatroniCluster,
    cluster: LocalCluster,
    dsn: str,
    trials: int,
    kinds: tuple[str, ...],
    console: Console,
) -> StoreFailoverReport:
    s = cluster.spec
    report = StoreFailoverReport(len(ha.members), s.nodes, s.partitions)
    acks = _Acks()
    client = Client(",".join(cluster.addresses), timeout=10)
    # min_size 0: no idle floor to restore (and log about) while the primary changes
    store = await Store.connect(dsn, partitions=s.partitions, min_size=0, max_size=2)
    loops = [asyncio.create_task(_submit_loop(client, acks)) for _ in range(SUBMITTERS)]
    try:
        for i in range(trials * len(kinds)):
            kind = kinds[i % len(kinds)]
            await asyncio.to_thread(ha.wait_ready, TRIAL_TIMEOUT_S)
            await asyncio.sleep(SETTLE_S)
            trial = await _trial(kind, ha, acks, store)
            report.trials.append(trial)
            fire = f"{trial.fire_back_s:.2f} s" if trial.fire_back_s is not None else "-"
            console.print(
                f"  {kind:10} {trial.member}: submits back after {trial.submit_back_s:.2f} s, "
                f"firing after {fire} (longest ack gap {trial.write_gap_s:.2f} s)"
            )
    finally:
        for loop in loops:
            loop.cancel()
        await asyncio.gather(*loops, return_exceptions=True)
        await client.close()
    try:
        report.acked = len(acks.rows)
        report.acked_lost = await _lost(store, [row[2] for row in acks.rows])
    finally:
        await store.close()
    return report


async def _submit_loop(client: Client, acks: _Acks) -> None:
    while True:
        started = time.monotonic()
        task = NewTask(
            queue="storefail",
            delay=timedelta(milliseconds=DUE_MS),
            idempotency_key=str(uuid.uuid4()),
        )
        try:
            [(task_id, _)] = await client.submit_ids([task])
        except Exception:  # noqa: BLE001 - an outage longer than the SDK waits: count, go on
            acks.failed += 1
            await asyncio.sleep(0.1)
            continue
        acks.rows.append((time.monotonic(), started, task_id))
        await asyncio.sleep(0.01)


async def _trial(kind: str, ha: PatroniCluster, acks: _Acks, store: Store) -> StoreTrial:
    t0, wall0 = time.monotonic(), datetime.now(UTC)
    if kind == "postmaster":
        member = await asyncio.to_thread(ha.kill_postmaster)
    elif kind == "member":
        member = await asyncio.to_thread(ha.kill_member)
    else:
        member = ha.leader() or "?"
        await asyncio.to_thread(ha.switchover)
    # Patroni notices a fault only on its next loop: its roles say nothing yet. A submit made
    # after the fault and acknowledged says that the store takes writes again.
    deadline = time.monotonic() + TRIAL_TIMEOUT_S
    while not any(started > t0 + 0.2 for _, started, _ in acks.rows[-50:]):
        if time.monotonic() > deadline:
            raise TimeoutError(f"{kind}: no submit acknowledged within {TRIAL_TIMEOUT_S:g} s")
        await asyncio.sleep(0.05)
    if kind == "member":
        await asyncio.to_thread(ha.restart_member, member, TRIAL_TIMEOUT_S)
    await asyncio.to_thread(ha.wait_ready, TRIAL_TIMEOUT_S)
    await asyncio.sleep(SETTLE_S)
    times = sorted(row[0] for row in acks.rows if row[0] >= t0)
    gap, gap_end = 0.0, t0
    for a, b in zip([t0, *times], times, strict=False):
        if b - a > gap:
            gap, gap_end = b - a, b
    # Submitted after the gap, on the primary that took over, and due later: their firing
    # shows that the firing loops came back too (a submit already due when it commits goes
    # straight to READY and would show nothing).
    after = [row[2] for row in acks.rows if row[1] >= gap_end]
    fired = await _first_fired(store, after)
    fire_back = (fired - wall0).total_seconds() if fired is not None else None
    return StoreTrial(kind, member, gap_end - t0, fire_back, gap)


async def _first_fired(store: Store, ids: list[str]) -> datetime | None:
    if not ids:
        return None
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        with contextlib.suppress(StoreUnavailable):  # the pool may still hold a dead one
            async with store.connection() as conn:
                first = await conn.fetchval(
                    "SELECT min(fired_at) FROM tasks_with_history WHERE id = ANY($1::uuid[])",
                    ids[:2000],
                )
            if first is not None:
                return first  # type: ignore[no-any-return]
        await asyncio.sleep(0.2)
    return None


async def _lost(store: Store, ids: list[str]) -> int:
    found = 0
    for start in range(0, len(ids), 5000):
        chunk = ids[start : start + 5000]
        for attempt in range(20):
            try:
                async with store.connection() as conn:
                    found += await conn.fetchval(
                        "SELECT count(*) FROM tasks_with_history WHERE id = ANY($1::uuid[])", chunk
                    )
                break
            except StoreUnavailable:
                if attempt == 19:
                    raise
                await asyncio.sleep(0.5)
    return len(ids) - found


def render(report: StoreFailoverReport) -> Table:
    table = Table(
        title=(
            f"store failover, {report.pg_members} PostgreSQL members (Patroni, synchronous), "
            f"{report.nodes} nodes, {report.partitions} partitions; acked {report.acked}, "
            f"acked lost {report.acked_lost}"
        )
    )
    for col in ("fault", "n", "measure", "min", "median", "max", "aim"):
        table.add_column(col, justify="left" if col in ("fault", "measure", "aim") else "right")
    for kind in KINDS:
        runs = [t for t in report.trials if t.kind == kind]
        measures = (
            ("submits back", [t.submit_back_s for t in runs]),
            ("firing back", [t.fire_back_s for t in runs if t.fire_back_s is not None]),
        )
        for label, values in measures:
            if values:
                table.add_row(
                    kind,
                    str(len(values)),
                    label,
                    f"{min(values):.2f} s",
                    f"{statistics.median(values):.2f} s",
                    f"{max(values):.2f} s",
                    AIMS[kind],
                )
    return table
