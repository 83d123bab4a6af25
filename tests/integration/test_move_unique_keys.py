"""A partition move carries tasks whose unique and debounce keys changed hands between its
rounds: the target's copy of a finished key's task goes before the key's new task arrives,
so the target's unique indexes (migration 0019) never refuse a catch-up."""

from __future__ import annotations

from datetime import timedelta

import pytest

from chronoq.models import Lease, TaskSpec
from chronoq.store import Store
from chronoq.store.mover import PartitionMove
from tests.integration.test_mover import (
    HOLDINGS,
    MOVING,
    NOW,
    never_live_on_both,
    rows,
    same_on_both,
    shards,  # noqa: F401 (the fixture)
)

pytestmark = pytest.mark.timeout(120)

KEYS = 40


def _specs(round_: int) -> list[TaskSpec]:
    return [
        TaskSpec(queue="k", run_at=NOW, unique_key=f"u{i}", payload=f"{round_}".encode())
        for i in range(KEYS)
    ] + [
        TaskSpec(
            queue="k", run_at=NOW, debounce_key=f"d{i}", debounce=timedelta(seconds=1),
            payload=f"{round_}".encode(),
        )
        for i in range(KEYS)
    ]


async def _churn(source: Store, round_: int) -> None:
    """Every key's pending task finishes and a new one of the key is made."""
    async with source.connection() as c:
        await c.execute(
            "DELETE FROM tasks WHERE id IN (SELECT id FROM tasks WHERE queue = 'f' LIMIT 700)"
        )
        await c.execute("VACUUM tasks")
    for task in await source.claim("default", ["k"], "w", 2 * KEYS, NOW):
        await source.complete("default", [Lease(task.id, task.attempt)], NOW)
    async with source.connection() as c:  # the debounced ones fire (the owner would)
        await c.execute("UPDATE tasks SET state = 3 WHERE debounce_key IS NOT NULL AND state = 0")
    out = await source.submit(_specs(round_), NOW, partitions=[MOVING[i % 2] for i in range(2 * KEYS)])
    assert all(o.created for o in out)


async def test_keys_that_change_hands_between_rounds_move_in_small_batches(
    shards: tuple[Store, Store],  # noqa: F811
) -> None:
    source, target = shards
    # Rows before the keyed ones in the heap, deleted later: their space takes the keys' new
    # tasks, which the listing then meets before the new versions of the finished ones.
    filler = [TaskSpec(queue="f", run_at=NOW + timedelta(hours=1)) for _ in range(3000)]
    await source.submit(filler, NOW, partitions=[0] * len(filler))
    first = await source.submit(_specs(0), NOW, partitions=[MOVING[i % 2] for i in range(2 * KEYS)])
    assert all(o.created for o in first)
    move = PartitionMove(source, target, MOVING, "m000000000002", 7, holdings=HOLDINGS, batch_rows=3)
    await move.prepare()
    await move.copy()
    for round_ in range(1, 4):
        await _churn(source, round_)
        await move.catch_up()
    await _churn(source, 4)
    await move.cut_over(2)
    await same_on_both(source, target)
    await never_live_on_both(source, target)
    pending = await rows(target, "tasks", "state IN (0, 1, 2)")
    assert len(pending) == 2 * KEYS and {r["payload"] for r in pending} == {b"4"}
