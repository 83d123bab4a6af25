"""Pause and resume of a queue on real nodes: fired but not dispatched while paused (claims,
streams and hand-offs alike, on two nodes), dispatched on resume with the misfire policy
applied, a stale node's hand-off refused by the store, and the RPCs' auth and bad input."""

from __future__ import annotations

import asyncio
import math
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import generate_latest

from chronoq import errors
from chronoq.client import Client, NewTask, TaskContext, Worker
from chronoq.clock import ManualClock
from chronoq.models import MisfirePolicy, TaskState
from chronoq.node import Node
from chronoq.store import Store
from tests.integration.conftest import NodeFactory
from tests.integration.test_cluster_inproc import cluster, settled

pytestmark = pytest.mark.timeout(90)


async def _until(check: Any, seconds: float = 15.0) -> None:
    """Wait (bounded) until ``check()`` is true."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + seconds
    while not await check():
        assert loop.time() < deadline, "timed out"
        await asyncio.sleep(0.05)


async def _states(store: Store, ids: list[str]) -> list[TaskState]:
    return [(await store.get(i, "default")).state for i in ids]


async def test_a_paused_queue_fires_on_two_nodes_but_runs_only_after_resume(
    make_node: NodeFactory, etcd: Any, cluster_name: str, store: Store
) -> None:
    settings = cluster(etcd, cluster_name)
    a, b = [await make_node(cluster=settings, node_id=f"p{i}") for i in range(2)]
    await settled([a, b])
    ran: list[str] = []

    async def handler(ctx: TaskContext) -> None:
        ran.append(ctx.id)

    async with Client(a.address, timeout=10) as ca, Client(b.address, timeout=10) as cb:
        paused = await ca.pause_queue("pz")
        assert paused.paused and paused.paused_at is not None
        # Streams waiting on the queue on both nodes (hand-offs would reach them) and a
        # long-poll claim on each: none of them gets a task while the queue is paused.
        workers = [
            Worker(c, {"pz": handler}, concurrency=4, worker_id=f"w-{i}",
                   claim_wait=timedelta(milliseconds=300))
            for i, c in enumerate((ca, cb))
        ]
        runs = [asyncio.create_task(w.run()) for w in workers]
        try:
            await asyncio.sleep(0.5)  # the streams are open and waiting
            due_now = await cb.submit_many([NewTask(queue="pz") for _ in range(5)])
            soon = await ca.submit_many(
                [NewTask(queue="pz", delay=timedelta(milliseconds=300)) for _ in range(20)]
            )
            ids = [s.task.id for s in due_now + soon]
            polls = await asyncio.gather(
                *(c.claim(["pz"], max_tasks=10, wait=timedelta(seconds=1)) for c in (ca, cb))
            )
            assert polls == [[], []]

            async def all_ready() -> bool:
                return set(await _states(store, ids)) == {TaskState.READY}

            await _until(all_ready)
            await asyncio.sleep(0.5)  # a while longer: still nobody got one
            assert ran == []
            assert set(await _states(store, ids)) == {TaskState.READY}
            fired = [await store.get(i, "default") for i in ids]
            assert all(t.fired_at is not None and t.worker_id is None for t in fired)
            scrape = generate_latest(b.metrics.registry).decode()
            assert 'chronoq_queue_paused{namespace="default",queue="pz"} 1.0' in scrape

            resumed = await cb.resume_queue("pz")  # on the other node
            assert not resumed.settings.paused and resumed.skipped == 0

            async def all_ran() -> bool:
                return len(ran) >= len(ids)

            await _until(all_ran)
        finally:
            for w in workers:
                w.stop()
            await asyncio.gather(*runs)
        assert sorted(ran) == sorted(ids)
        assert set(await _states(store, ids)) == {TaskState.SUCCEEDED}


async def test_a_resume_skips_the_tasks_their_misfire_policy_skips(
    node: Node, client: Client, clock: ManualClock, store: Store
) -> None:
    await client.pause_queue("mf")
    grace = timedelta(seconds=5)
    skip = await client.submit_many(
        [NewTask(queue="mf", misfire_policy=MisfirePolicy.SKIP, misfire_grace=grace)
         for _ in range(4)]
    )
    late = await client.submit_many([NewTask(queue="mf") for _ in range(3)])
    clock.advance(timedelta(minutes=1))  # they wait, paused, past their grace
    resumed = await client.resume_queue("mf")
    assert resumed.skipped == 4
    assert set(await _states(store, [s.task.id for s in skip])) == {TaskState.SKIPPED}
    claimed = await client.claim(["mf"], max_tasks=10)
    assert sorted(t.id for t in claimed) == sorted(s.task.id for s in late)


async def test_a_node_with_a_stale_gate_cannot_hand_off_a_paused_queue(
    make_node: NodeFactory, store: Store
) -> None:
    """Another node paused the queue; this node's gate has not read it (frozen here): its
    submit and fire hand-offs still try, and the store's statements make the tasks READY."""
    node = await make_node()
    ran: list[str] = []

    async def handler(ctx: TaskContext) -> None:
        ran.append(ctx.id)

    async with Client(node.address, timeout=10) as client:
        worker = Worker(client, {"st": handler}, concurrency=4, worker_id="stale-w",
                        claim_wait=timedelta(milliseconds=300))
        run = asyncio.create_task(worker.run())
        try:
            handoff = node.submit_handoff
            assert handoff is not None
            open_ids: list[str] = []
            for _ in range(20):  # an open queue is handed off, once its stream waits quietly
                await asyncio.sleep(0.2)
                open_ids.append((await client.submit("st")).task.id)
                if handoff.handed_off:
                    break
            assert handoff.handed_off >= 1

            async def open_ran() -> bool:
                return sorted(ran) == sorted(open_ids)

            await _until(open_ran)
            node.gate._refresh = 3600.0  # this node's gate reads nothing more
            await store.pause_queue("default", "st", node.clock.now(), cap=10)  # elsewhere
            known = node.gate.known()
            assert known is not None and ("default", "st") not in known
            await asyncio.sleep(0.4)  # the stream's claim found nothing: the queue is quiet
            due = await client.submit("st")
            soon = await client.submit("st", delay=timedelta(milliseconds=200))
            ids = [due.task.id, soon.task.id]

            async def both_ready() -> bool:
                return await _states(store, ids) == [TaskState.READY] * 2

            await _until(both_ready)
            await asyncio.sleep(0.5)
            assert sorted(ran) == sorted(open_ids)
            assert [(await store.get(i, "default")).worker_id for i in ids] == [None, None]
        finally:
            worker.stop()
            await run


