"""Schema migrations: the ordered ``migrations/NNNN_name.sql`` files, applied once each."""

from __future__ import annotations

from typing import Any

from chronoq.store.sql import migrations

_MIGRATION_LOCK = 0x6368726F6E6F71  # "chronoq": one migrator at a time


async def migrate(conn: Any) -> list[int]:
    """Apply the migrations not yet applied on ``conn``, each in its own transaction; returns
    their versions. Concurrent migrators wait for each other on an advisory lock."""
    applied: list[int] = []
    await conn.execute("SELECT pg_advisory_lock($1)", _MIGRATION_LOCK)
    try:
        await conn.execute(
            "CREATE TABLE IF NOT EXISTS schema_migrations ("
            " version integer PRIMARY KEY, name text NOT NULL,"
            " applied_at timestamptz NOT NULL DEFAULT now())"
        )
        done = {r["version"] for r in await conn.fetch("SELECT version FROM schema_migrations")}
        for version, name, sql in migrations():
            if version in done:
                continue
            async with conn.transaction():
                await conn.execute(sql)
                await conn.execute(
                    "INSERT INTO schema_migrations (version, name) VALUES ($1, $2)",
                    version,
                    name,
                )
            applied.append(version)
    finally:
        await conn.execute("SELECT pg_advisory_unlock($1)", _MIGRATION_LOCK)
    return applied


async def pending(conn: Any) -> list[int]:
    """The versions this release ships that ``conn``'s database has not applied (all of them
    on a database never migrated): empty when the schema is the one the statements expect."""
    exists = await conn.fetchval("SELECT to_regclass('schema_migrations') IS NOT NULL")
    done = (
        {r["version"] for r in await conn.fetch("SELECT version FROM schema_migrations")}
        if exists
        else set()
    )
    return [version for version, _name, _sql in migrations() if version not in done]
