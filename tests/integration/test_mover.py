"""The partition mover on two real databases: a move under writes leaves every row once on
the target, a move cut short at any phase resumes or rolls back without a row live on both
shards, and a stale mover is refused."""

from __future__ import annotations

import asyncio
import contextlib
import importlib
import inspect
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from chronoq.errors import StoreUnavailable
from chronoq.models import Lease, ScheduleSpec, TaskSpec
from chronoq.recurrence import Cron
from chronoq.routing import key_partition
from chronoq.store import Store
from chronoq.store.move_history import MAX_COVER
from chronoq.store.mover import (
    FROZEN,
    GONE,
    INCOMING,
    LIVE,
    Holdings,
    MoveRefused,
    PartitionMove,
    StaleMoveToken,
)
from chronoq.store.schedules import Schedules

pytestmark = pytest.mark.timeout(180)

P = 8
MOVING = (1, 6)
NOW = datetime(2030, 1, 1, 12, 0, 10, tzinfo=UTC)
LEASE = timedelta(seconds=30)

try:
    REAL: Holdings | None = importlib.import_module("chronoq.store.holdings")  # type: ignore[assignment]
except ImportError:  # the store's fencing of the map is not built yet
    REAL = None


@dataclass
class Held:
    partition: int
    state: int
    since_version: int
    move_id: str | None
    move_token: int | None


class SqlHoldings:
    """The holdings statements over the design record's ``shard_partitions``, real SQL on the
    real table, for as long as the store's own (``chronoq.store.holdings``) is not built."""

    DDL = (
        "CREATE TABLE IF NOT EXISTS shard_partitions (partition smallint PRIMARY KEY,"
        " state smallint NOT NULL, since_version bigint NOT NULL, move_id text,"
        " move_token bigint)"
    )

    async def held(self, store: Any) -> dict[int, Any]:
        async with store.connection() as c:
            rows = await c.fetch("SELECT * FROM shard_partitions")
        return {
            r["partition"]: Held(
                r["partition"], r["state"], r["since_version"], r["move_id"], r["move_token"]
            )
            for r in rows
        }

    async def _set(
        self,
        store: Any,
        parts: Sequence[int],
        state: int,
        move_id: str,
        token: int,
        since: int | None = None,
    ) -> None:
        async with store.connection() as c, c.transaction():
            for r in await c.fetch(
                "SELECT move_token FROM shard_partitions WHERE partition = ANY($1::smallint[])"
                " FOR UPDATE",
                list(parts),
            ):
                if r["move_token"] is not None and r["move_token"] > token:
                    raise StaleMoveToken(move_id, token, r["move_token"])
            await c.execute(
                "INSERT INTO shard_partitions SELECT unnest($1::smallint[]), $2, coalesce($5, 1),"
                " $3, $4 ON CONFLICT (partition) DO UPDATE SET state = $2, move_id = $3,"
                " move_token = $4, since_version = coalesce($5, shard_partitions.since_version)",
                list(parts),
                state,
                move_id,
                token,
                since,
            )

    async def mark_incoming(
        self, store: Any, parts: Sequence[int], move_id: str, token: int
    ) -> None:
        await self._set(store, parts, INCOMING, move_id, token)

    async def freeze(self, store: Any, parts: Sequence[int], move_id: str, token: int) -> None:
        await self._set(store, parts, FROZEN, move_id, token)

    async def make_live(
        self, store: Any, parts: Sequence[int], since: int, move_id: str, token: int
    ) -> None:
        await self._set(store, parts, LIVE, move_id, token, since)

    async def mark_gone(self, store: Any, parts: Sequence[int], move_id: str, token: int) -> None:
        await self._set(store, parts, GONE, move_id, token)

    async def unfreeze(self, store: Any, parts: Sequence[int], move_id: str, token: int) -> None:
        await self._set(store, parts, LIVE, move_id, token)


HOLDINGS: Holdings = REAL if REAL is not None else SqlHoldings()


