"""A node on a replicated PostgreSQL (3 members under Patroni on the session's etcd) rides a
store failover: no acknowledged submit is lost, firing resumes, fencing holds across the
primary change, and a commit the standby never confirmed is not taken for an acknowledgement.

The cluster is the session's ``ha`` (tests/conftest.py), shared with the store contracts'
"patroni" shape when a session runs both: skipped, saying why, where Patroni cannot be
installed (no package registry, no system Python or no useradd).
"""

from __future__ import annotations

import asyncio
import base64
import json
import os
import signal
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any
from urllib.parse import quote, urlsplit

import asyncpg
import pytest

from chronoq.client import Client, NewTask
from chronoq.config import NodeSettings
from chronoq.embedded import processes
from chronoq.embedded.ha import PatroniCluster
from chronoq.errors import StoreUnavailable
from chronoq.models import TaskSpec, TaskState
from chronoq.node import Node
from chronoq.store import Store
from chronoq.store.connection import NotPrimary

pytestmark = pytest.mark.timeout(240)

PARTITIONS = 16


@pytest.fixture
def ha_dsn(ha: PatroniCluster) -> str:
    return ha.ensure_database(f"t{uuid.uuid4().hex[:10]}")


@pytest.fixture
async def node(ha_dsn: str) -> AsyncIterator[Node]:
    settings = NodeSettings(
        dsn=ha_dsn, port=0, partitions=PARTITIONS, tick=timedelta(milliseconds=50)
    )
    node = Node(settings)
    await node.start()
    try:
        yield node
    finally:
        await asyncio.wait_for(node.stop(grace=0.5), 30)


@pytest.fixture
async def store(ha_dsn: str, node: Node) -> AsyncIterator[Store]:
    s = await Store.connect(ha_dsn, partitions=PARTITIONS, min_size=1, max_size=2)
    try:
        yield s
    finally:
        await s.close()


async def _submit_until(client: Client, stop: float, acked: list[str]) -> None:
    """Submit small batches due in 1 s until ``stop``; keep the ids that were acknowledged."""
    while time.monotonic() < stop:
        batch = [NewTask(queue="ha", delay=timedelta(seconds=1)) for _ in range(5)]
        ids = await client.submit_ids(batch)  # the SDK waits out the failover itself
        acked.extend(i for i, _ in ids)
        await asyncio.sleep(0.05)


async def _missing_and_unfired(store: Store, ids: list[str]) -> tuple[int, int]:
    async with store.connection() as conn:
        found, unfired = await conn.fetchrow(
            "SELECT count(*), count(*) FILTER (WHERE state = $2) FROM tasks_with_history"
            " WHERE id = ANY($1::uuid[])",
            ids,
            int(TaskState.SCHEDULED),
        )
    return len(ids) - found, unfired


async def test_postmaster_kill_loses_no_acknowledged_submit(
    ha: PatroniCluster, node: Node, store: Store
) -> None:
    acked: list[str] = []
    async with Client(node.address, timeout=10) as client:
        await _submit_until(client, time.monotonic() + 1, acked)
        before = len(acked)
        killed = ha.kill_postmaster()
        await _submit_until(client, time.monotonic() + 4, acked)
    assert len(acked) > before, "no submit succeeded after the primary's postmaster died"

    deadline = time.monotonic() + 60
    while True:
        missing, unfired = await _missing_and_unfired(store, acked)
        if unfired == 0 or time.monotonic() > deadline:
            break
        await asyncio.sleep(0.2)
    print(f"killed {killed}'s postmaster; {len(acked)} acked, {missing} lost, {unfired} unfired")
    assert missing == 0  # not one acknowledged task lost
    assert unfired == 0  # and firing resumed for all of them


