"""A move whose source or target PostgreSQL is SIGKILLed in the middle, then started again.

A node in this process drives the move (real etcd, three real PostgreSQL servers: shard-0 on
the session's, shard-1 and shard-2 each on a durable server of this module's own, so that
either side of a move of shard-1's partitions to shard-2 can be killed by its postmaster's
PID). The kill lands in the phase it names through hooks on the node's own mover (the first
bytes through a stream's pipe, the return of the cut-over's freeze, the return of the
cut-over before the etcd commit, the start of the clean-up), never by a sleep. After the
restart the move ends by itself: rolled back when the kill came before the commit, done
after it. No accepted task is lost or live (states 0-2) on both shards, the source's copy
goes only after the commit, and submits to the other shards' partitions work while the
killed server is down.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import uuid
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

import asyncpg
import pytest

from chronoq.client import Client, NewTask
from chronoq.embedded.postgres import EmbeddedPostgres
from chronoq.errors import ChronoqError
from chronoq.moves import AFTER_COMMIT, Phase
from chronoq.node import Node
from chronoq.routing import id_partition, key_partition
from chronoq.shardmap import even
from chronoq.store import holdings as real_holdings
from chronoq.store import move_steps
from chronoq.store.move_pipe import _Pipe
from tests.integration.conftest import NodeFactory
from tests.integration.test_cluster_inproc import cluster, settled

pytestmark = pytest.mark.timeout(120)

P = 16
MAP = even(P, 3)
TARGET = "shard-2"
QUEUE = "kills"
LOADED = 1500  # tasks in the moved partitions before the move: a copy of several chunks
RETIRED = 100  # of them finished and in the history when the move starts


@dataclass
class Servers:
    by_shard: dict[str, EmbeddedPostgres]


@pytest.fixture(scope="module")
def servers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Servers]:
    """shard-1's and shard-2's servers, durable: a commit acknowledged before the kill must
    survive it (the tests kill them by PID and start them again)."""
    root = tmp_path_factory.mktemp("move-kills")
    made = {s: EmbeddedPostgres(root / s, durable=True) for s in ("shard-1", TARGET)}
    try:
        for server in made.values():
            server.start()
        yield Servers(made)
    finally:
        for server in made.values():
            server.stop()


@dataclass
class Hooks:
    """Where the kill lands: ``point`` is one of POINTS; ``fire`` kills once."""

    point: str
    kill: Callable[[], None]
    phase: str = ""  # the mover's phase running now (copy, catch_up, cut_over, ...)
    fired: asyncio.Event = field(default_factory=asyncio.Event)
    source_rows_at_clean_up: list[int] = field(default_factory=list)

    def at(self, point: str) -> None:
        if point == self.point and not self.fired.is_set():
            self.kill()
            self.fired.set()


class HookedPipe(_Pipe):
    """The move's pipe, which lands a kill in the phase streaming through it."""

    hooks: Hooks | None = None

    async def put(self, data: bytes) -> None:
        await super().put(data)
        if self.hooks is not None:
            self.hooks.at(f"stream:{self.hooks.phase}")


class HookedHoldings:
    """The store's holdings statements, with a kill point once a freeze has committed."""

    def __init__(self, hooks: Hooks) -> None:
        self._hooks = hooks

    def __getattr__(self, name: str) -> Any:
        return getattr(real_holdings, name)

    async def freeze(self, store: Any, partitions: Sequence[int], move_id: str, token: int) -> Any:
        out = await real_holdings.freeze(store, partitions, move_id, token)
        self._hooks.at("frozen")
        return out


