"""The embedded PostgreSQL and etcd launchers against the real servers: no mocks.

Every server is started by a fixture or a ``try/finally`` so it is stopped even when a test
fails; each test takes a second or two.
"""

from __future__ import annotations

import asyncio
import base64
import os
import signal
import socket
import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import aetcd
import asyncpg
import pytest

from chronoq.coordinator.etcd import connect
from chronoq.embedded.etcd import EmbeddedEtcd
from chronoq.embedded.postgres import (
    PASSWORD_FILE,
    EmbeddedPostgres,
    EmbeddedPostgresError,
    scram_verifier,
)


@pytest.fixture
def etcd1(tmp_path: Path) -> Iterator[EmbeddedEtcd]:
    cluster = EmbeddedEtcd(tmp_path / "etcd", durable=False)
    try:
        cluster.start()
        yield cluster
    finally:
        cluster.stop()


@pytest.fixture
def etcd3(tmp_path: Path) -> Iterator[EmbeddedEtcd]:
    cluster = EmbeddedEtcd(tmp_path / "etcd", members=3, durable=False)
    try:
        cluster.start()
        yield cluster
    finally:
        cluster.stop()


def _etcd_client(server: EmbeddedEtcd, index: int) -> aetcd.Client:
    """A client of member ``index`` alone, with the embedded etcd's credentials."""
    return connect(replace(server.client_settings(), endpoints=[server.endpoints[index]]))


async def _put_with_retry(client: aetcd.Client, key: bytes, value: bytes, within: float) -> None:
    """Put, retrying while the cluster elects a new leader."""
    deadline = time.monotonic() + within
    while True:
        try:
            await client.put(key, value)
            return
        except aetcd.ClientError:
            if time.monotonic() >= deadline:
                raise
            await asyncio.sleep(0.1)


# -- PostgreSQL ------------------------------------------------------------------------------


async def test_postgres_serves_tcp_and_copies_template(pg: EmbeddedPostgres) -> None:
    assert pg.pid is not None
    socket = f"host=%2Ftmp%2F{pg.socket_dir.name}&port={pg.port}"
    assert pg.dsn == f"postgresql://postgres:{pg.password}@/postgres?{socket}"
    tcp = pg.dsn_for("postgres", tcp=True, admin=True)
    assert tcp == f"postgresql://postgres:{pg.password}@127.0.0.1:{pg.port}/postgres"
    assert pg.dsn_for("x") == f"postgresql://chronoq:{pg.app_password}@/x?{socket}"

    tpl_dsn = pg.create_database("chronoq_tpl")
    conn = await asyncpg.connect(tpl_dsn)
    try:
        await conn.execute("CREATE TABLE t (id int PRIMARY KEY, name text)")
        await conn.execute("INSERT INTO t VALUES (1, 'één'), (2, 'two')")
    finally:
        await conn.close()

    copy_dsn = pg.create_database("copy 1", template="chronoq_tpl")  # a name needing quotes
    assert copy_dsn == pg.dsn_for("copy 1")
    conn = await asyncpg.connect(copy_dsn)
    try:
        rows = await conn.fetch("SELECT name FROM t ORDER BY id")
        assert [row["name"] for row in rows] == ["één", "two"]
        settings = {
            name: await conn.fetchval(f"SHOW {name}")
            for name in ("max_connections", "fsync", "synchronous_commit", "server_encoding")
        }
        assert settings == {
            "max_connections": "200",
            "fsync": "off",
            "synchronous_commit": "off",
            "server_encoding": "UTF8",
        }
        assert await conn.fetchval("SELECT inet_server_addr()") is None  # the unix socket
    finally:
        await conn.close()
    conn = await asyncpg.connect(pg.dsn_for("copy 1", tcp=True))
    try:
        assert await conn.fetchval("SELECT inet_server_addr()::text") == "127.0.0.1/32"
    finally:
        await conn.close()

    pg.drop_database("copy 1")  # WITH (FORCE): works even with sessions open
    assert pg.run_sql("SELECT count(*) FROM pg_database WHERE datname = 'copy 1'").strip() == "0"


async def test_postgres_survives_kill_and_sigstop(tmp_path: Path) -> None:
    server = EmbeddedPostgres(tmp_path / "pg", durable=True)
    try:
        server.start()
        conn = await asyncpg.connect(server.dsn)
        try:
            await conn.execute("CREATE TABLE t (v int); INSERT INTO t VALUES (42)")
        finally:
            await conn.close()

        first = server.pid
        server.kill()
        assert server.pid is None
        assert server.server_pids() == []  # the orphaned backends are gone too
        server.kill()  # idempotent
        with pytest.raises(EmbeddedPostgresError, match="the server is not running"):
            server.run_sql("SELECT 1")  # says why, with the end of the server's log

        server.start()  # crash recovery
        assert server.pid not in (None, first)
        conn = await asyncpg.connect(server.dsn)
        try:
            assert await conn.fetchval("SELECT v FROM t") == 42
        finally:
            await conn.close()

        # A frozen postmaster still stops quickly: stop() sends SIGCONT after SIGINT.
        pid = server.pid
        assert pid is not None
        os.kill(pid, signal.SIGSTOP)
        server.stop(timeout=5)
        assert server.pid is None
        assert server.server_pids() == []
        server.stop()  # idempotent
    finally:
        server.stop()


async def _refused(dsn: str) -> None:
    with pytest.raises(asyncpg.InvalidPasswordError):
        await asyncpg.connect(dsn)


