"""Bulk operations by filter through the API: 100,000 tasks cancelled by label while another
namespace's tasks keep firing on time, namespaces kept apart (by the filter and by tokens),
bad input refused with the field to fix, and ListTasks filters.

Real node, real PostgreSQL, real etcd (ownership of the partitions). The lateness of the other
namespace's tasks is printed for the record, not asserted (a shared 2-core machine).
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from chronoq.api.v1 import tasks_pb2
from chronoq.client import Client
from chronoq.coordinator.etcd import ClusterSettings
from chronoq.diagnostics.task_rows import COPY_COLUMNS, copy_rows, task_rows
from chronoq.errors import AccessDenied, BadRequest
from chronoq.models import TaskSpec, TaskState
from chronoq.node import Node
from chronoq.store import Store
from tests.integration.conftest import NodeFactory

pytestmark = pytest.mark.timeout(300)

BULK = 100_000
STEADY = 400
STEADY_EVERY_MS = 25
#: Seconds of the other namespace's firing measured before the cancel starts.
BASELINE_S = 3.0
LABEL = {"batch": "b1"}
TOKEN_A = "team-a-token-0123456789abcdef"
TOKEN_B = "team-b-token-fedcba9876543210"


def _labelled_rows(count: int, namespace: str, first: datetime) -> Iterator[tuple[Any, ...]]:
    """SCHEDULED task rows of ``namespace`` carrying ``LABEL``, due from ``first`` over an hour."""
    labels = json.dumps(LABEL)
    for row in task_rows(count, first, timedelta(hours=1), now=first, partitions=16):
        yield (row[0], namespace, *row[2:], labels)


def _quantiles(late: list[float]) -> str:
    if not late:
        return "(none due)"
    p50, p99 = late[len(late) // 2], late[max(0, int(len(late) * 0.99) - 1)]
    return (
        f"{p50 * 1000:.0f} ms median, p99 {p99 * 1000:.0f} ms, max {late[-1] * 1000:.0f} ms "
        f"({len(late)} tasks)"
    )


async def _states(store: Store, namespace: str) -> dict[int, int]:
    async with store.connection() as conn:
        rows = await conn.fetch(
            "SELECT state, count(*) AS n FROM tasks_with_history WHERE namespace = $1"
            " GROUP BY state",
            namespace,
        )
    return {r["state"]: r["n"] for r in rows}


async def _ready_by_id(store: Store, ids: list[str]) -> None:
    deadline = asyncio.get_running_loop().time() + 60
    while True:
        async with store.connection() as conn:
            left = await conn.fetchval(
                "SELECT count(*) FROM tasks WHERE id::text = ANY($1::text[]) AND state = 0", ids
            )
        if left == 0:
            return
        assert asyncio.get_running_loop().time() < deadline, f"{left} steady tasks never fired"
        await asyncio.sleep(0.2)


async def test_bulk_cancel_of_100k_by_label_while_another_namespace_fires_on_time(
    make_node: NodeFactory, etcd: Any, cluster_name: str, store: Store
) -> None:
    cluster = ClusterSettings(
        etcd=etcd.client_settings(cluster_name), lease_ttl=3, reconcile_interval=0.5
    )
    node: Node = await make_node(cluster=cluster, node_id="bulk-0")
    started = datetime.now(UTC)
    async with store.connection() as conn:
        await copy_rows(
            conn,
            _labelled_rows(BULK, "tenant-bulk", started + timedelta(hours=1)),
            BULK,
            columns=(*COPY_COLUMNS, "labels"),
        )
        await conn.execute("ANALYZE tasks")
    client = Client(node.address, namespace="tenant-bulk", timeout=60)
    try:
        await client.wait_ready()
        dry = await client.cancel_where(labels=LABEL, dry_run=True)
        assert dry.count == BULK and not dry.more
        assert (await _states(store, "tenant-bulk")) == {int(TaskState.SCHEDULED): BULK}

        # The other namespace carries the very same label, a task due every 25 ms from just
        # after the cancel starts.
        first = datetime.now(UTC) + timedelta(seconds=1)
        steady = await store.submit(
            [
                TaskSpec(
                    queue="steady",
                    namespace="tenant-steady",
                    run_at=first + timedelta(milliseconds=STEADY_EVERY_MS * i),
                    labels=tuple(LABEL.items()),
                )
                for i in range(STEADY)
            ],
            datetime.now(UTC),
        )
        await asyncio.sleep(BASELINE_S)  # tasks due before the cancel: the figure beside
        began, began_at = time.perf_counter(), datetime.now(UTC)
        done = await client.cancel_where(labels=LABEL)
        took, ended_at = time.perf_counter() - began, datetime.now(UTC)
        assert done.count == BULK and not done.more
        assert (await _states(store, "tenant-bulk")) == {int(TaskState.CANCELLED): BULK}

        ids = [o.task.id for o in steady]
        await _ready_by_id(store, ids)
        async with store.connection() as conn:
            rows = await conn.fetch(
                "SELECT state, run_at, extract(epoch FROM fired_at - run_at) AS late FROM tasks "
                "WHERE namespace = 'tenant-steady'"
            )
        assert len(rows) == STEADY
        assert all(r["state"] == int(TaskState.READY) for r in rows)  # fired, none cancelled
        during = sorted(float(r["late"]) for r in rows if began_at <= r["run_at"] <= ended_at)
        assert during, "no task of the other namespace came due while the cancel ran"
        before = sorted(float(r["late"]) for r in rows if r["run_at"] < began_at)
        print(
            f"\nbulk cancel of {BULK:,} tasks by label: {took:.1f} s ({BULK / took:,.0f} "
            f"tasks/s); the other namespace's tasks fired late by {_quantiles(during)} while "
            f"it ran, {_quantiles(before)} before it"
        )
    finally:
        await client.close()


async def test_filters_list_and_bulk_calls_stay_in_their_namespace(
    make_node: NodeFactory, store: Store, tmp_path: Path
) -> None:
    tokens = tmp_path / "tokens.toml"
    tokens.write_text(f'[tokens]\n"{TOKEN_A}" = ["team-a"]\n"{TOKEN_B}" = ["team-b"]\n')
    tokens.chmod(0o600)
    node = await make_node(auth_tokens=str(tokens))
    now = datetime.now(UTC)
    later = now + timedelta(hours=1)
    red, blue = (("color", "red"),), (("color", "blue"),)
    await store.submit(
        [TaskSpec(queue="q", namespace=ns, run_at=later, labels=red) for ns in ("team-a", "team-b")]
        * 5
        + [TaskSpec(queue="q", namespace="team-a", run_at=later, labels=blue)] * 3,
        now,
    )
    a = Client(node.address, namespace="team-a", token=TOKEN_A, timeout=10)
    sneaky = Client(node.address, namespace="team-b", token=TOKEN_A, timeout=10)
    try:
        page = await a.list(labels={"color": "red"})
        assert len(page.tasks) == 5 and {t.namespace for t in page.tasks} == {"team-a"}
        assert all(dict(t.labels) == {"color": "red"} for t in page.tasks)
        assert len((await a.list(labels={"color": "blue"}, queue="q")).tasks) == 3
        assert (await a.list(run_at_to=now)).tasks == []
        # The attack: team-a's token, team-b's namespace: refused before anything is read.
        with pytest.raises(AccessDenied):
            await sneaky.cancel_where(labels={"color": "red"})
        with pytest.raises(AccessDenied):
            await sneaky.list(labels={"color": "red"})
        done = await a.cancel_where(labels={"color": "red"})
        assert done.count == 5
        assert (await _states(store, "team-b")) == {int(TaskState.SCHEDULED): 5}
        ran = await a.run_now_where(labels={"color": "blue"})
        assert ran.count == 3
        assert {t.state for t in (await a.list(labels={"color": "blue"})).tasks} == {
            TaskState.READY
        }
    finally:
        await a.close()
        await sneaky.close()


@pytest.mark.parametrize(
    ("request_", "field"),
    [
        (tasks_pb2.BulkRequest(), "filter"),
        (
            tasks_pb2.BulkRequest(
                filter=tasks_pb2.TaskFilter(labels={f"k{i}": "v" for i in range(17)})
            ),
            "filter.labels",
        ),
        (tasks_pb2.BulkRequest(filter=tasks_pb2.TaskFilter(labels={"bad key!": "v"})), "filter.labels"),
        (tasks_pb2.BulkRequest(filter=tasks_pb2.TaskFilter(queue="no spaces")), "filter.queue"),
        (tasks_pb2.BulkRequest(filter=tasks_pb2.TaskFilter(queue="q", state=99)), "filter.state"),
        (tasks_pb2.BulkRequest(filter=tasks_pb2.TaskFilter(queue="q"), max_tasks=100_001), "max_tasks"),
        (
            tasks_pb2.BulkRequest(filter=tasks_pb2.TaskFilter(queue="q"), page_token="not-a-token"),
            "page_token",
        ),
        (
            tasks_pb2.BulkRequest(
                filter=tasks_pb2.TaskFilter(
                    queue="q",
                    run_at_from={"seconds": 2_000_000_000},
                    run_at_to={"seconds": 1_000_000_000},
                )
            ),
            "filter.run_at_to",
        ),
    ],
)
async def test_bad_bulk_requests_name_the_field_to_fix(
    node: Node, client: Client, request_: tasks_pb2.BulkRequest, field: str
) -> None:
    for method in ("CancelWhere", "RequeueWhere", "RunNowWhere"):
        with pytest.raises(BadRequest, match=field.replace(".", r"\.")):
            await client._call(lambda n, m=method: getattr(n.tasks, m), request_)  # type: ignore[misc]


async def test_bad_listing_filters_name_the_field_to_fix(node: Node, client: Client) -> None:
    with pytest.raises(BadRequest, match="labels"):
        await client.list(labels={f"k{i}": "v" for i in range(17)})
    with pytest.raises(BadRequest, match="run_at_to"):
        at = datetime(2030, 1, 1, tzinfo=UTC)
        await client.list(labels={"a": "b"}, run_at_from=at, run_at_to=at)


async def test_the_cli_cancels_requeues_and_runs_now_by_filter(node: Node, store: Store) -> None:
    from tests.integration.test_cli import cli, failed, ok

    now = datetime(2030, 1, 1, 12, 0, 10, tzinfo=UTC)
    made = await store.submit(
        [TaskSpec(queue="q", run_at=now + timedelta(hours=1), labels=(("c", "42"),))] * 3
        + [TaskSpec(queue="q", run_at=now + timedelta(hours=1), labels=(("c", "7"),))] * 2,
        now,
    )
    address = ["--address", node.address]
    assert "3 task(s) match; nothing was cancelled" in ok(
        await cli("cancel", "--queue", "q", "--label", "c=42", "--dry-run", *address)
    )
    listed = json.loads(ok(await cli("list", "--label", "c=42", "--json", *address)))
    assert len(listed) == 3
    assert "2 task(s) made ready" in ok(await cli("run-now", "--label", "c=7", *address))
    assert "3 task(s) cancelled" in ok(await cli("cancel", "--label", "c=42", *address))
    assert "0 task(s) requeued" in ok(await cli("requeue", "--queue", "q", *address))
    states = {t.id: t.state for t in (await store.list_tasks("default")).tasks}
    assert sorted(states[o.task.id] for o in made) == [TaskState.READY] * 2 + [
        TaskState.CANCELLED
    ] * 3
    failed(await cli("cancel", made[0].task.id, "--label", "c=42", *address), 2, "not both")
    failed(await cli("cancel", *address), 2, "filter")
    failed(await cli("run-now", *address), 2, "filter")
    failed(await cli("cancel", "--label", "novalue", *address), 2, "KEY=VALUE")
    failed(await cli("cancel", "--label", "bad key!=v", *address), 1, "labels")


async def test_the_typescript_client_lists_by_label_and_works_in_bulk(
    make_node: NodeFactory, store: Store
) -> None:
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
    node = await make_node()
    proc = await asyncio.create_subprocess_exec(
        node_js, str(FOLDER / "dist" / "examples" / "bulk.js"), node.address, "ts-ns",
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
    assert report["listed"] == [{"customer": "42"}] * 4
    assert report["dryRun"] == {"count": 4, "more": False}
    assert report["ranNow"] == {"count": 2, "more": False}
    assert report["cancelled"] == {"count": 4, "more": False}
    assert report["ready"] == 2
    assert (await _states(store, "ts-ns")) == {
        int(TaskState.READY): 2,
        int(TaskState.CANCELLED): 4,
    }
