"""A long submit goes in requests of ``SUBMIT_PART`` tasks, several in flight (real node, real
store): the answers come back in the order of the tasks, every task is keyed, a repeat
creates nothing twice, and a part the node refuses starts no other and says which tasks were
accepted before it."""

from __future__ import annotations

import pytest

from chronoq.client import Client, NewTask
from chronoq.client import client as client_module
from chronoq.errors import BadRequest
from chronoq.node import Node

pytestmark = pytest.mark.timeout(120)

PART = client_module.SUBMIT_PART


async def stored(node: Node, queue: str) -> dict[str, str | None]:
    """Task id -> idempotency key of every task of ``queue``."""
    assert node.store is not None
    out: dict[str, str | None] = {}
    token = ""
    while True:
        page = await node.store.list_tasks("default", queue=queue, page_token=token, page_size=500)
        out |= {t.id: t.idempotency_key for t in page.tasks}
        token = page.next_token
        if not token:
            return out


async def test_a_long_submit_answers_in_order_and_a_repeat_creates_nothing(
    node: Node, client: Client
) -> None:
    n = 2 * PART + 7
    keyed = [NewTask(queue="parts", idempotency_key=f"k{i}", payload=b"%d" % i) for i in range(n)]
    first = await client.submit_ids(keyed)
    assert [c for _i, c in first] == [True] * n
    rows = await stored(node, "parts")
    assert len(rows) == n
    assert [rows[i] for i, _c in first] == [f"k{i}" for i in range(n)]  # the order of the tasks
    again = await client.submit_ids(keyed)
    assert again == [(i, False) for i, _c in first]
    assert len(await stored(node, "parts")) == n

    unkeyed = await client.submit_many([NewTask(queue="minted") for _ in range(PART + 1)])
    assert all(s.created for s in unkeyed)
    minted = await stored(node, "minted")
    assert len(minted) == PART + 1 and all(minted.values())  # each part keys its tasks
    assert {s.task.id for s in unkeyed} == set(minted)


async def test_a_refused_part_stops_the_submit_and_names_what_was_accepted(
    node: Node, client: Client
) -> None:
    flying = client_module.SUBMIT_IN_FLIGHT
    n = (flying + 3) * PART
    bad_at = PART + 5
    tasks = [NewTask(queue="q q" if i == bad_at else "stops") for i in range(n)]
    with pytest.raises(BadRequest) as refused:
        await client.submit_ids(tasks)
    message = str(refused.value)
    assert f"tasks[{bad_at - PART}].queue" in message
    assert f"tasks {PART}..{2 * PART - 1} of {n}" in message
    assert f"the {PART} tasks before it were accepted" in message
    kept = len(await stored(node, "stops"))
    # The first part committed, the refused one wrote nothing, those in flight beside it may
    # have committed, and no other was sent.
    assert kept % PART == 0
    assert PART <= kept <= flying * PART
