"""The task history on a real PostgreSQL: its columns follow tasks', and keyed submits that
race the sweep moving their key's first task still make one task per key."""

from __future__ import annotations

import asyncio
import json
import random
import uuid
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from chronoq.client import Client, NewTask
from chronoq.clock import ManualClock
from chronoq.errors import NotFound
from chronoq.models import Lease, TaskSpec, TaskState
from chronoq.node import Node
from chronoq.store import Store
from chronoq.store.history import Retired, history_slices
from chronoq.store.sql import q, queries
from tests.integration.conftest import NodeFactory

pytestmark = pytest.mark.timeout(120)

NOW = datetime(2030, 1, 1, 12, 0, 10, tzinfo=UTC)
RETENTION = timedelta(hours=1)
WIDTH = timedelta(minutes=10)
P = 16

_COLUMNS = """
SELECT attname, format_type(atttypid, atttypmod) AS type, attstorage::text
FROM pg_attribute WHERE attrelid = $1::regclass AND attnum > 0 AND NOT attisdropped
ORDER BY attnum
"""


@pytest.fixture
async def big(dsn: str) -> AsyncIterator[Store]:
    """A store with room for the concurrent submits and the sweep beside them."""
    s = await Store.connect(dsn, partitions=P, min_size=2, max_size=12)
    try:
        yield s
    finally:
        await s.close()


async def test_the_history_has_the_columns_of_tasks_and_retire_at(store: Store) -> None:
    await store.keep_history(NOW, retention=RETENTION, width=WIDTH)
    (_name, first), *_ = await history_slices(store)
    async with store.connection() as c:
        tasks = [tuple(r) for r in await c.fetch(_COLUMNS, "tasks")]
        history = [tuple(r) for r in await c.fetch(_COLUMNS, "task_history")]
        a_slice = [tuple(r) for r in await c.fetch(_COLUMNS, first.name)]
    assert history == [*tasks, ("retire_at", "timestamp with time zone", "p")]
    assert a_slice == history  # a slice stores what its parent does (uncompressed labels)
    # what the sweep moves: every column of tasks, in order
    listed = [c.strip() for c in queries_fragment().split(",")]
    assert listed == [name for name, _type, _storage in tasks]


def queries_fragment() -> str:
    """The history_columns fragment as the sweep expands it (from its INSERT's list)."""
    sql = queries()["retire_finished"]
    start = sql.index("INSERT INTO task_history (") + len("INSERT INTO task_history (")
    return sql[start : sql.index(", retire_at)", start)]


async def _finished_keys(store: Store, keys: list[str], now: datetime) -> dict[str, str]:
    """One cancelled task per key: key -> its id."""
    outs = await store.submit(
        [TaskSpec(queue="q", run_at=now + timedelta(hours=1), idempotency_key=k) for k in keys],
        now,
    )
    for o in outs:
        await store.cancel(o.task.id, "default", now)
    return {k: o.task.id for k, o in zip(keys, outs, strict=True)}


async def _resubmit(store: Store, keys: list[str], now: datetime, how: int) -> list[str]:
    """The keys submitted again by one of the submit paths; the ids they answered."""
    specs = [TaskSpec(queue="q", run_at=now, idempotency_key=k) for k in keys]
    if how == 0:
        return [o.task.id for o in await store.submit(specs, now)]
    if how == 1:
        return [task_id for task_id, _created in await store.submit_ids(specs, now)]
    if how == 2:
        return [(await store.submit_leased(s, now, "w")).task.id for s in specs]
    if how == 4:  # one at a time: the single statement that checks its key itself
        return [(await store.submit([s], now))[0].task.id for s in specs]
    # with a unique key beside each (the keyed statements)
    keyed = [TaskSpec(queue="q", run_at=now, idempotency_key=k, unique_key=f"u-{k}") for k in keys]
    return [o.task.id for o in await store.submit(keyed, now)]


async def _one_task_per_key(store: Store, keys: list[str]) -> None:
    async with store.connection() as c:
        rows = await c.fetch(
            "SELECT idempotency_key, count(*) AS n FROM tasks_with_history"
            " WHERE idempotency_key = ANY($1::text[]) GROUP BY idempotency_key",
            keys,
        )
    assert {r["idempotency_key"]: r["n"] for r in rows} == dict.fromkeys(keys, 1)


