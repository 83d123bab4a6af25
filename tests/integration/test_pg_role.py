"""The nodes log in as ``chronoq``, a role that owns its database and nothing more (issue 23).

Each test tries what a node's credentials could do if they leaked, or if a statement of the
node were turned against the server, and shows that PostgreSQL refuses it.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import asyncpg
import pytest

from chronoq.embedded.postgres import APP_ROLE, EmbeddedPostgres
from chronoq.store import Store


@pytest.fixture
async def node_conn(postgres: EmbeddedPostgres, dsn: str) -> AsyncIterator[asyncpg.Connection]:
    """A connection with the credentials a node gets (the test's fresh database)."""
    conn = await asyncpg.connect(dsn)
    try:
        yield conn
    finally:
        await conn.close()


async def test_the_nodes_role_is_not_a_superuser(node_conn: asyncpg.Connection) -> None:
    row = await node_conn.fetchrow(
        "SELECT current_user, rolsuper, rolcreaterole, rolcreatedb, rolreplication, rolbypassrls"
        " FROM pg_roles WHERE rolname = current_user"
    )
    assert tuple(row) == (APP_ROLE, False, False, False, False, False)
    owner = await node_conn.fetchval(
        "SELECT pg_get_userbyid(datdba) FROM pg_database WHERE datname = current_database()"
    )
    assert owner == APP_ROLE
    tables = await node_conn.fetch(
        "SELECT tablename, tableowner FROM pg_tables WHERE schemaname = 'public'"
    )
    assert tables and {t["tableowner"] for t in tables} == {APP_ROLE}


async def test_it_cannot_run_programs_or_change_the_server(
    node_conn: asyncpg.Connection, tmp_path: Path
) -> None:
    mark = tmp_path / "owned"
    with pytest.raises(asyncpg.InsufficientPrivilegeError):
        await node_conn.execute(f"COPY (SELECT 1) TO PROGRAM 'touch {mark}'")
    with pytest.raises(asyncpg.InsufficientPrivilegeError):
        await node_conn.execute(f"ALTER SYSTEM SET archive_command = 'touch {mark}'")
    with pytest.raises(asyncpg.InsufficientPrivilegeError):
        await node_conn.fetchval("SELECT pg_read_file('postgresql.conf')")
    with pytest.raises(asyncpg.InsufficientPrivilegeError):
        await node_conn.execute("CREATE ROLE intruder SUPERUSER")
    with pytest.raises(asyncpg.InsufficientPrivilegeError):
        await node_conn.execute("CREATE DATABASE intruder")
    assert not await asyncio.to_thread(mark.exists)


async def test_it_cannot_read_another_database(postgres: EmbeddedPostgres, dsn: str) -> None:
    """Another database (the maintenance one, or one another role made) refuses it."""
    other = "t_not_chronoqs"
    await asyncio.to_thread(postgres.run_sql, f"CREATE DATABASE {other}")
    try:
        await asyncio.to_thread(postgres.run_sql, "CREATE TABLE secret (v text)", other)

        def elsewhere(database: str) -> str:
            return urlunsplit(urlsplit(dsn)._replace(path=f"/{database}"))

        with pytest.raises(asyncpg.InsufficientPrivilegeError, match="CONNECT"):
            await asyncpg.connect(elsewhere("postgres"))  # closed to it at setup
        # A database another role made keeps PostgreSQL's default (PUBLIC may connect), but
        # nothing in it is the node's to read.
        conn = await asyncpg.connect(elsewhere(other))
        try:
            with pytest.raises(asyncpg.InsufficientPrivilegeError):
                await conn.fetch("SELECT * FROM secret")
        finally:
            await conn.close()
    finally:
        await asyncio.to_thread(postgres.drop_database, other)


async def test_a_database_of_an_older_chronoq_is_given_to_the_role(tmp_path: Path) -> None:
    """Made and migrated by the superuser (as before): the next start hands database and
    tables to ``chronoq``, and the nodes work there with their own role."""
    server = EmbeddedPostgres(tmp_path / "pg", durable=False)
    try:
        await asyncio.to_thread(server.start)
        await asyncio.to_thread(server.run_sql, "CREATE DATABASE chronoq")  # owner: postgres
        store = await Store.connect(server.dsn_for("chronoq", admin=True), partitions=4)
        await store.close()
        # What an older chronoq left: no role of its own, no password file for it.
        await asyncio.to_thread(server.run_sql, f"DROP ROLE {APP_ROLE}")
        await asyncio.to_thread(server.stop)
        server.app_password_file.unlink()

        upgraded = EmbeddedPostgres(tmp_path / "pg", durable=False)
        await asyncio.to_thread(upgraded.start)
        try:
            dsn, created = await asyncio.to_thread(upgraded.ensure_database, "chronoq")
            assert not created
            store = await Store.connect(dsn, partitions=4)  # migrations find nothing to do
            try:
                async with store.connection() as conn:
                    assert await conn.fetchval("SELECT current_user") == APP_ROLE
                    await conn.execute("INSERT INTO schema_migrations VALUES (9999, 'probe')")
                    await conn.execute("DELETE FROM schema_migrations WHERE version = 9999")
                    owners = await conn.fetch(
                        "SELECT DISTINCT tableowner FROM pg_tables WHERE schemaname = 'public'"
                    )
                    assert [o["tableowner"] for o in owners] == [APP_ROLE]
            finally:
                await store.close()
        finally:
            await asyncio.to_thread(upgraded.stop)
    finally:
        await asyncio.to_thread(server.stop)
