"""CountTasks: a namespace's tasks by queue and state, counted from an index, bounded, and
only the caller's own (real node, real PostgreSQL)."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from chronoq import errors
from chronoq.client import Client, NewTask
from chronoq.models import Lease, TaskState
from chronoq.store import Store
from chronoq.store.sql import q
from tests.integration.conftest import NodeFactory

pytestmark = pytest.mark.timeout(60)

TOKEN_A = "team-a-token-0123456789abcdef"
TOKEN_B = "team-b-token-fedcba9876543210"


def _by_key(counts: Any) -> dict[tuple[str, TaskState], int]:
    return {(c.queue, c.state): c.count for c in counts.counts}


async def test_counts_by_queue_and_state_for_the_callers_namespace_only(
    make_node: NodeFactory, tmp_path: Path
) -> None:
    tokens = tmp_path / "tokens.toml"
    tokens.write_text(f'[tokens]\n"{TOKEN_A}" = ["team-a"]\n"{TOKEN_B}" = ["team-b"]\n')
    tokens.chmod(0o600)
    node = await make_node(auth_tokens=str(tokens))
    a = Client(node.address, namespace="team-a", token=TOKEN_A, timeout=10)
    b = Client(node.address, namespace="team-b", token=TOKEN_B, timeout=10)
    a_as_b = Client(node.address, namespace="team-b", token=TOKEN_A, timeout=10)
    try:
        await a.submit_many([NewTask(queue="mail") for _ in range(3)])
        await a.submit_many([NewTask(queue="late", delay=timedelta(hours=1)) for _ in range(2)])
        await b.submit_many([NewTask(queue="mail") for _ in range(7)])
        (claimed,) = await a.claim(["mail"], max_tasks=1)
        dead = await a.submit("dlq", max_attempts=1)
        (doomed,) = await a.claim(["dlq"])
        await a.fail(Lease(doomed.id, doomed.attempt), "boom")
        assert (await a.get(dead.task.id)).state is TaskState.DEAD

        counts = await a.count_tasks()
        assert _by_key(counts) == {
            ("mail", TaskState.READY): 2,
            ("mail", TaskState.RUNNING): 1,
            ("late", TaskState.SCHEDULED): 2,
            ("dlq", TaskState.DEAD): 1,
        }
        assert not counts.capped and not counts.truncated
        ready = next(c for c in counts.counts if c.state is TaskState.READY)
        assert ready.oldest_run_at is not None and ready.oldest_run_at <= claimed.run_at
        assert _by_key(await b.count_tasks([TaskState.READY])) == {("mail", TaskState.READY): 7}

        with pytest.raises(errors.AccessDenied, match="team-b"):
            await a_as_b.count_tasks()  # another tenant's counts are not this token's
        with pytest.raises(errors.BadRequest, match="states"):
            await a.count_tasks([TaskState.SUCCEEDED])  # finished rows grow: not counted
    finally:
        for c in (a, b, a_as_b):
            await c.close()


async def test_a_count_reads_the_index_only_and_stops_at_its_bounds(
    make_node: NodeFactory, store: Store
) -> None:
    """The statement is an index-only scan of tasks_queue_states (never the table), and a
    count that reaches a bound says so."""
    node = await make_node()
    client = Client(node.address, namespace="n", timeout=10)
    try:
        await client.submit_many([NewTask(queue=f"q{i % 3}") for i in range(12)])
    finally:
        await client.close()
    full = await store.queue_counts("n", [TaskState.READY], max_tasks=100, max_queues=10)
    assert _by_key(full) == {(f"q{i}", TaskState.READY): 4 for i in range(3)}
    assert not full.capped and not full.truncated
    cut = await store.queue_counts("n", [TaskState.READY], max_tasks=5, max_queues=1)
    assert _by_key(cut) == {("q0", TaskState.READY): 4}  # the first queue, in queue order
    assert cut.capped == {TaskState.READY} and cut.truncated == {TaskState.READY}
    async with store.connection() as conn, conn.transaction():
        await conn.execute("SET LOCAL enable_seqscan = off")  # the plan a big table gets
        rows = await conn.fetch("EXPLAIN " + q("queue_counts"), "n", [0, 1, 2, 4], 100_000, 1000)
    plan = "\n".join(r[0] for r in rows)
    assert "Index Only Scan using tasks_queue_states" in plan, plan
    assert "Seq Scan" not in plan, plan