async def _open(dsn: str, holds: Sequence[int] | None) -> Store:
    kwargs: dict[str, Any] = {}
    if "holds" in inspect.signature(Store.connect).parameters:
        kwargs["holds"] = holds
    store = await Store.connect(dsn, partitions=P, min_size=1, max_size=6, **kwargs)
    if REAL is None:
        async with store.connection() as c:
            await c.execute(SqlHoldings.DDL)
            if holds is None:
                await c.execute(
                    "INSERT INTO shard_partitions SELECT g, 0, 1, NULL, NULL"
                    " FROM generate_series(0, $1 - 1) g ON CONFLICT DO NOTHING",
                    P,
                )
    return store


@pytest.fixture
async def shards(dsn: str, target_dsn: str) -> AsyncIterator[tuple[Store, Store]]:
    source = await _open(dsn, None)
    target = await _open(target_dsn, ())
    try:
        yield source, target
    finally:
        await source.close()
        await target.close()


def mover(
    source: Store, target: Store, move_id: str = "m000000000001", token: int = 7
) -> PartitionMove:
    return PartitionMove(source, target, MOVING, move_id, token, holdings=HOLDINGS, batch_rows=200)


async def load(store: Store, n: int = 3000) -> None:
    """Tasks of every partition in every state, a schedule and a fence per moving partition."""
    parts = [i % P for i in range(n)]
    specs = [
        TaskSpec(
            queue="q",
            run_at=NOW if i % 3 else NOW + timedelta(hours=1),
            payload=f"payload {i}".encode(),
            idempotency_key=f"k{i}" if i % 2 else None,
            max_attempts=1 if i % 5 == 0 else 3,
            lease_timeout=LEASE,
            **(_controls(i) if i % 7 == 0 else {}),
        )
        for i in range(n)
    ]
    submitted = await store.submit(specs, NOW, partitions=parts)
    running = await store.claim("default", ["q"], "w1", n // 4, NOW)
    done = running[: len(running) // 3]
    await store.complete("default", [Lease(t.id, t.attempt) for t in done], NOW)
    for t in running[len(done) : 2 * len(done)]:
        await store.fail("default", Lease(t.id, t.attempt), "boom", NOW)  # DEAD or back
    for out in submitted[:90:3]:  # SCHEDULED ones (an hour ahead)
        await store.cancel(out.task.id, "default", NOW)
    schedules = Schedules(store)
    made = 0
    for i in range(400):
        name = f"s{i}"
        if key_partition("default", name, P) in MOVING or i < 3:
            await schedules.create(
                ScheduleSpec(name=name, queue="q", rule=Cron("*/5 * * * *")), NOW
            )
            made += 1
        if made >= 6:
            break
    for p in range(P):
        await store.take_fence(p, 3, "test", "node-a")
    # Half the finished tasks retired into the history, as the sweep does.
    await add_slice(store, "task_history_ahead", AHEAD)
    await add_slice(store, "task_history_expired", EXPIRED)
    await retire(store, "get_byte(uuid_send(id), 14) % 2 = 0")


def _controls(i: int) -> dict[str, Any]:
    """Queue controls of every kind (each key its own, so none folds into another task)."""
    return {
        "concurrency_key": f"c{i % 5}",
        "unique_key": f"u{i}",
        "unique_for": timedelta(hours=2),
        "debounce_key": f"d{i}",
        "debounce": timedelta(seconds=5),
        "labels": (("team", f"t{i % 3}"),),
    }


async def rows(store: Store, table: str, where: str = "TRUE") -> list[dict[str, Any]]:
    async with store.connection() as c:
        return [dict(r) for r in await c.fetch(f"SELECT * FROM {table} WHERE {where} ORDER BY 1")]


MOVED = f"partition = ANY('{{{','.join(map(str, MOVING))}}}'::smallint[])"
LIVE_HISTORY = "retire_at > now()"


async def same_on_both(source: Store, target: Store) -> int:
    """Every row of the moving partitions is on the target, once, exactly as on the source
    (the history's but for the expired ones)."""
    total = 0
    for table, where in (
        ("tasks", MOVED),
        ("schedules", MOVED),
        ("partition_fences", MOVED),
        ("task_history", f"{MOVED} AND {LIVE_HISTORY}"),
    ):
        mine = await rows(source, table, where)
        theirs = await rows(target, table)
        assert mine == theirs, table
        total += len(mine)
    return total


async def never_live_on_both(source: Store, target: Store) -> None:
    a, b = await HOLDINGS.held(source), await HOLDINGS.held(target)
    for p in MOVING:
        assert not (a[p].state == LIVE and p in b and b[p].state == LIVE), p


class Writer:
    """Submits and acks into the moving partitions through the source store, as a node."""

    def __init__(self, store: Store) -> None:
        self.store = store
        self.accepted: set[str] = set()
        self.refused = 0
        self.rounds = 0

    async def run(self) -> None:
        while True:
            self.rounds += 1
            specs = [TaskSpec(queue="w", run_at=NOW, lease_timeout=LEASE) for _ in range(10)]
            try:
                out = await self.store.submit(
                    specs, NOW, partitions=[MOVING[i % 2] for i in range(10)]
                )
                self.accepted |= {o.task.id for o in out}
                got = await self.store.claim("default", ["w"], "ww", 4, NOW)
                await self.store.complete("default", [Lease(t.id, t.attempt) for t in got[:2]], NOW)
            except StoreUnavailable:  # the cut-over refuses writes of moving partitions
                self.refused += 1
            await asyncio.sleep(0.005)


class Sweeper:
    """The store's own sweep into the history, over the moving partitions, as an owner runs
    it (fenced: refused once the cut-over freezes them)."""

    def __init__(self, store: Store) -> None:
        self.store = store
        self.moved = 0

    async def run(self) -> None:
        while True:
            try:
                done = await self.store.retire_finished(
                    MOVING,
                    NOW + timedelta(hours=1),
                    NOW,
                    retention=timedelta(days=7),
                    width=timedelta(days=1),
                    batch=50,
                )
                self.moved += done.kept
            except StoreUnavailable:
                pass
            await asyncio.sleep(0.01)


async def test_a_move_under_writes_leaves_every_row_once_on_the_target(
    shards: tuple[Store, Store],
) -> None:
    source, target = shards
    await load(source)
    others = await rows(source, "tasks", f"NOT ({MOVED})")
    move = mover(source, target)
    writer = Writer(source)
    await source.keep_history(NOW, retention=timedelta(days=7), width=timedelta(days=1))
    sweeper = Sweeper(source)
    writing = asyncio.create_task(writer.run())
    sweeping = asyncio.create_task(sweeper.run())
    try:
        await move.prepare()
        copied = await move.copy()
        assert copied > 0
        for _ in range(3):
            await move.catch_up()
            await asyncio.sleep(0.05)
        if REAL is None:
            # Without the store's own fencing, writes during the freeze would not be refused.
            writing.cancel()
        cut = await move.cut_over(2)
    finally:
        for running in (writing, sweeping):
            running.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await running
    assert writer.rounds > 3 and writer.accepted
    assert sweeper.moved > 0  # the store's sweep moved finished tasks into the history meanwhile
    assert cut.frozen_seconds < 30
    n = await same_on_both(source, target)
    assert n > 700
    target_ids = {r["id"] for r in await rows(target, "tasks_with_history")}
    import uuid

    assert {uuid.UUID(i) for i in writer.accepted} <= target_ids  # no accepted write lost
    await never_live_on_both(source, target)
    # Every state made it, and the queue controls with their rows.
    states = {r["state"] for r in await rows(target, "tasks_with_history")}
    assert states >= {0, 1, 2, 3, 4, 5}, states
    controlled = await rows(target, "tasks", "labels IS NOT NULL")
    assert controlled and all(
        r["concurrency_key"] and r["unique_key"] and r["unique_until"] and r["debounce_until"]
        for r in controlled
    )
    before = await rows(target, "tasks")
    history = await rows(source, "task_history", MOVED)  # expired ones too
    deleted = await move.clean_up()
    assert deleted == len(before) + len(await rows(target, "schedules")) + len(history)
    assert await rows(source, "task_history", MOVED) == []
    assert await rows(source, "tasks", MOVED) == []
    assert await rows(source, "schedules", MOVED) == []
    assert await rows(source, "tasks", f"NOT ({MOVED})") == others  # the rest untouched
    assert await rows(target, "tasks") == before
    assert await rows(target, "move_rows") == []
    held = await HOLDINGS.held(source)
    assert all(held[p].state == GONE for p in MOVING)
    async with source.connection() as c:
        assert await c.fetchval("SELECT to_regclass($1)", move.index) is None


#: History slices of the source (migration 0022): a day ahead, another day after it, and one
#: expired yesterday (its rows are not copied). Rows of no time slice go to the forever one.
AHEAD = (
    "date_trunc('hour', now()) - interval '1 hour'",
    "date_trunc('hour', now()) + interval '1 day'",
)
LATER = AHEAD[1], f"{AHEAD[1]} + interval '1 day'"
EXPIRED = "now() - interval '2 days'", "now() - interval '1 day'"


async def add_slice(store: Store, name: str, bounds: tuple[str, str]) -> None:
    async with store.connection() as c:
        lo, hi = await c.fetchrow(f"SELECT {bounds[0]}, {bounds[1]}")
        await c.execute(
            f"CREATE TABLE {name} PARTITION OF task_history FOR VALUES FROM ('{lo.isoformat()}')"
            f" TO ('{hi.isoformat()}')"
        )


async def retire(store: Store, where: str = "TRUE") -> int:
    """Finished rows (SUCCEEDED, CANCELLED, SKIPPED) into the history as the retention sweep
    moves them, one DELETE feeding one INSERT: a third kept forever, a third in the slice a
    day ahead, a third in the expired slice. Returns the rows moved."""
    async with store.connection() as c:
        status = await c.execute(
            "WITH moved AS (DELETE FROM tasks WHERE state IN (3, 5, 6) AND (unique_until IS NULL"
            f" OR unique_closed) AND ({where}) RETURNING *) INSERT INTO task_history"
            " SELECT moved.*, CASE get_byte(uuid_send(id), 15) % 3"
            " WHEN 0 THEN 'infinity'::timestamptz"
            f" WHEN 1 THEN {AHEAD[0]} + interval '2 hours' ELSE {EXPIRED[0]} + interval '1 hour'"
            " END FROM moved"
        )
    return int(status.split()[-1])


async def finish_more(store: Store, n: int) -> None:
    """More tasks of the moving partitions finished (the sweep would move them next)."""
    specs = [
        TaskSpec(queue="h", run_at=NOW, idempotency_key=f"late{i}", lease_timeout=LEASE)
        for i in range(n)
    ]
    await store.submit(specs, NOW, partitions=[MOVING[i % 2] for i in range(n)])
    got = await store.claim("default", ["h"], "wh", n, NOW)
    await store.complete("default", [Lease(t.id, t.attempt) for t in got], NOW)


async def history_slices(store: Store) -> set[str]:
    async with store.connection() as c:
        return {
            r[0]
            for r in await c.fetch(
                "SELECT c.relname FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid"
                " WHERE i.inhparent = 'task_history'::regclass"
            )
        }


async def test_a_move_carries_the_history_of_its_partitions_but_for_expired_rows(
    shards: tuple[Store, Store],
) -> None:
    """History rows go with their partition (with their retire_at, into slices the target is
    given where its own do not cover them: here one of another width overlaps), rows the
    sweep moves during the move follow, expired ones stay behind and go with the source's."""
    source, target = shards
    half = f"{AHEAD[0]} + interval '12 hours'", f"{AHEAD[1]} + interval '12 hours'"
    await add_slice(target, "task_history_other_width", half)
    await load(source)
    assert await retire(source) > 100
    others = await rows(source, "task_history", f"NOT ({MOVED})")
    move = mover(source, target)
    await move.prepare()
    copied = await move.copy()
    live = await rows(source, "task_history", f"{MOVED} AND {LIVE_HISTORY}")
    assert len(live) > 20 and len(await rows(source, "task_history", MOVED)) > len(live)
    assert await rows(target, "task_history") == live
    assert copied >= len(live)
    # Meanwhile the sweep moves more finished rows, some into a slice made after the copy.
    await finish_more(source, 40)
    await add_slice(source, "task_history_later", LATER)
    async with source.connection() as c:
        await c.execute(
            f"WITH moved AS (DELETE FROM tasks WHERE state = 3 AND queue = 'h' RETURNING *)"
            f" INSERT INTO task_history SELECT moved.*, {LATER[0]} + interval '1 hour' FROM moved"
        )
    assert await move.catch_up() >= 40
    await move.cut_over(2)
    live = await rows(source, "task_history", f"{MOVED} AND {LIVE_HISTORY}")
    assert await rows(target, "task_history") == live
    assert sum(r["queue"] == "h" for r in live) == 40
    assert await rows(target, "task_history", f"NOT ({LIVE_HISTORY})") == []
    assert {"task_history_other_width", "task_history_forever"} <= await history_slices(target)
    # Through the port, on the target: read by id, and a keyed submit answers the first task.
    for r in live[:: max(1, len(live) // 20)]:
        got = await target.get(str(r["id"]), "default")
        assert (got.id, int(got.state)) == (str(r["id"]), r["state"])
    keyed = [r for r in live if r["idempotency_key"]]
    assert keyed
    target.map_version = 2  # routes by the map the cut-over made (a node would, once committed)
    for r in keyed[:10]:
        spec = TaskSpec(queue="q", run_at=NOW, idempotency_key=r["idempotency_key"])
        (out,) = await target.submit([spec], NOW, partitions=[r["partition"]])
        assert not out.created and out.task.id == str(r["id"])
    # The target's own upkeep goes on beside the slices the move made (no overlap refused).
    upkeep = await target.keep_history(
        datetime.now(UTC), retention=timedelta(days=3), width=timedelta(days=1)
    )
    assert not upkeep.busy
    deleted = await move.clean_up()
    assert deleted >= len(live)
    assert await rows(source, "task_history", MOVED) == []  # expired ones too
    assert await rows(source, "task_history", f"NOT ({MOVED})") == others
    assert await rows(target, "task_history") == live
    assert await rows(target, "move_rows") == []


async def test_a_rolled_back_move_leaves_the_history_on_the_source_only(
    shards: tuple[Store, Store],
) -> None:
    source, target = shards
    await load(source)
    await retire(source)
    history = await rows(source, "task_history", MOVED)
    move = mover(source, target)
    await move.prepare()
    await move.copy()
    await move.catch_up()
    assert await rows(target, "task_history") != []
    await move.rollback()
    assert await rows(target, "task_history") == []
    assert await rows(target, "move_rows") == []
    assert await rows(source, "task_history", MOVED) == history
    # The same move again finds no stray history on the target, and goes through.
    again = mover(source, target, "m000000000002", 9)
    await again.prepare()
    await again.copy()
    await again.cut_over(2)
    assert await rows(target, "task_history") == await rows(
        source, "task_history", f"{MOVED} AND {LIVE_HISTORY}"
    )


PHASES = ("prepare", "copy", "catch_up", "cut_over", "clean_up")


async def _phase(move: PartitionMove, name: str) -> Any:
    if name == "cut_over":
        return await move.cut_over(2)
    return await getattr(move, name)()


@pytest.mark.parametrize("killed", PHASES)
@pytest.mark.parametrize("after_ms", [5, 40])
async def test_a_move_killed_in_any_phase_resumes(
    shards: tuple[Store, Store], killed: str, after_ms: int
) -> None:
    source, target = shards
    await load(source)
    expected = await rows(source, "tasks", MOVED)
    history = await rows(source, "task_history", f"{MOVED} AND {LIVE_HISTORY}")
    move = mover(source, target)
    for name in PHASES[: PHASES.index(killed)]:
        await _phase(move, name)
    task = asyncio.create_task(_phase(move, killed))
    await asyncio.sleep(after_ms / 1000)
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError, StoreUnavailable):
        await task
    await never_live_on_both(source, target)
    # A new driver (a new mover object, as after a node kill) runs the phase again, and on.
    again = mover(source, target)
    for name in PHASES[PHASES.index(killed) :]:
        if name == "clean_up" and killed != "clean_up":
            assert await same_on_both(source, target)
        await _phase(again, name)
        await never_live_on_both(source, target)
    assert await rows(target, "tasks") == expected
    assert await rows(source, "tasks", MOVED) == []
    assert history and await rows(target, "task_history") == history
    assert await rows(source, "task_history", MOVED) == []


@pytest.mark.parametrize("killed", PHASES[:-1])
async def test_a_move_killed_before_its_commit_rolls_back(
    shards: tuple[Store, Store], killed: str
) -> None:
    source, target = shards
    await load(source)
    expected = await rows(source, "tasks", MOVED)
    history = await rows(source, "task_history", MOVED)
    move = mover(source, target)
    for name in PHASES[: PHASES.index(killed)]:
        await _phase(move, name)
    task = asyncio.create_task(_phase(move, killed))
    await asyncio.sleep(0.02)
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError, StoreUnavailable):
        await task
    await mover(source, target).rollback()
    assert await rows(target, "tasks") == []
    assert await rows(target, "task_history") == []
    assert await rows(source, "task_history", MOVED) == history
    assert await rows(target, "schedules") == []
    assert await rows(target, "move_rows") == []
    assert await rows(source, "tasks", MOVED) == expected
    held, theirs = await HOLDINGS.held(source), await HOLDINGS.held(target)
    assert all(held[p].state == LIVE for p in MOVING)
    assert all(p not in theirs or theirs[p].state in (INCOMING, GONE) for p in MOVING)
    async with source.connection() as c:
        assert await c.fetchval("SELECT to_regclass($1)", move.index) is None
    # And the source takes writes of those partitions again.
    (out,) = await source.submit([TaskSpec(queue="q", run_at=NOW)], NOW, partitions=[MOVING[0]])
    assert out.created


async def test_a_stale_mover_is_refused(shards: tuple[Store, Store]) -> None:
    source, target = shards
    await load(source, 300)
    old = mover(source, target, "m000000000001", 5)
    await old.prepare()
    await old.copy()
    new = mover(source, target, "m000000000002", 9)
    await new.prepare()  # the newer driver takes the target's partitions over
    with pytest.raises(StaleMoveToken):
        await old.catch_up()
    with pytest.raises(StaleMoveToken):
        await old.copy()
    with pytest.raises((StaleMoveToken, MoveRefused)):
        await old.cut_over(2)
    # The newer mover goes on undisturbed: the stale one wrote nothing after it took over.
    await new.copy()
    await new.cut_over(2)
    assert await same_on_both(source, target)


async def test_a_clean_up_before_the_cut_over_is_refused(shards: tuple[Store, Store]) -> None:
    source, target = shards
    await load(source, 300)
    move = mover(source, target)
    await move.prepare()
    await move.copy()
    with pytest.raises(MoveRefused, match="cut over"):
        await move.clean_up()
    assert len(await rows(source, "tasks", MOVED)) > 0


async def test_a_move_cut_over_a_group_at_a_time_keeps_the_rest_live_on_the_source(
    shards: tuple[Store, Store],
) -> None:
    """The driver's groups: each group frozen and made live on its own (with its own map
    version), the others still live on the source meanwhile; the move index serves every
    group (its predicate is the whole move's) and goes with the last step."""
    source, target = shards
    await load(source)
    move = mover(source, target)
    await move.prepare()
    await move.copy()
    await move.catch_up()
    first, second = move.group((MOVING[0],)), move.group((MOVING[1],))
    assert first.is_group and not move.is_group
    await first.cut_over(2)
    a, b = await HOLDINGS.held(source), await HOLDINGS.held(target)
    assert (a[MOVING[0]].state, b[MOVING[0]].state, b[MOVING[0]].since_version) == (FROZEN, LIVE, 2)
    assert (a[MOVING[1]].state, b[MOVING[1]].state) == (LIVE, INCOMING)  # not this group's
    # A plan of the group's frozen round reads through the move index.
    async with source.connection() as c:
        plan = "\n".join(
            r[0]
            for r in await c.fetch(
                "EXPLAIN SELECT partition, id, xmin FROM tasks WHERE " + first._moving
            )
        )
    assert move.index in plan, plan
    await second.cut_over(3)
    await never_live_on_both(source, target)
    await same_on_both(source, target)
    # The rest rolled back alone would leave the index for the committed group's clean-up;
    # here both groups are cut, and the whole move cleans up and drops the index.
    await move.clean_up()
    assert await rows(source, "tasks", MOVED) == []
    async with source.connection() as c:
        assert await c.fetchval("SELECT to_regclass($1)", move.index) is None


async def test_the_rest_of_a_move_rolled_back_after_a_group_was_cut_leaves_that_group_alone(
    shards: tuple[Store, Store],
) -> None:
    source, target = shards
    await load(source)
    move = mover(source, target)
    await move.prepare()
    await move.copy()
    await move.catch_up()
    await move.group((MOVING[0],)).cut_over(2)
    kept = await rows(target, "tasks", f"partition = {MOVING[0]}")
    await move.group((MOVING[1],)).rollback()
    a, b = await HOLDINGS.held(source), await HOLDINGS.held(target)
    assert (a[MOVING[0]].state, b[MOVING[0]].state) == (FROZEN, LIVE)  # the cut group stays
    assert a[MOVING[1]].state == LIVE and b[MOVING[1]].state == GONE  # the rest went back
    assert await rows(target, "tasks", f"partition = {MOVING[1]}") == []
    assert await rows(target, "tasks", f"partition = {MOVING[0]}") == kept
    async with source.connection() as c:
        assert await c.fetchval("SELECT to_regclass($1)", move.index) is not None
    deleted = await move.group((MOVING[0],), owns_index=True).clean_up()
    assert deleted >= len(kept)
    assert await rows(source, "tasks", f"partition = {MOVING[0]}") == []
    assert await rows(source, "tasks", f"partition = {MOVING[1]}") != []
    async with source.connection() as c:
        assert await c.fetchval("SELECT to_regclass($1)", move.index) is None


async def test_a_newer_driver_rolls_back_or_cleans_up_what_a_dead_one_left(
    shards: tuple[Store, Store],
) -> None:
    """A driver that takes a move over has a newer token than the rows the dead one
    stamped: its rollback (before the commit) and its clean-up (after) take them over."""
    source, target = shards
    await load(source)
    expected = await rows(source, "tasks", MOVED)
    dead = mover(source, target, token=7)
    await dead.prepare()
    await dead.copy()
    await dead.catch_up()
    await mover(source, target, token=9).rollback()
    a, b = await HOLDINGS.held(source), await HOLDINGS.held(target)
    assert all(a[p].state == LIVE for p in MOVING) and all(b[p].state == GONE for p in MOVING)
    assert await rows(target, "tasks") == [] and await rows(source, "tasks", MOVED) == expected
    # The same move again, committed by one driver, cleaned up by the next.
    again = mover(source, target, token=11)
    await again.prepare()
    await again.copy()
    await again.group((MOVING[0],)).cut_over(2)
    await again.group((MOVING[1],)).cut_over(3)
    deleted = await mover(source, target, token=12).clean_up()
    assert deleted >= len(expected)
    assert await rows(source, "tasks", MOVED) == []
    b = await HOLDINGS.held(target)
    assert [(b[p].state, b[p].since_version, b[p].move_token) for p in MOVING] == [
        (LIVE, 2, 12),
        (LIVE, 3, 12),
    ]


async def test_a_move_whose_source_history_has_too_many_slices_makes_none_of_them(
    shards: tuple[Store, Store],
) -> None:
    """The slices a move makes on its target are capped (each one costs every read of the
    history there a lock): a source sliced finer than any retention window is refused with
    what to do, before a slice or a row is written, and the move rolls back."""
    source, target = shards
    await load(source, 300)
    async with source.connection() as c:
        lo = await c.fetchval("SELECT date_trunc('hour', now()) + interval '1 day'")
        for i in range(MAX_COVER + 1):
            # Apart: touching slices are covered by one wider slice on the target.
            a, b = lo + timedelta(minutes=2 * i), lo + timedelta(minutes=2 * i + 1)
            await c.execute(
                f"CREATE TABLE task_history_fine_{i} PARTITION OF task_history"
                f" FOR VALUES FROM ('{a.isoformat()}') TO ('{b.isoformat()}')"
            )
    before = await history_slices(target)
    move = mover(source, target)
    await move.prepare()
    with pytest.raises(MoveRefused, match="slices"):
        await move.copy()
    assert await history_slices(target) == before
    assert await rows(target, "tasks") == []
    await move.rollback()
    held = await HOLDINGS.held(source)
    assert all(held[p].state == LIVE for p in MOVING)