async def test_keyed_submits_waiting_on_the_sweep_answer_the_first_task(big: Store) -> None:
    """The race made certain: the sweep's statement holds its DELETE uncommitted while keyed
    submits of the same keys run, so each insert waits for it; the sweep then commits the
    rows into the history, and every submit must answer the first task, not make one."""
    for how in range(5):
        keys = [f"w{how}-{i}" for i in range(8)]
        first = await _finished_keys(big, keys, NOW)
        later = NOW + timedelta(seconds=1)
        await big.keep_history(later, retention=RETENTION, width=WIDTH)
        async with big.connection() as sweep:
            tx = sweep.transaction()
            await tx.start()
            row = await sweep.fetchrow(
                big._q("retire_finished"), list(range(P)), later, RETENTION, 1000, later
            )
            assert row["kept"] == len(keys)
            submits = asyncio.ensure_future(_resubmit(big, keys, later, how))
            await asyncio.sleep(0.3)
            # Each insert waits on the uncommitted DELETE; the leased insert and the single
            # submit need not: their snapshot sees the first tasks still in tasks, and so does
            # their lookup after.
            assert how in (2, 4) or not submits.done()
            await tx.commit()
        answered = await asyncio.wait_for(submits, 30)
        assert answered == [first[k] for k in keys], how
        await _one_task_per_key(big, keys)


async def test_keyed_submits_racing_the_sweep_make_one_task_per_key(big: Store) -> None:
    """Many rounds of the sweep and keyed submits of the same keys at once, by every path."""
    rng = random.Random(24)
    all_keys: list[str] = []
    for rnd in range(25):
        keys = [f"r{rnd}-{i}" for i in range(12)]
        all_keys += keys
        first = await _finished_keys(big, keys, NOW)
        later = NOW + timedelta(seconds=1)
        await big.keep_history(later, retention=RETENTION, width=WIDTH)

        async def sweep(later: datetime = later) -> Retired:
            await asyncio.sleep(rng.random() * 0.01)
            return await big.retire_finished(
                list(range(P)), later, later, retention=RETENTION, width=WIDTH, batch=5
            )

        async def submit(part: list[str], how: int, later: datetime = later) -> list[str]:
            await asyncio.sleep(rng.random() * 0.01)
            return await _resubmit(big, part, later, how)

        parts = [keys[i : i + 3] for i in range(0, len(keys), 3)]
        answers = await asyncio.gather(
            sweep(),
            sweep(),
            sweep(),
            *(submit(part, rng.randrange(5)) for part in parts),
            *(submit(part, rng.randrange(5)) for part in parts),
        )
        for part, got in zip(parts * 2, answers[3:], strict=True):
            assert got == [first[k] for k in part], rnd
        while (
            await big.retire_finished(
                list(range(P)), later, later, retention=RETENTION, width=WIDTH, batch=100
            )
        ).gone:
            pass
    await _one_task_per_key(big, all_keys)


def _nodes(plan: dict[str, Any]) -> list[dict[str, Any]]:
    out = [plan]
    for child in plan.get("Plans", []):
        out += _nodes(child)
    return out


async def _plan(store: Store, sql: str, *args: Any) -> list[dict[str, Any]]:
    """The executed plan of ``sql`` with ``args`` (rolled back), flattened."""
    async with store.connection() as conn:
        tx = conn.transaction()
        await tx.start()
        try:
            (doc,) = await conn.fetchrow("EXPLAIN (ANALYZE, FORMAT JSON) " + sql, *args)
        finally:
            await tx.rollback()
    return _nodes(json.loads(doc)[0]["Plan"])


async def test_the_sweep_reads_its_batch_only_whatever_else_the_table_holds(big: Store) -> None:
    """Many DEAD letters and a large backlog of finished rows: one batch of the sweep reads
    that batch through tasks_retiring, not every finished row; a read by id of a live task
    never reaches the history, and of a retired one reads the history by id."""
    specs = [TaskSpec(queue="q", run_at=NOW, max_attempts=1) for _ in range(3000)]
    await big.submit(specs, NOW)
    async with big.connection() as c:
        await c.execute(
            "UPDATE tasks SET state = CASE WHEN random() < 0.4 THEN 4 ELSE 5 END,"
            " finished_at = $1::timestamptz - random() * interval '1 minute'",
            NOW,
        )
        await c.execute("ANALYZE tasks")
    later = NOW + timedelta(seconds=1)
    await big.keep_history(later, retention=RETENTION, width=WIDTH)
    nodes = await _plan(
        big, big._q("retire_finished"), list(range(P)), later, RETENTION, 100, later
    )
    picks = [n for n in nodes if n.get("Index Name") == "tasks_retiring"]
    assert picks and all(n["Actual Rows"] <= 100 for n in picks), nodes
    assert not [n for n in nodes if n["Node Type"] == "Seq Scan"]
    await big.retire_finished(
        list(range(P)), later, later, retention=RETENTION, width=WIDTH, batch=100
    )
    live = await big.submit([TaskSpec(queue="q", run_at=later)], later)
    async with big.connection() as c:
        retired = await c.fetchval("SELECT id FROM task_history LIMIT 1")
    on_live = await _plan(big, q("get_task"), uuid.UUID(live[0].task.id), "default")
    history_reads = [n for n in on_live if n.get("Function Name") == "chronoq_history_task"]
    assert history_reads and all(n["Actual Loops"] == 0 for n in history_reads), on_live
    on_retired = await _plan(big, q("get_task"), retired, "default")
    assert [n["Actual Rows"] for n in on_retired if n["Node Type"] == "Function Scan"] == [1]
    # the function's own plan: the history by id, never a scan of its slices
    history = await _plan(
        big, "SELECT * FROM task_history WHERE id = $1 AND namespace = $2", retired, "default"
    )
    assert not [n for n in history if n["Node Type"] == "Seq Scan"], history