class HookedMove:
    """The node's mover of one move, with the kill points between and inside its phases."""

    def __init__(self, inner: Any, hooks: Hooks, book: Any) -> None:
        self._inner = inner
        self._hooks = hooks
        self._book = book
        inner._given_holdings = HookedHoldings(hooks)
        # One cut-over group, frozen as long as a loaded machine needs: the kill points are
        # phases of one group (the groups' own path is tests/integration/test_mover.py's).
        inner.freeze_budget = 30.0

    @property
    def last_round(self) -> Any:
        return self._inner.last_round

    def group(self, partitions: Sequence[int], *, owns_index: bool = False) -> HookedMove:
        return HookedMove(
            self._inner.group(partitions, owns_index=owns_index), self._hooks, self._book
        )

    async def _run(self, phase: str, call: Any) -> Any:
        self._hooks.phase = phase
        try:
            return await call
        finally:
            self._hooks.phase = ""

    async def prepare(self) -> Any:
        return await self._run("prepare", self._inner.prepare())

    async def copy(self) -> Any:
        return await self._run("copy", self._inner.copy())

    async def catch_up(self) -> int:
        changed: int = await self._run("catch_up", self._inner.catch_up())
        return changed

    async def cut_over(self, next_version: int) -> Any:
        out = await self._run("cut_over", self._inner.cut_over(next_version))
        self._hooks.at("cut")  # made live on the target, the etcd commit not written yet
        return out

    async def rollback(self) -> Any:
        return await self._run("rollback", self._inner.rollback())

    async def clean_up(self) -> int:
        # The only statement that deletes the source's rows: the commit must be behind it.
        (stored,) = [s for s in await self._book.records() if s.record.id == self._inner.move_id]
        assert stored.record.phase in AFTER_COMMIT, stored.record.phase
        current, _ = await self._book.read_map()
        assert all(current.shard_of(p) == TARGET for p in self._inner.partitions)
        self._hooks.at("clean_up")
        deleted: int = await self._run("clean_up", self._inner.clean_up())
        return deleted


def keys_in(partitions: Sequence[int], count: int, prefix: str) -> list[str]:
    out: list[str] = []
    i = 0
    while len(out) < count:
        key = f"{prefix}-{i}"
        i += 1
        if key_partition("default", key, P) in partitions:
            out.append(key)
    return out


async def fetch(dsn: str, query: str, *args: Any) -> list[asyncpg.Record]:
    conn = await asyncpg.connect(dsn, timeout=10)
    try:
        return list(await conn.fetch(query, *args, timeout=30))
    finally:
        await conn.close()


async def until(check: Any, timeout: float, what: str) -> Any:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while True:
        with contextlib.suppress(ChronoqError):
            got = await check()
            if got:
                return got
        assert loop.time() < deadline, f"{what} not reached in {timeout} s"
        await asyncio.sleep(0.1)


@dataclass
class Setup:
    node: Node
    client: Client
    dsns: dict[str, str]
    hooks: Hooks
    victim: str  # the shard whose server is killed
    server: EmbeddedPostgres  # its server
    source: str  # the move's source shard (shard-1, or shard-0: the node's own DSN)
    moved: tuple[int, ...]  # the partitions moved


@pytest.fixture(scope="module")
def shard0_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EmbeddedPostgres]:
    """shard-0's own server, for the cases that kill the source when it is shard-0 (the node's
    main DSN): the session's server is shared by every test."""
    server = EmbeddedPostgres(tmp_path_factory.mktemp("move-kills-0") / "shard-0", durable=True)
    try:
        server.start()
        yield server
    finally:
        server.stop()


