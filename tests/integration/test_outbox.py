"""The transactional outbox against two real PostgreSQL servers: the application's (a server of
its own, a fresh database on it per test, migrated by ``chronoq outbox migrate``) and
chronoq's store behind a real node. A task exists in chronoq iff its transaction committed,
once."""

from __future__ import annotations

import asyncio
import contextlib
import json
import signal
import subprocess
import sys
import uuid
from collections.abc import AsyncIterator, Iterator, Sequence
from datetime import timedelta
from typing import Any

import asyncpg
import psycopg
import pytest
import sqlalchemy
from sqlalchemy.ext.asyncio import AsyncSession, create_async_engine
from sqlalchemy.orm import Session

from chronoq.api.v1 import tasks_pb2
from chronoq.client import Client
from chronoq.embedded.postgres import EmbeddedPostgres
from chronoq.errors import InvalidArgument
from chronoq.limits import Limits
from chronoq.node import Node
from chronoq.outbox import FAILED_TABLE, TABLE, Relay, enqueue, enqueue_sqlalchemy, migrate
from chronoq.outbox.rows import new_row
from tests.integration.conftest import NodeFactory
from tests.integration.test_cli import CLI, cli, failed, ok


@pytest.fixture(scope="module")
def app_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EmbeddedPostgres]:
    """The application's PostgreSQL: a server apart from chronoq's store."""
    server = EmbeddedPostgres(tmp_path_factory.mktemp("app-pg") / "data", durable=False)
    server.start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
async def app_db(app_server: EmbeddedPostgres, dsn: str) -> AsyncIterator[str]:
    """The application's database, with the outbox's tables, on the application's server."""
    name = f"app_{uuid.uuid4().hex[:12]}"
    url = app_server.create_database(name)
    assert url != dsn
    assert await migrate(url) == [1]
    assert await migrate(url) == []  # a second run applies nothing
    try:
        yield url
    finally:
        app_server.drop_database(name)


@pytest.fixture
async def chronoq(make_node: NodeFactory) -> AsyncIterator[tuple[Node, Client]]:
    node = await make_node(limits=Limits(max_payload_bytes=4096))
    client = Client(node.address, timeout=10)
    try:
        yield node, client
    finally:
        await client.close()


async def tasks_in_chronoq(dsn: str, queue: str) -> dict[str, int]:
    """Tasks of ``queue`` in chronoq's store, counted per idempotency key."""
    conn = await asyncpg.connect(dsn)
    try:
        rows = await conn.fetch(
            "SELECT idempotency_key, count(*) AS n FROM tasks WHERE queue = $1 "
            "GROUP BY idempotency_key",
            queue,
        )
    finally:
        await conn.close()
    return {r["idempotency_key"]: r["n"] for r in rows}


async def outbox_rows(app_dsn: str, table: str = TABLE) -> list[asyncpg.Record]:
    conn = await asyncpg.connect(app_dsn)
    try:
        return await conn.fetch(f"SELECT * FROM {table} ORDER BY id")
    finally:
        await conn.close()


async def drain(relay: Relay, app_dsn: str, passes: int = 100) -> None:
    conn = await asyncpg.connect(app_dsn)
    try:
        for _ in range(passes):
            if await relay.relay_once(conn) == 0:
                return
        raise AssertionError("the outbox did not drain")
    finally:
        await conn.close()