async def test_a_node_moves_finished_tasks_into_the_history_and_drops_them_later(
    make_node: NodeFactory, clock: ManualClock
) -> None:
    """Through a node's API: a completed task is still read and listed once retention moved
    it, a keyed submit of it answers it, and it is gone once its slice has passed."""
    node = await make_node(
        clock=clock,
        retention=RETENTION,
        history_after=timedelta(seconds=30),
        history_slice=WIDTH,
        retention_batch=3,
    )
    client = Client(node.address)
    try:
        done = await client.submit_many(
            [NewTask(queue="h", idempotency_key=f"n{i}") for i in range(7)]
        )
        for t in await client.claim(["h"], max_tasks=7):
            await client.complete(Lease(t.id, t.attempt))
        assert node.retention is not None
        assert await node.retention.purge() == 0  # finished just now: not yet
        clock.advance(timedelta(seconds=31))
        assert await node.retention.purge() == 7  # in batches of 3
        assert node.retention.retired == 7
        assert _counter(node, "chronoq_tasks_retired_total") == 7
        first = done[0].task.id
        assert (await client.get(first)).state is TaskState.SUCCEEDED
        again = await client.submit("h", idempotency_key="n0")
        assert again.task.id == first and not again.created
        listed = await client.list(state=TaskState.SUCCEEDED)
        assert sorted(t.id for t in listed.tasks) == sorted(t.task.id for t in done)
        clock.advance(RETENTION + WIDTH)
        await node.retention.purge()
        assert node.retention.slices_dropped >= 1
        assert _counter(node, "chronoq_history_slices_dropped_total") >= 1
        with pytest.raises(NotFound):
            await client.get(first)
    finally:
        await client.close()


def _counter(node: Node, name: str) -> float:
    value = node.metrics.registry.get_sample_value(name)
    assert value is not None, name
    return value


async def test_slice_upkeep_gives_up_quickly_behind_a_long_reader(big: Store) -> None:
    """A reader that holds the history (a long listing) makes the upkeep's DDL give up within
    its lock timeout instead of queueing every later reader behind its exclusive lock; the
    next pass, once the reader is done, drops and makes the slices."""
    await big.keep_history(NOW, retention=RETENTION, width=WIDTH)
    async with big.connection() as reader:
        tx = reader.transaction()
        await tx.start()
        await reader.fetchval("SELECT count(*) FROM task_history")
        started = asyncio.get_running_loop().time()
        busy = await big.keep_history(NOW + 2 * RETENTION, retention=RETENTION, width=WIDTH)
        waited = asyncio.get_running_loop().time() - started
        await tx.rollback()
    assert busy.busy and (busy.created, busy.dropped) == (0, 0)
    assert waited < 3
    done = await big.keep_history(NOW + 2 * RETENTION, retention=RETENTION, width=WIDTH)
    assert not done.busy and done.dropped >= 1 and done.created >= 1


async def test_a_store_whose_tasks_all_moved_into_the_history_still_holds_rows(
    store: Store,
) -> None:
    """A first shard map splits only an empty shard-0: rows in the history count too, or
    their partitions would move away from them."""
    assert await store.holds_no_rows()
    await _finished_keys(store, ["e"], NOW)
    later = NOW + timedelta(seconds=1)
    await store.keep_history(later, retention=RETENTION, width=WIDTH)
    done = await store.retire_finished(
        list(range(16)), later, later, retention=RETENTION, width=WIDTH, batch=10
    )
    assert done.kept == 1
    assert not await store.holds_no_rows()
