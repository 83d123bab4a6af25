"""Online moves through live node processes: partitions move between two real PostgreSQL
store shards (MovePartitions, Rebalance after AddShard) while keyed tasks are submitted
through the SDK, fired and worked. Every submitted task ends on exactly one shard, once,
none lost, none early, every extra run a retry; the moved partitions fire on their new
shard (their owner's fence is there); the source keeps none of their rows."""

from __future__ import annotations

import asyncio
import contextlib
import random
import time
import uuid
from collections.abc import AsyncIterator, Iterator, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import asyncpg
import pytest

from chronoq.client import Client, NewTask, Worker
from chronoq.client.context import TaskContext
from chronoq.embedded.postgres import EmbeddedPostgres
from chronoq.errors import ChronoqError
from chronoq.local.cluster import LocalCluster
from chronoq.models import TaskState
from chronoq.routing import id_partition, key_partition
from tests.cluster.conftest import ClusterFactory

pytestmark = pytest.mark.timeout(300)

P = 16
QUEUE = "moving"


@pytest.fixture
def second_server(tmp_path: Path) -> Iterator[EmbeddedPostgres]:
    """shard-1's own PostgreSQL server (killed by PID in the interruption tests: durable,
    or a commit acknowledged before its WAL was written would be lost with the process)."""
    server = EmbeddedPostgres(tmp_path / "pg-shard-1", durable=True)
    try:
        server.start()
        yield server
    finally:
        server.stop()


@dataclass
class Run:
    """One execution a worker saw: the task, its attempt, when it started, its run_at."""

    task: str
    attempt: int
    started: datetime
    run_at: datetime


@dataclass
class Workload:
    """Keyed submits through the SDK (retried with the same key on an error) and a worker
    that records every execution, independent of the store."""

    addresses: Sequence[str]
    namespace: str = "default"
    submitted: dict[str, tuple[str, datetime]] = field(default_factory=dict)  # key -> id
    submitted_at: dict[str, float] = field(default_factory=dict)  # key -> monotonic
    errors: list[str] = field(default_factory=list)
    runs: list[Run] = field(default_factory=list)
    stop: asyncio.Event = field(default_factory=asyncio.Event)  # no more submits
    finish: asyncio.Event = field(default_factory=asyncio.Event)  # the worker stops

    async def submit(self, rate: float = 40.0, spread: float = 2.0) -> None:
        client = Client(",".join(self.addresses), timeout=10)
        rng = random.Random(7)
        try:
            i = 0
            while not self.stop.is_set():
                key = f"k-{i}"
                i += 1
                run_at = datetime.now(UTC) + timedelta(seconds=rng.uniform(0.2, spread))
                for _ in range(150):  # a refusal (cut-over, outage) is repeated, same key
                    try:
                        out = await client.submit(QUEUE, idempotency_key=key, run_at=run_at)
                    except ChronoqError as exc:
                        self.errors.append(f"{key}: {type(exc).__name__}: {exc.message}")
                        await asyncio.sleep(0.2)
                        continue
                    self.submitted[key] = (out.task.id, out.task.run_at)
                    self.submitted_at[key] = time.monotonic()
                    break
                else:
                    raise AssertionError(f"{key} not accepted in 150 tries: {self.errors[-3:]}")
                await asyncio.sleep(1 / rate)
        finally:
            await client.close()

    async def work(self) -> None:
        client = Client(",".join(self.addresses), timeout=10)

        async def handle(ctx: TaskContext) -> None:
            self.runs.append(Run(ctx.id, ctx.attempt, datetime.now(UTC), ctx.task.run_at))

        worker = Worker(client, {QUEUE: handle}, concurrency=20)
        running = asyncio.create_task(worker.run())
        try:
            await self.finish.wait()
        finally:
            worker.stop()
            with contextlib.suppress(Exception):
                await asyncio.wait_for(running, 30)
            await client.close()

    def done(self) -> set[str]:
        return {r.task for r in self.runs}


async def _all_ran(workload: Workload) -> bool:
    done = workload.done()
    return all(i in done for i, _ in workload.submitted.values())