async def test_fencing_holds_across_a_primary_change(ha: PatroniCluster, ha_dsn: str) -> None:
    """Fences live in the replicated store: a token recorded before the failover is still
    there after it, so the stale owner's firing is refused and the successor's is not."""
    store = await Store.connect(ha_dsn, partitions=PARTITIONS, min_size=1, max_size=2)
    try:
        now = datetime.now(UTC)
        [(task_id, _)] = await store.submit_ids([TaskSpec(queue="fence", run_at=now)], now)
        async with store.connection() as conn:
            partition = await conn.fetchval("SELECT partition FROM tasks WHERE id = $1", task_id)
            await conn.execute("UPDATE tasks SET state = $2 WHERE id = $1", task_id, 0)
        assert await store.take_fence(partition, 100, "cid", "old") is not None
        old_primary = ha.leader()
        ha.switchover()
        assert ha.leader() != old_primary
        fence = None
        for _ in range(100):  # the pool reconnects to the new primary on its own
            try:
                fence = await store.take_fence(partition, 101, "cid", "new")
                break
            except StoreUnavailable:
                await asyncio.sleep(0.2)
        assert fence is not None and fence.token == 101
        assert await store.take_fence(partition, 100, "cid", "old") is None
        later = now + timedelta(seconds=5)
        stale = await store.fire_due({partition: 100}, later, node_id="old")
        assert stale.fired == 0  # the stale owner's write is refused by the store
        fresh = await store.fire_due({partition: 101}, later, node_id="new")
        assert fresh.fired == 1
    finally:
        await store.close()


def _walreceivers(ha: PatroniCluster) -> list[int]:
    pids = []
    for member in ha.members.values():
        for pid in processes.server_pids(member.data_dir, ha.bin_dir):
            try:
                title = Path(f"/proc/{pid}/cmdline").read_bytes()
            except OSError:
                continue
            if b"walreceiver" in title:
                pids.append(pid)
    return pids


async def test_a_commit_the_standby_never_confirmed_is_not_an_ack(
    ha: PatroniCluster, ha_dsn: str
) -> None:
    """With every standby's WAL receiver frozen, a COMMIT waits for the synchronous standby;
    cancelling that wait makes PostgreSQL report success with only a warning, although the
    row is not replicated. The store turns that into StoreUnavailable (outcome unknown)."""
    ha.wait_ready(60)
    store = await Store.connect(ha_dsn, partitions=PARTITIONS, min_size=1, max_size=2)
    frozen = _walreceivers(ha)
    assert frozen, "no WAL receiver found"
    try:
        for pid in frozen:
            os.kill(pid, signal.SIGSTOP)
        now = datetime.now(UTC)
        submit = asyncio.create_task(store.submit_ids([TaskSpec(queue="sync", run_at=now)], now))
        async with store.pool.acquire() as admin:
            waiting = None
            for _ in range(100):
                waiting = await admin.fetchval(
                    "SELECT pid FROM pg_stat_activity WHERE wait_event = 'SyncRep'"
                )
                if waiting is not None:
                    break
                await asyncio.sleep(0.05)
            assert waiting is not None, "the COMMIT did not wait for the standby"
            await admin.fetchval("SELECT pg_cancel_backend($1)", waiting)
        with pytest.raises(StoreUnavailable, match="outcome unknown"):
            await asyncio.wait_for(submit, 10)
    finally:
        for pid in frozen:
            os.kill(pid, signal.SIGCONT)
        await store.close()


@pytest.mark.slow
async def test_losing_the_primary_member_loses_no_acknowledged_submit(
    ha: PatroniCluster, node: Node, store: Store
) -> None:
    """Patroni and postgres of the primary killed, as a lost machine: the synchronous standby
    takes over once the leader key expires (Patroni's TTL, 20 s); the member comes back as a
    standby (pg_rewind)."""
    ha.wait_ready(60)
    acked: list[str] = []
    async with Client(node.address, timeout=10) as client:
        await _submit_until(client, time.monotonic() + 1, acked)
        lost_member = ha.kill_member()
        await _submit_until(client, time.monotonic() + 30, acked)
    await asyncio.to_thread(ha.restart_member, lost_member)
    await asyncio.to_thread(ha.wait_ready, 120)
    deadline = time.monotonic() + 60
    while True:
        missing, unfired = await _missing_and_unfired(store, acked)
        if unfired == 0 or time.monotonic() > deadline:
            break
        await asyncio.sleep(0.2)
    assert ha.leader() != lost_member
    assert missing == 0 and unfired == 0


async def test_a_standby_is_refused_as_the_store(ha: PatroniCluster, ha_dsn: str) -> None:
    """A DSN that reaches a standby (a DNS name not yet moved after a failover) gives no
    store: each new connection must answer pg_is_in_recovery() = false."""
    ha.wait_ready(60)
    seen = ha.topology()
    assert seen is not None and seen.sync_standbys
    standby = ha.members[seen.sync_standbys[0]].address
    database = urlsplit(ha_dsn).path
    dsn = f"postgresql://postgres:{quote(ha.password, safe='')}@{standby.host}:{standby.pg_port}"
    with pytest.raises(NotPrimary):
        await Store.connect(dsn + database, partitions=PARTITIONS, min_size=1, max_size=1)