async def test_postgres_wants_its_generated_password(pg: EmbeddedPostgres) -> None:
    """No trust: a password generated at initdb, kept in the data directory for the owner only,
    wanted over TCP and over the unix socket alike."""
    assert pg.password_file == pg.data_dir / PASSWORD_FILE
    assert pg.password_file.stat().st_mode & 0o777 == 0o600
    assert pg.password_file.read_text().strip() == pg.password
    assert len(pg.password) >= 32
    hba = [
        line.split()
        for line in (pg.data_dir / "pg_hba.conf").read_text().splitlines()
        if line.strip() and not line.lstrip().startswith("#")
    ]
    assert hba and all(fields[-1] == "scram-sha-256" for fields in hba)
    assert {fields[0] for fields in hba} == {"local", "host"}

    # What the server stored is what scram_verifier makes (it sets passwords of older clusters).
    stored = pg.run_sql("SELECT rolpassword FROM pg_authid WHERE rolname = 'postgres'").strip()
    assert stored.startswith("SCRAM-SHA-256$4096:")
    salt = base64.b64decode(stored.split("$")[1].split(":")[1])
    assert scram_verifier(pg.password, salt) == stored

    conn = await asyncpg.connect(pg.dsn)
    await conn.close()
    await _refused(pg.dsn_for("postgres", password=False))
    await _refused(pg.dsn.replace(pg.password, "not-the-password"))
    mine = await asyncio.to_thread(lambda: list(Path("/tmp").glob(f"cqpg-*/.s.PGSQL.{pg.port}")))
    if mine:  # the socket too: a local account without the password gets nothing
        socket_dsn = f"postgresql://postgres@/postgres?host={mine[0].parent}&port={pg.port}"
        await _refused(socket_dsn)
        conn = await asyncpg.connect(socket_dsn, password=pg.password)
        await conn.close()


async def test_a_kept_data_directory_keeps_its_password(tmp_path: Path) -> None:
    first = EmbeddedPostgres(tmp_path / "pg", durable=False)
    try:
        first.start()
        password = first.password
        first.stop()
        again = EmbeddedPostgres(tmp_path / "pg", durable=False)  # a new run, same directory
        assert again.password == password
        again.start()
        conn = await asyncpg.connect(again.dsn)
        await conn.close()
        assert again.run_sql("SELECT 1").strip() == "1"
    finally:
        first.stop()


async def test_a_trust_cluster_of_an_older_version_gets_a_password(tmp_path: Path) -> None:
    server = EmbeddedPostgres(tmp_path / "pg", durable=False)
    upgraded = EmbeddedPostgres(tmp_path / "pg", durable=False)  # the next run
    try:
        server.start()
        server.stop()
        # What an older chronoq left: trust in pg_hba.conf and no password file.
        hba = server.data_dir / "pg_hba.conf"
        hba.write_text(hba.read_text().replace("scram-sha-256", "trust"))
        server.password_file.unlink()
        older = server.password

        upgraded.start()
        assert upgraded.password_file.stat().st_mode & 0o777 == 0o600
        assert upgraded.password != older
        methods = {
            line.split()[-1]
            for line in hba.read_text().splitlines()
            if line.strip() and not line.lstrip().startswith("#")
        }
        assert methods == {"scram-sha-256"}
        conn = await asyncpg.connect(upgraded.dsn)
        await conn.close()
        await _refused(upgraded.dsn_for("postgres", password=False))
        await _refused(upgraded.dsn.replace(upgraded.password, older))
    finally:
        upgraded.stop()
        server.stop()


def test_postgres_adopts_own_postmaster_and_refuses_foreign(pg: EmbeddedPostgres) -> None:
    same = EmbeddedPostgres(pg.data_dir, port=pg.port)
    same.start()
    assert same.pid == pg.pid

    other = EmbeddedPostgres(pg.data_dir)
    with pytest.raises(EmbeddedPostgresError, match=f"pid {pg.pid}"):
        other.start()
    assert pg.pid is not None


def test_postgres_start_failure_reports_log_and_leaves_nothing(tmp_path: Path) -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        server = EmbeddedPostgres(tmp_path / "pg", port=busy.getsockname()[1], durable=False)
        try:
            with pytest.raises(EmbeddedPostgresError, match="could not create any TCP/IP"):
                server.start(timeout=20)
            assert server.pid is None
            assert server.server_pids() == []
        finally:
            server.stop()


# -- etcd ------------------------------------------------------------------------------------


async def test_etcd_single_member(etcd1: EmbeddedEtcd) -> None:
    (member,) = etcd1.members
    assert member.pid is not None
    assert etcd1.endpoints == [f"127.0.0.1:{member.client_port}"]
    assert etcd1.client_urls == [f"http://127.0.0.1:{member.client_port}"]
    assert etcd1.healthy(0)
    assert etcd1.leader_index() == 0
    status = etcd1.status(0)
    assert status is not None
    assert status["version"].startswith("3.5")

    client = _etcd_client(etcd1, 0)
    try:
        await client.put(b"/chronoq/k", b"v")
        got = await client.get(b"/chronoq/k")
        assert got is not None
        assert got.value == b"v"
    finally:
        await client.close()


async def test_etcd_cluster_survives_leader_kill(etcd3: EmbeddedEtcd) -> None:
    leader = etcd3.wait_for_leader()
    etcd3.kill_member(leader)
    assert etcd3.members[leader].pid is None

    survivor = (leader + 1) % 3
    client = _etcd_client(etcd3, survivor)
    try:
        await _put_with_retry(client, b"/chronoq/after-kill", b"1", within=15)
    finally:
        await client.close()
    new_leader = etcd3.wait_for_leader()
    assert new_leader != leader

    etcd3.start_member(leader)  # same ports and data dir; it catches up from the leader
    client = _etcd_client(etcd3, leader)
    try:
        got = await client.get(b"/chronoq/after-kill")
        assert got is not None
        assert got.value == b"1"
    finally:
        await client.close()