TEAM_A = "team-a-secret-0123456789"


@pytest.fixture
async def guarded(make_node: NodeFactory, tmp_path: Path) -> Node:
    path = tmp_path / "tokens.toml"
    path.write_text(f'[tokens]\n"{TEAM_A}" = ["team-a"]\n')
    path.chmod(0o600)
    return await make_node(auth_tokens=str(path))


async def test_queue_settings_need_a_token_of_their_namespace(
    guarded: Node, store: Store
) -> None:
    owner = Client(guarded.address, namespace="team-a", token=TEAM_A, timeout=5)
    intruder = Client(guarded.address, namespace="team-b", token=TEAM_A, timeout=5)
    anonymous = Client(guarded.address, namespace="team-b", timeout=5)
    try:
        for client, code in ((intruder, "PERMISSION_DENIED"), (anonymous, "UNAUTHENTICATED")):
            calls = {
                "set": client.set_queue("q", max_running_per_key=1),
                "pause": client.pause_queue("q"),
                "resume": client.resume_queue("q"),
                "get": client.queue_settings("q"),
                "list": client.list_queue_settings(),
            }
            for name, call in calls.items():
                with pytest.raises(errors.AccessDenied) as caught:
                    await call
                assert caught.value.code == code, name
        assert await store.gated_queues() == []  # nothing of team-b was touched
        assert (await owner.pause_queue("q")).namespace == "team-a"
        assert [s.queue for s in await owner.list_queue_settings()] == ["q"]
    finally:
        for c in (owner, intruder, anonymous):
            await c.close()


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"max_running_per_key": 10_001}, "max_running_per_key"),
        ({"max_starts_per_key": 100_001.0}, "max_starts_per_key"),
        ({"max_starts_per_key": -1.0}, "max_starts_per_key"),
        ({"max_starts_per_key": math.nan}, "max_starts_per_key"),
        ({"max_starts_per_key": math.inf}, "max_starts_per_key"),
        ({}, "max_running_per_key"),
    ],
)
async def test_bad_queue_settings_are_refused_naming_the_field(
    client: Client, kwargs: dict[str, Any], field: str
) -> None:
    with pytest.raises(errors.BadRequest) as caught:
        await client.set_queue("q", **kwargs)
    assert caught.value.message.startswith(f"INVALID_ARGUMENT: {field}:"), caught.value.message


async def test_a_bad_queue_name_is_refused_naming_the_field(client: Client) -> None:
    for bad in ("", "q\n", "x" * 129):
        with pytest.raises(errors.BadRequest) as caught:
            await client.pause_queue(bad)
        assert caught.value.message.startswith("INVALID_ARGUMENT: queue:"), caught.value.message


async def test_a_shard_added_later_takes_the_paused_queues(
    make_node: NodeFactory, etcd: Any, cluster_name: str, empty_db: str, tmp_path: Path
) -> None:
    """Each shard's claims read their own copy of the settings: AddShard copies the first
    shard's to the new one, so a partition moved there later stays paused."""
    tokens = tmp_path / "tokens.toml"
    tokens.write_text('[tokens]\n"admin-token-for-pauses" = ["*"]\n')
    tokens.chmod(0o600)
    node = await make_node(cluster=cluster(etcd, cluster_name), auth_tokens=str(tokens))
    async with Client(node.address, token="admin-token-for-pauses", timeout=40) as admin:
        await admin.pause_queue("moving")
        await admin.set_queue("keyed", max_running_per_key=2)
        added = await admin.add_shard(empty_db)
        assert added.shard == "shard-1"
    joined = await Store.connect(empty_db, partitions=16, min_size=1, max_size=2, migrate=False)
    try:
        got = {s.queue: s for s in await joined.gated_queues()}
        assert got["moving"].paused and got["keyed"].max_running_per_key == 2
    finally:
        await joined.close()


async def test_the_typescript_client_pauses_and_resumes(make_node: NodeFactory) -> None:
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
    node = await make_node()
    proc = await asyncio.create_subprocess_exec(
        node_js, str(FOLDER / "dist" / "examples" / "pause.js"), node.address, "ts-ns",
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
    assert report.pop("refused").startswith("INVALID_ARGUMENT: max_running_per_key:")
    assert report == {
        "paused": True,
        "pausedAt": True,
        "whilePaused": 0,
        "resumed": True,
        "skipped": 0,
        "claimed": True,
        "maxRunningPerKey": 3,
    }