@pytest.fixture
async def moving(
    request: pytest.FixtureRequest,
    make_node: NodeFactory,
    etcd: Any,
    cluster_name: str,
    dsn: str,
    servers: Servers,
    monkeypatch: pytest.MonkeyPatch,
) -> AsyncIterator[Setup]:
    """A node on three shards whose move driver kills ``request.param``'s side (source or
    target) at ``request.param``'s point; both servers are running again afterwards."""
    side, point, source = (*request.param, "shard-1")[:3]
    by_shard = dict(servers.by_shard)
    if source == "shard-0":
        by_shard["shard-0"] = request.getfixturevalue("shard0_server")
    dbs = {s: srv.create_database(f"k_{uuid.uuid4().hex[:10]}") for s, srv in by_shard.items()}
    dsns = {"shard-0": dsn, **dbs}
    shard = source if side == "source" else TARGET
    victim = by_shard[shard]

    def kill() -> None:
        pid = victim.pid
        assert pid is not None
        victim.kill()  # SIGKILL of the postmaster by PID, then its orphaned backends
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)

    hooks = Hooks(point, kill)
    HookedPipe.hooks = hooks
    monkeypatch.setattr(move_steps, "_Pipe", HookedPipe)
    node = await make_node(
        cluster=cluster(etcd, cluster_name),
        node_id="n0",
        dsn=dsns["shard-0"],
        store_shards=(dsns["shard-1"], dsns[TARGET]),
    )
    assert node.shard_admin is not None
    admin = node.shard_admin
    made = admin.driver._make_move
    admin.driver._make_move = lambda *a: HookedMove(made(*a), hooks, admin.book)
    # The source's rows wait this long after the commit for statements routed by the old map
    # (the store's command timeout in production); the test's own node has none running.
    admin.driver.statement_deadline = 1.0
    admin.driver.freeze_budget = 30.0
    await settled([node])
    client = Client(node.address, timeout=10)
    try:
        moved = MAP.held_by(source)[:2]
        yield Setup(node, client, dsns, hooks, shard, victim, source, moved)
    finally:
        HookedPipe.hooks = None
        await client.close()
        for server in by_shard.values():
            await asyncio.to_thread(server.start)  # a failed test leaves none down


async def submit_all(client: Client, keys: Sequence[str], run_at: datetime) -> dict[str, str]:
    """Submit ``keys`` one by one, each repeated with its key on a refusal for at most 20 s
    (a refusal that lasts longer is the failure these tests look for)."""
    loop = asyncio.get_running_loop()
    ids: dict[str, str] = {}
    for key in keys:
        deadline = loop.time() + 20
        while key not in ids:
            try:
                out = await asyncio.wait_for(
                    client.submit(QUEUE, idempotency_key=key, run_at=run_at), 5
                )
            except (ChronoqError, TimeoutError) as exc:
                assert loop.time() < deadline, f"{key} refused for 20 s: {exc}"
                await asyncio.sleep(0.2)
                continue
            ids[key] = out.task.id
    return ids


async def write_moving(
    client: Client, moved: Sequence[int], run_at: datetime, stop: asyncio.Event
) -> dict[str, str]:
    """Keyed submits into the moved partitions all through the move, each repeated with its
    key until accepted (the cut-over and the outage refuse them for a while); the accepted."""
    ids: dict[str, str] = {}
    for key in keys_in(moved, 10_000, "during"):
        while not stop.is_set():
            try:
                out = await client.submit(QUEUE, idempotency_key=key, run_at=run_at)
            except ChronoqError:
                await asyncio.sleep(0.1)
                continue
            ids[key] = out.task.id
            break
        if stop.is_set():
            return ids
        await asyncio.sleep(0.02)
    return ids


async def live_on_both(setup: Setup) -> set[str]:
    """Ids of the moved partitions live (SCHEDULED, READY or RUNNING) on the source and on
    the target at once: every row of both, not only those a client saw accepted."""
    query = "SELECT id FROM tasks WHERE partition = ANY($1::smallint[]) AND state <= 2"
    dsns, moved = setup.dsns, list(setup.moved)
    source = {str(r["id"]) for r in await fetch(dsns[setup.source], query, moved)}
    target = {str(r["id"]) for r in await fetch(dsns[TARGET], query, moved)}
    return source & target


async def where(dsns: dict[str, str], ids: Sequence[str]) -> dict[str, list[tuple[str, int]]]:
    """Each id's rows on every shard, live or in the history: (shard, state)."""
    found: dict[str, list[tuple[str, int]]] = {i: [] for i in ids}
    for shard, url in dsns.items():
        for r in await fetch(
            url, "SELECT id, state FROM tasks_with_history WHERE id = ANY($1::uuid[])", list(ids)
        ):
            found[str(r["id"])].append((shard, r["state"]))
    return found