@contextlib.asynccontextmanager
async def running(workload: Workload) -> AsyncIterator[Workload]:
    """Submits run inside the block; the worker until every accepted task ran (bounded)."""
    submits = asyncio.create_task(workload.submit())
    work = asyncio.create_task(workload.work())
    try:
        yield workload
        workload.stop.set()
        await asyncio.wait_for(submits, 60)
        try:
            await until(lambda: _all_ran(workload), 90, "every accepted task ran")
        except AssertionError:
            done = workload.done()
            missing = [(k, i) for k, (i, _) in workload.submitted.items() if i not in done]
            raise AssertionError(
                f"{len(missing)} accepted tasks never ran, e.g. "
                f"{[(k, i, id_partition(uuid.UUID(i), P)) for k, i in missing[:5]]}"
            ) from None
        await asyncio.sleep(1)  # an extra run, if any, is seen
    finally:
        workload.stop.set()
        workload.finish.set()
        for t in (submits, work):
            with contextlib.suppress(Exception):
                await asyncio.wait_for(t, 40)


async def until(check: Any, timeout: float, what: str) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        got = await check()
        if got:
            return got
        assert time.monotonic() < deadline, f"{what} not reached in {timeout} s"
        await asyncio.sleep(0.25)


async def placement_of(admin: Client) -> dict[int, str]:
    """Each partition's shard, from a Status that lists every partition: a node restarted a
    moment before may still be taking its partitions over, and an unowned one is not listed."""

    async def listed() -> dict[int, str] | None:
        status = await admin.status()
        placement = {o.partition: o.shard for o in status.ownership}
        return placement if len(placement) == P else None

    placement: dict[int, str] = await until(listed, 30, "every partition owned")
    return placement


async def move_finished(admin: Client, move_id: str) -> Any:
    """The move's final status, or None while it runs."""
    status = await admin.status()
    assert status.shard_map is not None
    for m in status.shard_map.moves:
        if m.id == move_id and m.phase in ("done", "rolled_back"):
            return m
    return None


async def fetch(dsn: str, query: str, *args: Any) -> list[asyncpg.Record]:
    conn = await asyncpg.connect(dsn, timeout=10)
    try:
        return list(await conn.fetch(query, *args, timeout=30))
    finally:
        await conn.close()


async def check_every_task_once(
    workload: Workload, shards: dict[str, str], placement: dict[int, str]
) -> None:
    """Every accepted task is on exactly one shard (its partition's), ran at least once and
    never before its run_at; every extra run is a later attempt (a retry)."""
    ids = [uuid.UUID(i) for i, _ in workload.submitted.values()]
    found: dict[uuid.UUID, list[tuple[str, int]]] = {i: [] for i in ids}
    for name, dsn in shards.items():
        for r in await fetch(
            dsn, "SELECT id, state FROM tasks_with_history WHERE id = ANY($1::uuid[])", ids
        ):
            found[r["id"]].append((name, r["state"]))
    twice = {str(i): where for i, where in found.items() if len(where) > 1}
    lost = [str(i) for i, where in found.items() if not where]
    assert not twice, f"tasks on two shards: {list(twice.items())[:5]}"
    assert not lost, f"accepted tasks on no shard: {lost[:5]}"
    misplaced = [
        (str(i), w[0][0]) for i, w in found.items() if w[0][0] != placement[id_partition(i, P)]
    ]
    assert not misplaced, f"tasks on a shard the map does not give them: {misplaced[:5]}"
    not_done = [(str(i), w[0][1]) for i, w in found.items() if w[0][1] != TaskState.SUCCEEDED]
    assert not not_done, f"tasks not succeeded: {not_done[:5]}"
    runs: dict[str, list[Run]] = {}
    for r in workload.runs:
        runs.setdefault(r.task, []).append(r)
    never = [str(i) for i in ids if str(i) not in runs]
    assert not never, f"succeeded tasks no worker ran: {never[:5]}"
    early = [(r.task, r.started - r.run_at) for r in workload.runs if r.started < r.run_at]
    assert not early, f"tasks run before their run_at: {early[:5]}"
    unexplained = [t for t, rs in runs.items() if len({r.attempt for r in rs}) != len(rs)]
    assert not unexplained, f"one attempt run twice: {unexplained[:5]}"


async def check_source_clean(source: str, moved: Sequence[int]) -> None:
    parts = list(moved)
    for table in ("tasks", "schedules", "partition_fences"):
        left = await fetch(
            source,
            f"SELECT count(*) AS n FROM {table} WHERE partition = ANY($1::smallint[])",
            parts,
        )
        assert left[0]["n"] == 0, f"{table} rows of moved partitions left on the source"
    held = await fetch(
        source,
        "SELECT partition, state FROM shard_partitions WHERE partition = ANY($1::smallint[])",
        parts,
    )
    assert {r["partition"]: r["state"] for r in held} == dict.fromkeys(parts, 3)  # gone