class Recording(Relay):
    """A relay that notes every batch it sends (the keys and bytes)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.sent: list[list[str]] = []
        self.sent_bytes: list[int] = []

    async def send(self, specs: Sequence[tasks_pb2.TaskSpec]) -> None:
        self.sent.append([s.idempotency_key for s in specs])
        self.sent_bytes.append(sum(len(s.payload) for s in specs))
        await super().send(specs)


async def test_rolled_back_transactions_make_no_task_and_committed_ones_exactly_one(
    app_db: str, dsn: str, chronoq: tuple[Node, Client]
) -> None:
    _node, client = chronoq
    committed: list[str] = []
    # psycopg 3, sync: one rolled back, one committed
    with psycopg.connect(app_db) as conn:
        with contextlib.suppress(RuntimeError), conn.transaction():
            enqueue(conn, "receipts", payload={"order": 1}, delay=timedelta(minutes=10))
            raise RuntimeError("the order failed")
        with conn.transaction():
            committed.append(enqueue(conn, "receipts", payload={"order": 2}))
    # psycopg 3, async
    async with await psycopg.AsyncConnection.connect(app_db) as aconn:
        with contextlib.suppress(RuntimeError):
            async with aconn.transaction():
                await enqueue(aconn, "receipts", payload={"order": 3})
                raise RuntimeError("rolled back")
        async with aconn.transaction():
            committed.append(await enqueue(aconn, "receipts", payload={"order": 4}))
    # asyncpg
    conn2 = await asyncpg.connect(app_db)
    try:
        with contextlib.suppress(RuntimeError):
            async with conn2.transaction():
                await enqueue(conn2, "receipts", payload={"order": 5})
                raise RuntimeError("rolled back")
        async with conn2.transaction():
            committed.append(await enqueue(conn2, "receipts", payload={"order": 6}))
    finally:
        await conn2.close()
    # SQLAlchemy's Session (over psycopg 3)
    engine = sqlalchemy.create_engine(app_db.replace("postgresql://", "postgresql+psycopg://", 1))
    try:
        with Session(engine) as session:
            enqueue_sqlalchemy(session, "receipts", payload={"order": 7})
            session.rollback()
            committed.append(enqueue_sqlalchemy(session, "receipts", payload={"order": 8}))
            session.commit()
    finally:
        engine.dispose()
    # SQLAlchemy's AsyncSession (over psycopg 3's async connection)
    aengine = create_async_engine(app_db.replace("postgresql://", "postgresql+psycopg://", 1))
    try:
        async with AsyncSession(aengine) as asession:
            await enqueue_sqlalchemy(asession, "receipts", payload={"order": 9})
            await asession.rollback()
            committed.append(
                await enqueue_sqlalchemy(asession, "receipts", payload={"order": 10})
            )
            await asession.commit()
    finally:
        await aengine.dispose()

    assert [str(r["id"]) for r in await outbox_rows(app_db)] == sorted(committed)
    await drain(Relay(app_db, client), app_db)
    assert await tasks_in_chronoq(dsn, "receipts") == {key: 1 for key in committed}
    assert await outbox_rows(app_db) == []
    page = await client.list(queue="receipts")
    orders = sorted(json.loads(t.payload)["order"] for t in page.tasks)
    assert orders == [2, 4, 6, 8, 10]


async def test_a_task_the_node_would_refuse_is_refused_before_the_insert(app_db: str) -> None:
    conn = await asyncpg.connect(app_db)
    try:
        async with conn.transaction():
            with pytest.raises(InvalidArgument, match="queue"):
                await enqueue(conn, "no spaces allowed", payload=b"")
            with pytest.raises(InvalidArgument, match="delay"):
                await enqueue(conn, "q", delay=timedelta(days=400))
            with pytest.raises(InvalidArgument, match="payload"):
                await enqueue(conn, "q", payload={"when": object()})
            with pytest.raises(InvalidArgument, match="unexpected keyword"):
                await enqueue(conn, "q", colour="red")
    finally:
        await conn.close()
    assert await outbox_rows(app_db) == []


class KilledBeforeDelete(Recording):
    """Dies after the node acknowledged its batch and before the delete (its transaction is
    rolled back, as PostgreSQL does to the transaction of a relay process that died)."""

    async def _delete(self, conn: Any, ids: Sequence[Any]) -> None:
        raise RuntimeError("killed between submit and delete")


async def test_a_relay_killed_between_submit_and_delete_makes_no_second_task(
    app_db: str, dsn: str, chronoq: tuple[Node, Client]
) -> None:
    _node, client = chronoq
    conn = await asyncpg.connect(app_db)
    try:
        async with conn.transaction():
            keys = [await enqueue(conn, "mail", payload={"n": i}) for i in range(20)]
        dying = KilledBeforeDelete(app_db, client)
        with pytest.raises(RuntimeError, match="killed"):
            await dying.relay_once(conn)
        assert [sorted(b) for b in dying.sent] == [sorted(keys)]  # submitted, then killed
        assert len(await outbox_rows(app_db)) == 20  # the rows stayed
        assert await tasks_in_chronoq(dsn, "mail") == {k: 1 for k in keys}
        again = Recording(app_db, client)
        assert await again.relay_once(conn) == 20
        assert [sorted(b) for b in again.sent] == [sorted(keys)]  # submitted again ...
    finally:
        await conn.close()
    assert await tasks_in_chronoq(dsn, "mail") == {k: 1 for k in keys}  # ... one task each
    assert await outbox_rows(app_db) == []


async def test_two_relays_never_submit_a_row_twice(
    app_db: str, dsn: str, chronoq: tuple[Node, Client]
) -> None:
    _node, client = chronoq
    await insert_rows(app_db, "pairs", 2000)
    relays = [Recording(app_db, client, batch_rows=50) for _ in range(2)]
    await asyncio.gather(*(drain(r, app_db) for r in relays))
    sent = [key for r in relays for batch in r.sent for key in batch]
    assert len(sent) == len(set(sent)) == 2000
    assert all(r.sent for r in relays), "both relays took part"
    assert set(sent) == set(await tasks_in_chronoq(dsn, "pairs"))


async def insert_rows(app_dsn: str, queue: str, count: int, payload: bytes = b"x") -> list[str]:
    rows = [new_row(queue, {"payload": payload}) for _ in range(count)]
    conn = await asyncpg.connect(app_dsn)
    try:
        await conn.executemany(
            f"INSERT INTO {TABLE} (id, namespace, queue, spec) VALUES ($1, $2, $3, $4)",
            [(r.id, r.namespace, r.queue, r.spec) for r in rows],
        )
    finally:
        await conn.close()
    return [str(r.id) for r in rows]


async def test_ten_thousand_rows_move_in_bounded_batches(
    app_db: str, dsn: str, chronoq: tuple[Node, Client]
) -> None:
    _node, client = chronoq
    keys = await insert_rows(app_db, "bulk", 10_000, payload=b"p" * 100)
    relay = Recording(app_db, client, batch_rows=1000, batch_bytes=60_000)
    await drain(relay, app_db, passes=1000)
    assert max(len(batch) for batch in relay.sent) <= 1000
    # the byte bound cuts first: at most 60,000 bytes of specs (each ~150 bytes) a batch
    assert max(len(batch) for batch in relay.sent) < 500
    assert sum(len(batch) for batch in relay.sent) == 10_000
    assert set(await tasks_in_chronoq(dsn, "bulk")) == set(keys)
    assert await outbox_rows(app_db) == []
    assert relay.stats.moved == 10_000


async def test_a_refused_row_is_moved_aside_and_does_not_block_the_others(
    app_db: str, dsn: str, chronoq: tuple[Node, Client]
) -> None:
    _node, client = chronoq
    before = await insert_rows(app_db, "mixed", 5)
    # accepted by enqueue (the default limits) but over this node's 4096-byte payloads
    too_big = await insert_rows(app_db, "mixed", 1, payload=b"b" * 10_000)
    after = await insert_rows(app_db, "mixed", 5)
    conn = await asyncpg.connect(app_db)
    try:  # a row someone wrote by hand, not a spec at all
        await conn.execute(
            f"INSERT INTO {TABLE} (id, namespace, queue, spec) "
            "VALUES (gen_random_uuid(), 'default', 'mixed', '\\xff'::bytea)"
        )
    finally:
        await conn.close()
    relay = Relay(app_db, client)
    await drain(relay, app_db)
    assert set(await tasks_in_chronoq(dsn, "mixed")) == set(before + after)
    aside = await outbox_rows(app_db, FAILED_TABLE)
    assert len(aside) == 2 and relay.stats.refused == 2
    errors = {str(r["id"]): r["error"] for r in aside}
    assert "payload" in errors[too_big[0]]
    assert any("not a serialized TaskSpec" in e for e in errors.values())
    assert await outbox_rows(app_db) == []


async def test_while_chronoq_is_unavailable_the_rows_stay(app_db: str) -> None:
    await insert_rows(app_db, "away", 3)
    async with Client("127.0.0.1:1", timeout=1) as nowhere:
        relay = Relay(
            app_db, nowhere, submit_timeout=1, backoff_initial=timedelta(milliseconds=50)
        )
        runner = asyncio.create_task(relay.run())
        try:
            for _ in range(100):
                if relay.stats.failures >= 2:
                    break
                await asyncio.sleep(0.1)
        finally:
            relay.stop()
            await asyncio.wait_for(runner, 10)
    assert relay.stats.failures >= 2 and relay.stats.moved == 0
    assert len(await outbox_rows(app_db)) == 3


async def test_a_notify_wakes_the_relay_long_before_its_poll(
    app_db: str, dsn: str, chronoq: tuple[Node, Client]
) -> None:
    _node, client = chronoq
    relay = Relay(app_db, client, poll_interval=timedelta(minutes=5))
    runner = asyncio.create_task(relay.run())
    try:
        await asyncio.sleep(0.5)  # listening, table empty, waiting for a notice
        conn = await asyncpg.connect(app_db)
        try:
            async with conn.transaction():
                key = await enqueue(conn, "woken", payload=b"")
        finally:
            await conn.close()
        for _ in range(300):
            if await tasks_in_chronoq(dsn, "woken"):
                break
            await asyncio.sleep(0.1)
        assert await tasks_in_chronoq(dsn, "woken") == {key: 1}
    finally:
        relay.stop()
        await asyncio.wait_for(runner, 10)


async def test_outbox_commands(empty_db: str, dsn: str, chronoq: tuple[Node, Client]) -> None:
    node, _client = chronoq
    assert "applied outbox migrations 1" in ok(await cli("outbox", "migrate", "--dsn", empty_db))
    assert "up to date" in ok(await cli("outbox", "migrate", "--dsn", empty_db))
    failed(await cli("outbox", "migrate", "--dsn", "not a dsn"), 1, "DSN")
    failed(
        await cli("outbox", "migrate", "--dsn", "postgresql://u:hunter2@127.0.0.1:1/x"),
        1,
        "application's database",
    )
    assert "hunter2" not in (await cli("outbox", "migrate", "--dsn",
                                       "postgresql://u:hunter2@127.0.0.1:1/x")).stderr
    failed(await cli("outbox", "relay", "--dsn", empty_db, "--batch-rows", "0"), 2, "--batch-rows")
    keys = await insert_rows(empty_db, "cli", 30)
    proc = await asyncio.create_subprocess_exec(
        *CLI, "outbox", "relay", "--dsn", empty_db, "-a", node.address,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    )
    try:
        for _ in range(300):
            if len(await tasks_in_chronoq(dsn, "cli")) == 30:
                break
            await asyncio.sleep(0.1)
        proc.send_signal(signal.SIGTERM)
        _out, err = await asyncio.wait_for(proc.communicate(), 20)
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
    assert proc.returncode == 0, err
    assert set(await tasks_in_chronoq(dsn, "cli")) == set(keys)
    assert await outbox_rows(empty_db) == []


DJANGO_PROBE = """
import sys
from urllib.parse import parse_qs, urlsplit
import django
from django.conf import settings
url = urlsplit(sys.argv[1])
query = parse_qs(url.query)
host = query.get("host", [url.hostname])[0]
port = query.get("port", [url.port])[0]
settings.configure(DATABASES={"default": {
    "ENGINE": "django.db.backends.postgresql", "NAME": url.path.lstrip("/"),
    "HOST": host, "PORT": port, "USER": url.username,
    "PASSWORD": url.password or "",
}})
django.setup()
from django.db import transaction
from chronoq.outbox import enqueue_django
try:
    with transaction.atomic():
        enqueue_django("django-q", payload={"n": 1})
        raise RuntimeError("rolled back")
