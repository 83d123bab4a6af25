"""QueueCounts: counts by queue that the partition owners keep, summed per call, right after
submits, fires, claims and acks within the staleness the answer states, per namespace only,
bounded (real node, real PostgreSQL)."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from chronoq import errors
from chronoq.client import Client, NewTask
from chronoq.limits import MAX_KEPT_QUEUES
from chronoq.models import Lease, TaskState
from chronoq.queuecounts import REST, QueueSnapshot, StateCounts
from chronoq.store import Store
from chronoq.store.sql import q
from tests.integration.conftest import NodeFactory

pytestmark = pytest.mark.timeout(180)
#: Seconds a test waits for a count taken after its mark.
COUNT_WAIT_S = 45.0

TOKEN_A = "team-a-token-0123456789abcdef"
TOKEN_B = "team-b-token-fedcba9876543210"
FAST = {"queue_counts_interval": timedelta(milliseconds=100)}


async def counted_after(client: Client, mark: datetime, **kw: object) -> QueueSnapshot:
    """The first answer whose every partition was counted after ``mark``, waited for up to
    ``COUNT_WAIT_S``: a recount waits out a multiple of its last pass (``RECOUNT_SHARE``), so
    on a loaded host the counts grow staler by design, and the wait is for correctness only."""
    deadline = asyncio.get_running_loop().time() + COUNT_WAIT_S
    while True:
        snap = await client.queue_counts(**kw)  # type: ignore[arg-type]
        if snap.as_of is not None and snap.as_of > mark and snap.uncounted_partitions == 0:
            return snap
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError(f"no count after {mark}: last {snap}")
        await asyncio.sleep(0.05)


def by_queue(snap: QueueSnapshot) -> dict[str, StateCounts]:
    return {t.queue: t.counts for t in snap.queues}


async def test_counts_follow_submits_fires_claims_and_acks(make_node: NodeFactory) -> None:
    """Each count is taken when no task is between states: READY and RUNNING are recounted
    apart from the other states (``ready_as_of``), so a task that fires between the two
    recounts is in both until the next full one (test_a_task_moved_between_the_recounts_...)."""
    node = await make_node(**FAST)
    client = Client(node.address, namespace="n", timeout=10)
    try:
        await client.submit_many([NewTask(queue="mail") for _ in range(5)])
        await client.submit_many(
            [NewTask(queue="later", delay=timedelta(hours=1)) for _ in range(3)]
        )
        mark = datetime.now(UTC)
        snap = await counted_after(client, mark)
        assert snap.staleness is not None and snap.staleness < timedelta(seconds=30)
        assert snap.ready_as_of is not None and snap.ready_as_of > mark
        counts = by_queue(snap)
        assert counts == {"mail": StateCounts(ready=5), "later": StateCounts(scheduled=3)}
        assert snap.totals.total == 8 and snap.other == StateCounts() and not snap.truncated
        oldest = snap.oldest_ready_age("mail")
        assert oldest is not None and oldest >= timedelta(0)
        assert snap.oldest_ready_age("later") is None  # nothing of it is READY

        soon = await client.submit_many(
            [NewTask(queue="soon", delay=timedelta(milliseconds=300)) for _ in range(2)]
        )
        claimed = await client.claim(["mail"], max_tasks=2)
        await client.complete(Lease(claimed[0].id, claimed[0].attempt))
        (doomed,) = await client.claim(["mail"], max_tasks=1)
        await client.fail(Lease(doomed.id, doomed.attempt), "boom", fatal=True)
        await fired(client, [s.task.id for s in soon])
        snap = await counted_after(client, datetime.now(UTC))
        counts = by_queue(snap)
        assert counts["mail"] == StateCounts(ready=2, running=1, dead=1)
        assert counts["soon"] == StateCounts(ready=2)
        assert counts["later"] == StateCounts(scheduled=3)
        assert snap.totals.total == 9  # the one that succeeded is counted no more
        only = await counted_after(client, datetime.now(UTC), queues=["soon", "nothing"])
        assert by_queue(only) == {"soon": StateCounts(ready=2), "nothing": StateCounts()}
        assert only.totals == StateCounts(ready=2)
    finally:
        await client.close()


async def fired(client: Client, ids: list[str]) -> None:
    """Wait (bounded) until every task of ``ids`` has fired (READY)."""
    for _ in range(400):
        tasks = [await client.get(i) for i in ids]
        if all(t.state is TaskState.READY for t in tasks):
            return
        await asyncio.sleep(0.05)
    raise AssertionError(f"not fired: {tasks}")


async def test_a_task_moved_between_the_recounts_is_counted_as_of_each(store: Store) -> None:
    """The frequent recount of READY and RUNNING leaves the other states as the last full
    recount counted them: a task fired in between is in both (SCHEDULED as of ``as_of``,
    READY as of ``ready_as_of``), one retried in neither, until the next full recount."""
    now = datetime.now(UTC)
    async with store.connection() as conn:
        await conn.execute(
            "INSERT INTO tasks (id, namespace, queue, partition, bucket, run_at, state,"
            " max_attempts, backoff_initial_ms, backoff_max_ms, lease_timeout_ms,"
            " misfire_grace_ms, created_at)"
            " SELECT gen_random_uuid(), 'n', q, 3, 0, $1, s, 3, 1000, 60000, 30000, 0, $1"
            " FROM unnest(ARRAY['fired', 'retried'], ARRAY[0, 2]::smallint[]) u(q, s)",
            now,
        )
    await store.recount_queues([3], now, "test", max_queues=MAX_KEPT_QUEUES)
    async with store.connection() as conn:  # the SCHEDULED one fires, the RUNNING one retries
        await conn.execute("UPDATE tasks SET state = CASE state WHEN 0 THEN 1 ELSE 0 END")
    later = now + timedelta(seconds=1)
    live = (TaskState.READY, TaskState.RUNNING)
    await store.recount_queues([3], later, "test", max_queues=MAX_KEPT_QUEUES, states=live)
    kept = await store.kept_counts("n", None, max_queues=MAX_KEPT_QUEUES)
    assert kept.rows == {("fired", TaskState.SCHEDULED): 1, ("fired", TaskState.READY): 1}
    assert (kept.as_of, kept.live_as_of) == (now, later)
    await store.recount_queues([3], later, "test", max_queues=MAX_KEPT_QUEUES)
    kept = await store.kept_counts("n", None, max_queues=MAX_KEPT_QUEUES)
    assert kept.rows == {("fired", TaskState.READY): 1, ("retried", TaskState.SCHEDULED): 1}
    assert kept.totals == {TaskState.SCHEDULED: 1, TaskState.READY: 1}


async def test_counts_are_the_callers_namespace_only(
    make_node: NodeFactory, tmp_path: Path
) -> None:
    tokens = tmp_path / "tokens.toml"
    tokens.write_text(f'[tokens]\n"{TOKEN_A}" = ["team-a"]\n"{TOKEN_B}" = ["team-b"]\n')
    tokens.chmod(0o600)
    node = await make_node(auth_tokens=str(tokens), **FAST)
    a = Client(node.address, namespace="team-a", token=TOKEN_A, timeout=10)
    b = Client(node.address, namespace="team-b", token=TOKEN_B, timeout=10)
    a_as_b = Client(node.address, namespace="team-b", token=TOKEN_A, timeout=10)
    try:
        await a.submit_many([NewTask(queue="mail") for _ in range(3)])
        await b.submit_many([NewTask(queue="mail") for _ in range(7)])
        mark = datetime.now(UTC)
        assert by_queue(await counted_after(a, mark)) == {"mail": StateCounts(ready=3)}
        assert by_queue(await counted_after(b, mark)) == {"mail": StateCounts(ready=7)}
        with pytest.raises(errors.AccessDenied, match="team-b"):
            await a_as_b.queue_counts()  # another tenant's counts are not this token's
        with pytest.raises(errors.BadRequest, match="queues"):
            await a.queue_counts([f"q{i}" for i in range(101)])
        with pytest.raises(errors.BadRequest, match="queues"):
            await a.queue_counts(["bad queue!"])
        with pytest.raises(errors.BadRequest, match="label_key"):
            await a.queue_counts(label_key="no spaces")
    finally:
        for c in (a, b, a_as_b):
            await c.close()


async def test_counts_per_label_value_are_read_up_to_a_bound(make_node: NodeFactory) -> None:
    node = await make_node(**FAST)
    client = Client(node.address, namespace="n", timeout=10)
    try:
        await client.submit_many(
            [NewTask(queue="mail", labels={"tenant": f"t{i % 2}"}) for i in range(5)]
            + [NewTask(queue="mail")]
        )
        snap = await counted_after(client, datetime.now(UTC), label_key="tenant")
        assert {(x.queue, x.value): x.counts for x in snap.labels} == {
            ("mail", "t0"): StateCounts(ready=3),
            ("mail", "t1"): StateCounts(ready=2),
            ("mail", ""): StateCounts(ready=1),
        }
        assert not snap.labels_capped
    finally:
        await client.close()


async def test_a_recount_keeps_its_bound_of_queues_and_reads_the_index_only(
    store: Store,
) -> None:
    """A partition with more queues than kept sums the rest under one row (totals exact);
    the recount is an index-only scan of tasks_partition_states, never the table."""
    now = datetime.now(UTC)
    queues = MAX_KEPT_QUEUES + 5
    async with store.connection() as conn:
        await conn.execute(
            "INSERT INTO tasks (id, namespace, queue, partition, bucket, run_at, state,"
            " max_attempts, backoff_initial_ms, backoff_max_ms, lease_timeout_ms,"
            " misfire_grace_ms, created_at)"
            " SELECT gen_random_uuid(), 'n', 'q' || lpad(i::text, 5, '0'), 3, 0, $1, 1,"
            " 3, 1000, 60000, 30000, 0, $1 FROM generate_series(1, $2) i",
            now,
            queues,
        )
    read = await store.recount_queues([3], now, "test", max_queues=MAX_KEPT_QUEUES)
    assert read == queues
    kept = await store.kept_counts("n", None, max_queues=MAX_KEPT_QUEUES)
    assert kept.rows[REST, TaskState.READY] == 5
    assert kept.totals[TaskState.READY] == queues
    assert kept.counted == 1 and kept.as_of == now
    async with store.connection() as conn:
        before = await conn.fetch("SELECT queue, xmin::text FROM queue_state_counts")
        await conn.execute("DELETE FROM tasks WHERE queue = 'q00001'")
    await store.recount_queues([3], now, "test", max_queues=MAX_KEPT_QUEUES)
    async with store.connection() as conn:
        after = await conn.fetch("SELECT queue, xmin::text FROM queue_state_counts")
    moved = {r["queue"] for r in before} ^ {r["queue"] for r in after}
    # A count that did not move is not written again; the queue's shift moved one task
    # from the summed rest into the kept ones.
    assert "q00001" not in {r["queue"] for r in after}
    assert moved == {"q00001", f"q{MAX_KEPT_QUEUES + 1:05d}"}
    unchanged = {(r["queue"], r["xmin"]) for r in before} & {(r["queue"], r["xmin"]) for r in after}
    assert len(unchanged) >= MAX_KEPT_QUEUES - 1
    # The frequent recount of READY and RUNNING alone leaves the other states' rows and the
    # every-state count time alone.
    async with store.connection() as conn:
        await conn.execute("UPDATE tasks SET state = 0 WHERE queue = 'q00002'")
    later = now + timedelta(seconds=1)
    live = (TaskState.READY, TaskState.RUNNING)
    await store.recount_queues([3], later, "test", max_queues=MAX_KEPT_QUEUES, states=live)
    kept = await store.kept_counts("n", None, max_queues=MAX_KEPT_QUEUES)
    assert (kept.as_of, kept.live_as_of) == (now, later)
    assert ("q00002", TaskState.READY) not in kept.rows
    assert ("q00002", TaskState.SCHEDULED) not in kept.rows  # counted at the next full pass
    other = await store.kept_counts("other-namespace", None, max_queues=MAX_KEPT_QUEUES)
    assert other.rows == {} and other.totals == {}  # a namespace sees its own rows only
    async with store.connection() as conn, conn.transaction():
        await conn.execute("SET LOCAL enable_seqscan = off")  # the plan a big table gets
        await conn.execute("SET LOCAL enable_bitmapscan = off")
        rows = await conn.fetch("EXPLAIN " + q("recount_queue_counts"), [3, 4], 1000, [1, 2])
    plan = "\n".join(r[0] for r in rows)
    assert "Index Only Scan using tasks_partition_states" in plan, plan
    # READY and RUNNING are searched in the index (read alone), not filtered after a read.
    assert "state = ANY" in plan.split("Index Cond:")[1].splitlines()[0], plan


async def test_the_typescript_client_reads_queue_counts(make_node: NodeFactory) -> None:
    import json
    import shutil
    import subprocess

    from tests.integration.test_typescript_client import (
        BUILD_TIMEOUT,
        FOLDER,
        RUN_TIMEOUT,
        installed,
    )

    node_js, npx = shutil.which("node"), shutil.which("npx")
    await asyncio.to_thread(installed)  # npm ci if this runs first
    compiled = await asyncio.to_thread(
        subprocess.run, [npx, "tsc", "-p", "."], cwd=FOLDER, capture_output=True, text=True,
        timeout=BUILD_TIMEOUT, check=False,
    )  # fmt: skip
    assert compiled.returncode == 0, compiled.stdout + compiled.stderr
    node = await make_node(**FAST)
    proc = await asyncio.create_subprocess_exec(
        node_js, str(FOLDER / "dist" / "examples" / "counts.js"), node.address, "ts-ns",
        cwd=FOLDER, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    try:
        stdout, stderr = await asyncio.wait_for(proc.communicate(), RUN_TIMEOUT)
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
    assert proc.returncode == 0, stdout.decode() + stderr.decode()
    report = json.loads(stdout.decode().strip().splitlines()[-1])
    assert report == {
        "queue": "ts-counts",
        "counts": {"scheduled": 0, "ready": 3, "running": 0, "dead": 0},
        "oldestReady": True,
        "fresh": True,
    }


async def test_the_cli_shows_the_counts_as_a_table_and_as_json(make_node: NodeFactory) -> None:
    import json

    from tests.integration.test_cli import cli, failed, ok

    node = await make_node(**FAST)
    client = Client(node.address, timeout=10)
    try:
        await client.submit_many([NewTask(queue="emails") for _ in range(2)])
        await counted_after(client, datetime.now(UTC))
    finally:
        await client.close()
    address = ["--address", node.address]
    data = json.loads(ok(await cli("queues", "--json", *address)))
    (emails,) = data["queues"]
    assert emails["queue"] == "emails"
    assert emails["counts"] == {"scheduled": 0, "ready": 2, "running": 0, "dead": 0}
    assert emails["oldest_ready_age"] >= 0 and data["as_of"] and data["staleness"] >= 0
    table = ok(await cli("queues", *address))
    assert "emails" in table and "as of" in table and "total" in table
    failed(await cli("queues", "bad queue!", *address), 1, "queues")


async def test_a_flood_of_one_question_costs_the_store_one_read(store: Store) -> None:
    """Callers asking at once or in a loop get the answer read once within its second; a
    different question is read on its own."""
    from chronoq.api.v1 import tasks_pb2
    from chronoq.clock import SystemClock
    from chronoq.node.edge.queue_counts import Answers

    answers = Answers(store, SystemClock(), 16)
    ask = tasks_pb2.QueueCountsRequest(namespace="n")
    got = await asyncio.gather(*(answers.answer(ask) for _ in range(50)))
    for _ in range(50):
        got.append(await answers.answer(ask))
    assert answers.reads == 1 and all(g == got[0] for g in got)
    await answers.answer(tasks_pb2.QueueCountsRequest(namespace="n", queues=["mail"]))
    assert answers.reads == 2