async def check_owners_fenced_on(target: str, admin: Client, moved: Sequence[int]) -> None:
    """The moved partitions' owners hold their fences on the target with their own tokens
    (the fence rows moved with the partitions, and the owners fire with them there)."""
    status = await admin.status()
    owners = {o.partition: o for o in status.ownership}
    fences = {
        r["partition"]: r
        for r in await fetch(
            target,
            "SELECT partition, token FROM partition_fences WHERE partition = ANY($1::smallint[])",
            list(moved),
        )
    }
    for p in moved:
        assert p in fences, f"no fence of partition {p} on the target"
        assert fences[p]["token"] == owners[p].fencing_token, (p, fences[p], owners[p])
        assert owners[p].shard == "shard-1"


def keys_fired_after(workload: Workload, since: float, moved: Sequence[int]) -> list[str]:
    """Tasks of the moved partitions submitted after ``since`` (monotonic) that ran."""
    done = workload.done()
    return [
        key
        for key, at in workload.submitted_at.items()
        if at > since
        and key_partition(workload.namespace, key, P) in moved
        and workload.submitted[key][0] in done
    ]


async def test_partitions_move_between_shards_while_tasks_are_submitted_fired_and_worked(
    make_cluster: ClusterFactory, second_server: EmbeddedPostgres
) -> None:
    shard1 = second_server.create_database(f"s1_{uuid.uuid4().hex[:8]}")
    cluster: LocalCluster = make_cluster(nodes=2, partitions=P, store_shards=[shard1])
    shards = {"shard-0": cluster.dsn, "shard-1": shard1}
    admin = Client(",".join(cluster.addresses), timeout=30)
    workload = Workload(cluster.addresses)
    moved = (0, 1, 2, 3)
    try:
        status = await admin.status()
        assert status.shard_map is not None and status.shard_map.version == 1
        async with running(workload):
            await asyncio.sleep(3)
            (asked,) = await admin.move_partitions("0-3", "shard-1")
            final = await until(lambda: move_finished(admin, asked.id), 120, "the move")
            finished_at = time.monotonic()
            assert final.phase == "done", final.error
            await asyncio.sleep(4)  # submits into the moved partitions, now on shard-1
        status = await admin.status()
        assert status.shard_map is not None and status.shard_map.version >= 2
        placement = await placement_of(admin)
        assert [p for p, s in placement.items() if s == "shard-1"] == [*moved, *range(8, 16)]
        await check_every_task_once(workload, shards, placement)
        fired_there = keys_fired_after(workload, finished_at, moved)
        assert fired_there, "no task of a moved partition fired on its new shard"
        await check_owners_fenced_on(shard1, admin, moved)
        await check_source_clean(cluster.dsn, moved)
        assert len(workload.submitted) > 200
    finally:
        await admin.close()


async def test_rebalance_after_add_shard_spreads_the_partitions_over_two_shards(
    make_cluster: ClusterFactory, postgres: EmbeddedPostgres
) -> None:
    cluster: LocalCluster = make_cluster(nodes=2, partitions=P)
    name = f"r1_{uuid.uuid4().hex[:8]}"
    empty = postgres.create_database(name)  # same server: the nodes' password reaches it
    admin = Client(",".join(cluster.addresses), timeout=60)
    workload = Workload(cluster.addresses)
    try:
        async with running(workload):
            await asyncio.sleep(2)
            added = await admin.add_shard(empty)
            assert added.shard == "shard-1"
            moves = await admin.rebalance()
            assert [(m.partitions, m.source, m.target) for m in moves] == [
                ("8-15", "shard-0", "shard-1")
            ]
            final = await until(lambda: move_finished(admin, moves[0].id), 120, "the rebalance")
            assert final.phase == "done", final.error
            await asyncio.sleep(3)
        status = await admin.status()
        assert status.shard_map is not None
        placement = await placement_of(admin)
        assert placement == {p: ("shard-0" if p < 8 else "shard-1") for p in range(P)}
        await check_every_task_once(workload, {"shard-0": cluster.dsn, "shard-1": empty}, placement)
        await check_source_clean(cluster.dsn, range(8, 16))
    finally:
        await admin.close()
        with contextlib.suppress(Exception):
            postgres.drop_database(name)


# ---------------------------------------------------------------------- interrupted moves

LOADED = 20_000