async def moved_rows(url: str, moved: Sequence[int], table: str = "tasks") -> int:
    rows = await fetch(
        url, f"SELECT count(*) AS n FROM {table} WHERE partition = ANY($1::smallint[])", list(moved)
    )
    return int(rows[0]["n"])


async def retire(url: str, ids: Sequence[str]) -> None:
    """Finished tasks into the history (one DELETE feeding one INSERT, as the sweep does),
    half in a time slice a day long, half in the forever one."""
    conn = await asyncpg.connect(url, timeout=10)
    try:
        lo = await conn.fetchval("SELECT date_trunc('hour', now())")
        await conn.execute(
            f"CREATE TABLE IF NOT EXISTS task_history_kills PARTITION OF task_history FOR VALUES"
            f" FROM ('{lo.isoformat()}') TO ('{(lo + timedelta(days=1)).isoformat()}')"
        )
        status = await conn.execute(
            "WITH moved AS (DELETE FROM tasks WHERE id = ANY($1::uuid[]) AND state = 5"
            " RETURNING *) INSERT INTO task_history SELECT moved.*, CASE WHEN"
            " get_byte(uuid_send(id), 15) % 2 = 0 THEN 'infinity' ELSE $2::timestamptz END"
            " FROM moved",
            list(ids),
            lo + timedelta(hours=12),
        )
    finally:
        await conn.close()
    assert status == f"INSERT 0 {len(ids)}"


async def holding_states(url: str, moved: Sequence[int]) -> dict[int, int]:
    rows = await fetch(
        url,
        "SELECT partition, state FROM shard_partitions WHERE partition = ANY($1::smallint[])",
        list(moved),
    )
    return {r["partition"]: r["state"] for r in rows}


#: (side killed, kill point, how the move ends). ``stream:<phase>``: the first bytes of a
#: stream between the shards in that phase; ``frozen``: the source's freeze committed;
#: ``cut``: the cut-over done on both shards, the etcd commit not yet written.
CASES = [
    pytest.param(("source", "stream:copy"), "rolled_back", id="source-mid-copy"),
    pytest.param(("source", "frozen"), "rolled_back", id="source-after-freeze"),
    pytest.param(("target", "frozen"), "rolled_back", id="target-after-freeze"),
    pytest.param(("target", "cut"), "done", id="target-before-commit"),
    *(
        pytest.param(case, ends, id=name, marks=pytest.mark.slow)
        for case, ends, name in [
            (("target", "stream:copy"), "rolled_back", "target-mid-copy"),
            (("source", "stream:catch_up"), "rolled_back", "source-mid-catch-up"),
            (("target", "stream:catch_up"), "rolled_back", "target-mid-catch-up"),
            (("source", "cut"), "done", "source-before-commit"),
            (("source", "clean_up"), "done", "source-in-clean-up"),
            (("target", "clean_up"), "done", "target-in-clean-up"),
            # The source is shard-0, whose server is the node's own DSN's.
            (("source", "stream:copy", "shard-0"), "rolled_back", "shard-0-source-mid-copy"),
            (("source", "frozen", "shard-0"), "rolled_back", "shard-0-source-after-freeze"),
            (("source", "cut", "shard-0"), "done", "shard-0-source-before-commit"),
        ]
    ),
]