except RuntimeError:
    pass
with transaction.atomic():
    print(enqueue_django("django-q", payload={"n": 2}))
"""


async def test_enqueue_django_joins_the_atomic_block(app_db: str) -> None:
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-c", DJANGO_PROBE, app_db,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    )
    out, err = await asyncio.wait_for(proc.communicate(), 60)
    assert proc.returncode == 0, err.decode()
    assert [str(r["id"]) for r in await outbox_rows(app_db)] == [out.decode().strip()]


async def test_a_relay_moves_only_its_own_namespace(
    app_db: str, dsn: str, chronoq: tuple[Node, Client]
) -> None:
    _node, client = chronoq
    conn = await asyncpg.connect(app_db)
    try:
        async with conn.transaction():
            theirs = await enqueue(conn, "ns", namespace="tenant-b", payload=b"")
            ours = await enqueue(conn, "ns", payload=b"")
    finally:
        await conn.close()
    await drain(Relay(app_db, client), app_db)  # the default namespace's relay
    assert await tasks_in_chronoq(dsn, "ns") == {ours: 1}
    assert [str(r["id"]) for r in await outbox_rows(app_db)] == [theirs]


async def start_relay(app_dsn: str, address: str, *extra: str) -> asyncio.subprocess.Process:
    return await asyncio.create_subprocess_exec(
        *CLI, "outbox", "relay", "--dsn", app_dsn, "-a", address, *extra,
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )


async def test_relay_processes_killed_mid_batch_make_no_second_task(
    app_db: str, dsn: str, chronoq: tuple[Node, Client]
) -> None:
    """SIGKILL relay processes while they move rows until one dies after a submit and before
    its delete (rows still in the outbox whose task exists), then let a relay finish."""
    node, _client = chronoq
    keys = await insert_rows(app_db, "killed", 3000)
    caught_between = False
    for _attempt in range(10):
        before = len(await tasks_in_chronoq(dsn, "killed"))
        proc = await start_relay(app_db, node.address, "--batch-rows", "50")
        try:
            for _ in range(600):
                if len(await tasks_in_chronoq(dsn, "killed")) > before:
                    break
                await asyncio.sleep(0.02)
        finally:
            proc.kill()
            await proc.wait()
        left = {str(r["id"]) for r in await outbox_rows(app_db)}
        if left & set(await tasks_in_chronoq(dsn, "killed")):
            caught_between = True
            break
    assert caught_between, "no kill landed between a submit and its delete"
    proc = await start_relay(app_db, node.address)
    try:
        for _ in range(600):
            if not await outbox_rows(app_db):
                break
            await asyncio.sleep(0.1)
    finally:
        proc.terminate()
        await asyncio.wait_for(proc.wait(), 20)
    counts = await tasks_in_chronoq(dsn, "killed")
    assert set(counts) == set(keys) and set(counts.values()) == {1}
    assert await outbox_rows(app_db) == []


async def test_notices_do_not_cut_the_backoff_short(app_db: str) -> None:
    """An application enqueueing fast while chronoq is down must not make the relay retry at
    its pace: the backoff (here 2 s) holds however many notices arrive."""
    async with Client("127.0.0.1:1", timeout=1) as nowhere:
        relay = Relay(
            app_db, nowhere, submit_timeout=1,
            backoff_initial=timedelta(seconds=2), backoff_max=timedelta(seconds=2),
        )
        runner = asyncio.create_task(relay.run())
        conn = await asyncpg.connect(app_db)
        try:
            for _ in range(100):
                if relay.stats.failures >= 1:
                    break
                await asyncio.sleep(0.05)
            seen = relay.stats.failures
            for i in range(20):  # 20 commits, 20 notices, within about half a second
                async with conn.transaction():
                    await enqueue(conn, "storm", payload={"i": i})
                await asyncio.sleep(0.025)
            assert relay.stats.failures <= seen + 1  # one backoff (2 s) at most has ended
        finally:
            await conn.close()
            relay.stop()
            await asyncio.wait_for(runner, 10)
    assert len(await outbox_rows(app_db)) == 20