async def load_moving(client: Client, moved: Sequence[int], n: int = LOADED) -> list[str]:
    """``n`` keyed tasks an hour ahead in the partitions to move (a copy that takes a while);
    their ids."""
    keys: list[str] = []
    i = 0
    while len(keys) < n:
        key = f"load-{i}"
        i += 1
        if key_partition("default", key, P) in moved:
            keys.append(key)
    later = datetime.now(UTC) + timedelta(hours=1)
    ids: list[str] = []
    for lo in range(0, n, 1000):
        out = await client.submit_many(
            [NewTask(queue=QUEUE, run_at=later, idempotency_key=k) for k in keys[lo : lo + 1000]]
        )
        ids += [o.task.id for o in out]
    return ids


async def phase_of(admin: Client, move_id: str) -> Any:
    status = await admin.status()
    assert status.shard_map is not None
    return next((m for m in status.shard_map.moves if m.id == move_id), None)


async def wait_phase(admin: Client, move_id: str, phases: set[str], timeout: float = 60) -> Any:
    """The move's status once it is in one of ``phases`` (polled often: phases are short)."""
    deadline = time.monotonic() + timeout
    while True:
        with contextlib.suppress(ChronoqError):
            m = await phase_of(admin, move_id)
            if m is not None and m.phase in phases:
                return m
            assert m is None or m.phase not in ("done", "rolled_back"), (
                f"the move ended ({m.phase}) before it could be interrupted"
            )
        assert time.monotonic() < deadline, f"move {move_id} not in {phases} in {timeout} s"
        await asyncio.sleep(0.05)


async def check_rolled_back(source: str, target: str, moved: Sequence[int], ids: list[str]) -> None:
    """A move rolled back: the source holds the partitions live with every row, the target
    none of them (its holdings gone) and no row of them."""
    parts = list(moved)
    src = await fetch(
        source,
        "SELECT partition, state FROM shard_partitions WHERE partition = ANY($1::smallint[])",
        parts,
    )
    assert {r["partition"]: r["state"] for r in src} == dict.fromkeys(parts, 0)  # live
    dst = await fetch(
        target,
        "SELECT partition, state FROM shard_partitions WHERE partition = ANY($1::smallint[])",
        parts,
    )
    assert all(r["state"] == 3 for r in dst), dst  # gone (or never marked)
    left = await fetch(
        target,
        "SELECT count(*) AS n FROM tasks_with_history WHERE partition = ANY($1::smallint[])",
        parts,
    )
    assert left[0]["n"] == 0
    there = await fetch(
        source, "SELECT count(*) AS n FROM tasks_with_history WHERE id = ANY($1::uuid[])", ids
    )
    assert there[0]["n"] == len(ids)


async def check_ids_once(shards: dict[str, str], ids: list[str]) -> None:
    seen: dict[str, int] = {}
    for dsn in shards.values():
        for r in await fetch(
            dsn, "SELECT id FROM tasks_with_history WHERE id = ANY($1::uuid[])", ids
        ):
            seen[str(r["id"])] = seen.get(str(r["id"]), 0) + 1
    assert len(seen) == len(ids) and set(seen.values()) == {1}


async def test_a_move_whose_driver_node_is_killed_rolls_back_and_can_be_run_again(
    make_cluster: ClusterFactory, second_server: EmbeddedPostgres
) -> None:
    shard1 = second_server.create_database(f"s1_{uuid.uuid4().hex[:8]}")
    cluster: LocalCluster = make_cluster(nodes=2, partitions=P, store_shards=[shard1])
    shards = {"shard-0": cluster.dsn, "shard-1": shard1}
    admin = Client(",".join(cluster.addresses), timeout=30)
    workload = Workload(cluster.addresses)
    moved = (0, 1, 2, 3)
    try:
        ids = await load_moving(admin, moved)
        async with running(workload):
            (asked,) = await admin.move_partitions("0-3", "shard-1")
            at = await wait_phase(admin, asked.id, {"copy", "catch_up"})
            assert at.driver in cluster.nodes
            cluster.kill(at.driver)  # SIGKILL by PID, mid-copy or mid-round
            final = await until(lambda: move_finished(admin, asked.id), 120, "the take-over")
            assert final.phase == "rolled_back", final
            assert "interrupted" in final.error and final.driver != at.driver
            await check_rolled_back(cluster.dsn, shard1, moved, ids)
            status = await admin.status()
            assert status.shard_map is not None and status.shard_map.version == 1
            # Nothing is left in the way: the same move runs to the end afterwards.
            cluster.start_dead_node(at.driver)
            (again,) = await admin.move_partitions("0-3", "shard-1")
            final = await until(lambda: move_finished(admin, again.id), 120, "the move again")
            assert final.phase == "done", final.error
        await check_ids_once(shards, ids)
        placement = await placement_of(admin)
        await check_every_task_once(workload, shards, placement)
        await check_source_clean(cluster.dsn, moved)
    finally:
        await admin.close()