def _api_call(
    ha: PatroniCluster, member: str, method: str, path: str, body: Any, auth: dict[str, str]
) -> int:
    """The HTTP status of one REST call to ``member`` (loopback, no proxy)."""
    request = urllib.request.Request(
        f"{ha.members[member].address.api_url}{path}",
        data=json.dumps(body).encode() if body is not None else None,
        method=method,
        headers={"Content-Type": "application/json", **auth},
    )
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    try:
        with opener.open(request, timeout=10) as reply:
            return int(reply.status)
    except urllib.error.HTTPError as exc:
        return int(exc.code)


def _api_config(ha: PatroniCluster, member: str) -> Any:
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    with opener.open(f"{ha.members[member].address.api_url}/config", timeout=10) as reply:
        return json.loads(reply.read())


async def test_patronis_rest_api_refuses_every_unauthenticated_change(
    ha: PatroniCluster, tmp_path: Path
) -> None:
    """What any local account could do before (issue 23): switch over, restart, reinitialise
    a member, and change the dynamic configuration to run a command as the PostgreSQL
    account. Without the generated password, or with a wrong one, every call is 401 and the
    cluster is as it was."""
    leader = await asyncio.to_thread(ha.wait_writable)
    replica = next(name for name in ha.members if name != leader)
    config = await asyncio.to_thread(_api_config, ha, leader)
    postmasters = {name: m.postmaster_pid for name, m in ha.members.items()}
    mark = tmp_path / "owned"
    attacks = [
        ("POST", "/switchover", {"leader": leader}),
        ("POST", "/failover", {"candidate": replica}),
        ("POST", "/restart", {}),
        ("POST", "/reinitialize", {"force": True}),
        ("POST", "/reload", None),
        ("PATCH", "/config", {"postgresql": {"parameters": {"archive_mode": "on",
                                                             "archive_command": f"touch {mark}"}}}),
        ("PUT", "/config", {"ttl": 5}),
    ]  # fmt: skip
    wrong = base64.b64encode(f"{ha.restapi_auth[0]}:not-the-password".encode()).decode()
    for auth in ({}, {"Authorization": f"Basic {wrong}"}):
        for method, path, body in attacks:
            target = replica if path == "/reinitialize" else leader
            status = await asyncio.to_thread(_api_call, ha, target, method, path, body, auth)
            assert status == 401, (method, path, auth, status)
    await asyncio.sleep(2)  # a loop of Patroni's (1 s) to act on anything that got through
    assert await asyncio.to_thread(ha.wait_writable) == leader
    assert await asyncio.to_thread(_api_config, ha, leader) == config
    assert {name: m.postmaster_pid for name, m in ha.members.items()} == postmasters
    assert not await asyncio.to_thread(mark.exists)
    # The credentials chronoq keeps open the same door (a harmless call: reload).
    status = await asyncio.to_thread(_api_call, ha, leader, "POST", "/reload", None,
                                     ha.api_headers())  # fmt: skip
    assert status in (200, 202)


def test_the_ha_secrets_are_for_the_members_account_only(ha: PatroniCluster) -> None:
    secrets_file = ha.workdir / "ha-passwords.json"
    assert secrets_file.stat().st_mode & 0o777 == 0o600
    for member in ha.members.values():
        assert member.config_file.stat().st_mode & 0o777 == 0o600
        assert member.home.stat().st_mode & 0o777 == 0o700
        assert ha.restapi_auth[1] in member.config_file.read_text()


async def test_the_nodes_role_on_the_replicated_store_is_not_a_superuser(ha_dsn: str) -> None:
    assert urlsplit(ha_dsn).username == "chronoq"
    conn = await asyncpg.connect(ha_dsn)
    try:
        assert await conn.fetchval("SELECT rolsuper FROM pg_roles WHERE rolname = current_user") \
            is False  # fmt: skip
        with pytest.raises(asyncpg.InsufficientPrivilegeError):
            await conn.execute("ALTER SYSTEM SET archive_command = 'true'")
        with pytest.raises(asyncpg.InsufficientPrivilegeError):
            await conn.execute("COPY (SELECT 1) TO PROGRAM 'true'")
    finally:
        await conn.close()
