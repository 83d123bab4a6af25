"""A batch larger than one insert statement: several statements in one transaction, with
the answers of a single one (order, ids, repeated keys across statements)."""

from __future__ import annotations

from datetime import timedelta

import pytest

from chronoq.clock import ManualClock
from chronoq.models import TaskSpec
from chronoq.store import Store
from chronoq.store.tasks import INSERT_CHUNK

pytestmark = pytest.mark.timeout(60)


async def test_a_batch_over_several_statements_answers_like_one(
    store: Store, clock: ManualClock
) -> None:
    now = clock.now()
    count = 2 * INSERT_CHUNK + 5
    specs = [
        TaskSpec(queue="chunks", run_at=now + timedelta(minutes=5), idempotency_key=f"k{i}")
        for i in range(count)
    ]
    # The last spec repeats the first one's key: it lands in another statement.
    specs.append(TaskSpec(queue="chunks", run_at=now, idempotency_key="k0"))
    accepted = await store.submit_ids(specs, now)
    assert [c for _i, c in accepted] == [True] * count + [False]
    assert accepted[-1][0] == accepted[0][0]
    assert len({i for i, _c in accepted}) == count

    again = await store.submit(specs[:3] + specs[-3:], now)  # all repeats now
    assert [o.created for o in again] == [False] * 6
    assert [o.task.id for o in again] == [accepted[i][0] for i in (0, 1, 2, -3, -2, -1)]