@pytest.mark.parametrize(("moving", "ends"), CASES, indirect=["moving"])
async def test_a_move_survives_a_postgres_kill_on_either_side(moving: Setup, ends: str) -> None:
    node, client, dsns, hooks = moving.node, moving.client, moving.dsns, moving.hooks
    assert node.shard_admin is not None
    book = node.shard_admin.book
    source, moved = moving.source, moving.moved
    later = datetime.now(UTC) + timedelta(hours=1)
    loaded = keys_in(moved, LOADED, "load")
    ids: dict[str, str] = {}
    for lo in range(0, len(loaded), 500):
        out = await client.submit_many(
            [NewTask(queue=QUEUE, run_at=later, idempotency_key=k) for k in loaded[lo : lo + 500]]
        )
        ids.update({k: o.task.id for k, o in zip(loaded[lo : lo + 500], out, strict=True)})
    # Some of them finished and retired into the history, as the sweep does: the move carries
    # them (into a time slice the target is given, and the forever one).
    for key in loaded[:RETIRED]:
        await client.cancel(ids[key])
    await retire(dsns[source], [ids[k] for k in loaded[:RETIRED]])
    before = await moved_rows(dsns[source], moved)
    assert before == LOADED - RETIRED

    stop = asyncio.Event()
    writing = asyncio.create_task(write_moving(client, moved, later, stop))
    try:
        (asked,) = await client.move_partitions(",".join(map(str, moved)), TARGET)
        await asyncio.wait_for(hooks.fired.wait(), 60)
        victim = moving.victim

        # While the killed server is down, the other shards' partitions take submits.
        alive = [p for p in range(P) if MAP.shard_of(p) != victim and p not in moved]
        ids.update(await submit_all(client, keys_in(alive, 12, "alive"), later))
        # The driver has seen the failure (its record says where it goes from here) ...
        failed = {Phase.ROLLING_BACK} if ends == "rolled_back" else {Phase.CLEAN_UP}

        async def seen() -> bool:
            stored = await book.get(asked.id)
            return stored is not None and stored.record.phase in failed

        await until(seen, 30, f"the driver in {failed}")
        if victim == TARGET:  # the source's copy is all there while the target is down
            assert await moved_rows(dsns[source], moved) >= before
            if ends == "rolled_back":
                # ... and the moved partitions, given back, take submits on the source: the
                # target's outage is not theirs.
                ids.update(await submit_all(client, keys_in(moved, 5, "given-back"), later))
        # ... and the server comes back (crash recovery from its WAL).
        await asyncio.to_thread(moving.server.start)

        async def ended() -> Any:
            stored = await book.get(asked.id)
            if stored is not None and stored.record.final:
                return stored.record
            return None

        final = await until(ended, 60, "the move's end")
    finally:
        stop.set()
        try:
            during = await asyncio.wait_for(writing, 30)
        finally:
            writing.cancel()
    assert final.phase.value == ends, (final.phase, final.error)
    assert during, "no submit into the moved partitions was accepted during the move"
    ids.update(during)
    assert not await live_on_both(moving)
    # Keyed submits into every partition (the moved ones included) work again.
    ids.update(await submit_all(client, keys_in(range(P), 24, "after"), later))

    current, _ = await book.read_map()
    placement = {p: current.shard_of(p) for p in range(P)}
    found = await where(dsns, list(ids.values()))
    lost = [i for i, rows in found.items() if not rows]
    assert not lost, f"{len(lost)} accepted tasks on no shard, e.g. {lost[:3]}"
    twice = {i: rows for i, rows in found.items() if sum(1 for _, s in rows if s <= 2) > 1}
    assert not twice, f"tasks live on two shards: {list(twice.items())[:3]}"
    elsewhere = {
        i: rows
        for i, rows in found.items()
        if [s for s, _ in rows] != [placement[id_partition(uuid.UUID(i), P)]]
    }
    assert not elsewhere, (
        f"tasks not (only) on their partition's shard: {list(elsewhere.items())[:3]}"
    )
    src, dst = await holding_states(dsns[source], moved), await holding_states(dsns[TARGET], moved)
    if ends == "rolled_back":
        assert all(placement[p] == source for p in moved)
        assert src == dict.fromkeys(moved, 0)  # live again
        assert all(s == 3 for s in dst.values()), dst  # gone (or never marked)
        assert await moved_rows(dsns[TARGET], moved) == 0
        assert await moved_rows(dsns[TARGET], moved, "task_history") == 0
        assert await moved_rows(dsns[source], moved, "task_history") == RETIRED
    else:
        assert all(placement[p] == TARGET for p in moved)
        assert src == dict.fromkeys(moved, 3) and dst == dict.fromkeys(moved, 0)
        assert await moved_rows(dsns[source], moved) == 0
        assert await moved_rows(dsns[source], moved, "task_history") == 0
        assert await moved_rows(dsns[TARGET], moved, "task_history") == RETIRED
