"""Contract: what placement across partitions (and so across shards) must keep: a keyed
submit made again, even concurrently, lands once; a listing over every partition is
complete and in id order."""

from __future__ import annotations

import asyncio
from datetime import datetime, timedelta

import pytest

from chronoq.models import TaskSpec, TaskState
from chronoq.store.port import TaskStore
from tests.contract.conftest import PARTITIONS

pytestmark = pytest.mark.timeout(60)


async def test_a_keyed_submit_made_again_lands_once(store_shape: TaskStore, now: datetime) -> None:
    specs = [TaskSpec(queue="k", run_at=now, idempotency_key=f"key-{i}") for i in range(40)]
    first = await store_shape.submit(specs, now)
    assert all(o.created for o in first)
    assert len({o.task.partition for o in first}) == PARTITIONS  # every partition: both shards
    # The same batch again, four times at once, and ids only: nothing new, the same tasks.
    again = await asyncio.gather(*(store_shape.submit(specs, now) for _ in range(4)))
    for outcomes in again:
        assert [o.task.id for o in outcomes] == [o.task.id for o in first]
        assert not any(o.created for o in outcomes)
    ids = await store_shape.submit_ids(list(reversed(specs)), now)
    assert ids == [(o.task.id, False) for o in reversed(first)]
    counts = await store_shape.count_by_state()
    assert counts == {TaskState.READY: 40}
    for o in first:
        assert (
            await store_shape.get(o.task.id, "default")
        ).idempotency_key == o.task.idempotency_key


async def test_a_listing_over_every_partition_is_complete_and_in_id_order(
    store_shape: TaskStore, now: datetime
) -> None:
    made = await store_shape.submit(
        [
            TaskSpec(queue="a" if i % 3 else "b", run_at=now + timedelta(seconds=i % 2))
            for i in range(150)
        ],
        now,
    )
    for queue in (None, "b"):
        seen: list[str] = []
        token = ""
        for _ in range(100):  # bounded: 150 tasks in pages of 11
            page = await store_shape.list_tasks(
                "default", queue=queue, page_size=11, page_token=token
            )
            assert len(page.tasks) <= 11
            seen += [t.id for t in page.tasks]
            if not (token := page.next_token):
                break
        assert token == ""
        wanted = sorted(o.task.id for o in made if queue is None or o.task.queue == queue)
        assert seen == wanted  # every task once, in id order across every partition
    scheduled = await store_shape.list_tasks("default", state=TaskState.SCHEDULED, page_size=500)
    assert sorted(t.id for t in scheduled.tasks) == sorted(
        o.task.id for o in made if o.task.state is TaskState.SCHEDULED
    )
    assert scheduled.next_token == ""