async def test_a_move_whose_target_postgres_is_killed_rolls_back_once_it_is_back(
    make_cluster: ClusterFactory, second_server: EmbeddedPostgres
) -> None:
    shard1 = second_server.create_database(f"s1_{uuid.uuid4().hex[:8]}")
    cluster: LocalCluster = make_cluster(nodes=2, partitions=P, store_shards=[shard1])
    shards = {"shard-0": cluster.dsn, "shard-1": shard1}
    admin = Client(",".join(cluster.addresses), timeout=30)
    workload = Workload(cluster.addresses)
    moved = (0, 1, 2, 3)
    try:
        ids = await load_moving(admin, moved)
        async with running(workload):
            (asked,) = await admin.move_partitions("0-3", "shard-1")
            await wait_phase(admin, asked.id, {"copy", "catch_up"})
            pid = second_server.pid
            second_server.kill()  # the target's postmaster, SIGKILL by PID
            assert pid is not None and not _alive(pid)
            await asyncio.sleep(2)
            second_server.start()
            final = await until(lambda: move_finished(admin, asked.id), 120, "the rollback")
            assert final.phase == "rolled_back", final
            await check_rolled_back(cluster.dsn, shard1, moved, ids)
        await check_ids_once(shards, ids)
        placement = await placement_of(admin)
        assert [p for p, s in placement.items() if s == "shard-1"] == list(range(8, 16))
        await check_every_task_once(workload, shards, placement)
    finally:
        await admin.close()


def _alive(pid: int) -> bool:
    import os

    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


@pytest.fixture
def own_etcd_cluster(
    tmp_path: Path, postgres: EmbeddedPostgres, template_db: str, second_server: EmbeddedPostgres
) -> Iterator[tuple[LocalCluster, str]]:
    """A cluster with an etcd of its own (one member, durable: the test kills it), shard-0
    on the session's server and shard-1 on the test's own."""
    from chronoq.local.cluster import ClusterSpec
    from tests.conftest import create_test_database

    db = f"c_{uuid.uuid4().hex[:12]}"
    dsn = create_test_database(postgres, db, template_db)
    shard1 = second_server.create_database(f"s1_{uuid.uuid4().hex[:8]}")
    spec = ClusterSpec(
        nodes=2, partitions=P, lease_ttl=2, tick_ms=50, cluster=f"c{uuid.uuid4().hex[:8]}",
        durable=True,
    )  # fmt: skip
    cluster = LocalCluster(
        tmp_path / "own-etcd", spec, postgres=postgres, dsn=dsn, store_shards=[shard1]
    )
    try:
        cluster.start()
        yield cluster, shard1
    finally:
        cluster.stop()
        postgres.drop_database(db)


async def test_a_move_through_an_etcd_restart_ends_committed_or_rolled_back_never_half(
    own_etcd_cluster: tuple[LocalCluster, str],
) -> None:
    """The cluster's one etcd member SIGKILLed and started again while a move copies or
    catches up (its leader lost): the move ends done or rolled back, the map and both
    shards agree with it, and every task is on one shard once."""
    cluster, shard1 = own_etcd_cluster
    assert cluster.etcd is not None
    shards = {"shard-0": cluster.dsn, "shard-1": shard1}
    admin = Client(",".join(cluster.addresses), timeout=30)
    workload = Workload(cluster.addresses)
    moved = (0, 1, 2, 3)
    try:
        ids = await load_moving(admin, moved)
        async with running(workload):
            (asked,) = await admin.move_partitions("0-3", "shard-1")
            await wait_phase(admin, asked.id, {"copy", "catch_up", "cut_over"})
            cluster.etcd.kill_member(0)
            await asyncio.sleep(1.5)
            cluster.etcd.start_member(0)
            final = await until(lambda: move_finished(admin, asked.id), 150, "the move's end")
            assert final.phase in ("done", "rolled_back"), final
            placement = await placement_of(admin)
            if final.phase == "rolled_back":
                await check_rolled_back(cluster.dsn, shard1, moved, ids)
                assert all(placement[p] == "shard-0" for p in moved)
            else:
                await check_source_clean(cluster.dsn, moved)
                assert all(placement[p] == "shard-1" for p in moved)
        await check_ids_once(shards, ids)
        await check_every_task_once(workload, shards, placement)
    finally:
        await admin.close()
