"""The outbox's tables in the application's own PostgreSQL, and their versioned migrations.

The application's database is not chronoq's store: these migrations are numbered on their
own (``chronoq_outbox_schema`` records which ran), so they never meet the store's. Each runs
in one transaction under an advisory lock, so two relays or deploys starting together apply
it once. ``migration_sql()`` gives the same statements to an application that keeps its
schema in its own tool (Alembic, Django migrations).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import asyncpg

#: The NOTIFY channel an enqueue wakes the relays on (its payload: the row's namespace).
CHANNEL = "chronoq_outbox"
TABLE = "chronoq_outbox"
FAILED_TABLE = "chronoq_outbox_failed"
VERSION_TABLE = "chronoq_outbox_schema"
#: Taken by ``migrate`` for its transaction: one migrator at a time per database.
_LOCK_KEY = 0x63_68_72_6F_6F_78  # "chroox"

#: (version, statements), in order; a released version is never edited, only followed.
MIGRATIONS: tuple[tuple[int, str], ...] = (
    (
        1,
        f"""
CREATE TABLE {TABLE} (
    -- time-ordered (UUID v7): the relay moves the oldest first; the task's idempotency key
    -- unless the caller gave one
    id uuid PRIMARY KEY,
    namespace text NOT NULL,
    queue text NOT NULL,
    spec bytea NOT NULL,  -- the serialized chronoq.v1.TaskSpec, checked before the insert
    created_at timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX {TABLE}_namespace_id ON {TABLE} (namespace, id);
-- rows a node refused (INVALID_ARGUMENT): kept for a person to read, never retried
CREATE TABLE {FAILED_TABLE} (
    id uuid PRIMARY KEY,
    namespace text NOT NULL,
    queue text NOT NULL,
    spec bytea NOT NULL,
    created_at timestamptz NOT NULL,
    failed_at timestamptz NOT NULL DEFAULT now(),
    error text NOT NULL
);
""",
    ),
)

LATEST = MIGRATIONS[-1][0]


def migration_sql() -> str:
    """Every migration's statements, in order, for an application's own migration tool."""
    return "\n".join(sql.strip() + "\n" for _version, sql in MIGRATIONS)


async def migrate_connection(conn: asyncpg.Connection, *, timeout: float = 60.0) -> list[int]:
    """Apply the migrations ``conn``'s database lacks; the versions applied, in order."""
    async with conn.transaction():
        await conn.execute("SELECT pg_advisory_xact_lock($1)", _LOCK_KEY, timeout=timeout)
        await conn.execute(
            f"CREATE TABLE IF NOT EXISTS {VERSION_TABLE} ("
            "version integer PRIMARY KEY, applied_at timestamptz NOT NULL DEFAULT now())",
            timeout=timeout,
        )
        done = {r["version"] for r in await conn.fetch(f"SELECT version FROM {VERSION_TABLE}")}
        applied = []
        for version, sql in MIGRATIONS:
            if version in done:
                continue
            await conn.execute(sql, timeout=timeout)
            await conn.execute(
                f"INSERT INTO {VERSION_TABLE} (version) VALUES ($1)", version, timeout=timeout
            )
            applied.append(version)
        return applied


async def migrate(dsn: str, *, timeout: float = 60.0) -> list[int]:
    """``migrate_connection`` on a new connection to ``dsn`` (the application's database).
    Needs asyncpg (``pip install chronoq[outbox]``)."""
    from chronoq.outbox.connect import connect

    conn = await connect(dsn, timeout=timeout)
    try:
        return await migrate_connection(conn, timeout=timeout)
    finally:
        await conn.close(timeout=timeout)
