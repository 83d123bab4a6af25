"""The readers of finished tasks outside the store (the chaos checker's end-of-run read, the
lab's probes) see the tasks retired into the history (migration 0022) as well as the live
ones, through the view tasks_with_history (migration 0023)."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta

import asyncpg

from chronoq.chaos.harness import read_store
from chronoq.lab import probes
from chronoq.models import Lease, TaskSpec
from chronoq.store import Store

NOW = datetime(2030, 1, 1, 12, tzinfo=UTC)


async def _retire_finished(store: Store) -> int:
    """What the retention sweep does, as one statement (a DELETE feeding an INSERT)."""
    async with store.connection() as c:
        status = await c.execute(
            "WITH moved AS (DELETE FROM tasks WHERE state IN (3, 5, 6) RETURNING *)"
            " INSERT INTO task_history SELECT moved.*, 'infinity' FROM moved"
        )
    return int(status.split()[-1])


async def test_the_view_has_the_columns_of_tasks(store: Store) -> None:
    async with store.connection() as c:
        columns = [
            await c.fetch(
                "SELECT attname, format_type(atttypid, atttypmod) FROM pg_attribute"
                " WHERE attrelid = $1::regclass AND attnum > 0 AND NOT attisdropped"
                " ORDER BY attnum",
                table,
            )
            for table in ("tasks", "tasks_with_history")
        ]
    assert [tuple(r) for r in columns[0]] == [tuple(r) for r in columns[1]]


async def test_the_checker_and_the_lab_read_finished_tasks_from_the_history(
    store: Store, dsn: str
) -> None:
    out = await store.submit(
        [TaskSpec(queue="q", run_at=NOW, lease_timeout=timedelta(seconds=30)) for _ in range(6)],
        NOW,
    )
    async with store.connection() as c:  # as an owner's firing stamps them
        await c.execute("UPDATE tasks SET fire_token = 1, fired_by = 'n1', fired_at = $1", NOW)
    got = await store.claim("default", ["q"], "w", 4, NOW)
    await store.complete("default", [Lease(t.id, t.attempt) for t in got], NOW)
    assert await _retire_finished(store) == 4
    ids = {o.task.id for o in out}
    rows, _fences = await read_store([dsn])
    assert {r.id for r in rows} == ids
    assert sorted(r.state for r in rows) == ["READY"] * 2 + ["SUCCEEDED"] * 4
    conn = await asyncpg.connect(dsn)
    try:
        assert (await probes.state_counts(conn))["succeeded"] == 4
        seen = await probes.states_of(conn, [uuid.UUID(i) for i in ids])
        assert (seen["fired"], seen["executed"]) == (6, 4)
        assert (await probes.firing_since(conn, NOW - timedelta(days=1))).fired == 6
        assert (await probes.double_firings(conn)).checked == 6
    finally:
        await conn.close()
