"""Add a task to the outbox inside the caller's own transaction.

The row and a ``NOTIFY`` go in the caller's transaction: both happen at its commit or not at
all, so chronoq gets the task if and only if the transaction commits. chronoq imports none
of these drivers; each helper uses the connection it is given:

- ``enqueue(conn, ...)``: a psycopg 3 ``Connection`` (answers the row id) or
  ``AsyncConnection`` (answers an awaitable), or an asyncpg ``Connection`` (awaitable);
- ``enqueue_sqlalchemy(session, ...)``: a SQLAlchemy ``Session`` or ``AsyncSession``;
- ``enqueue_django(queue, ..., using="default")``: Django's connection ``using``.

Install the driver with the application (``psycopg``, ``asyncpg``, ``sqlalchemy``,
``django``); ``chronoq[outbox]`` adds what the relay and ``chronoq outbox migrate`` need.
Outside a transaction (autocommit) the insert commits by itself: still exactly one task.
"""

from __future__ import annotations

from collections.abc import Awaitable
from typing import TYPE_CHECKING, Any, overload

from chronoq.errors import ConfigError
from chronoq.models import DEFAULT_NAMESPACE
from chronoq.outbox.rows import OutboxRow, new_row
from chronoq.outbox.schema import CHANNEL, TABLE

if TYPE_CHECKING:
    import asyncpg
    import psycopg

# One statement, one round trip: the insert and its wake-up (PostgreSQL delivers the NOTIFY
# at commit and drops it on rollback; equal notices of one transaction are sent once).
_PYFORMAT = (
    f"WITH row AS (INSERT INTO {TABLE} (id, namespace, queue, spec) "
    "VALUES (%s, %s, %s, %s) RETURNING namespace) "
    "SELECT pg_notify(%s, namespace) FROM row"
)
_NUMBERED = (
    f"WITH row AS (INSERT INTO {TABLE} (id, namespace, queue, spec) "
    "VALUES ($1, $2, $3, $4) RETURNING namespace) "
    "SELECT pg_notify($5, namespace) FROM row"
)
_NAMED = (
    f"WITH row AS (INSERT INTO {TABLE} (id, namespace, queue, spec) "
    "VALUES (CAST(:id AS uuid), :namespace, :queue, :spec) RETURNING namespace) "
    "SELECT pg_notify(:channel, namespace) FROM row"
)


def _pyformat_args(row: OutboxRow) -> tuple[Any, ...]:
    return (row.id, row.namespace, row.queue, row.spec, CHANNEL)


@overload
def enqueue(
    conn: psycopg.AsyncConnection[Any], queue: str, *, namespace: str = ..., **fields: Any
) -> Awaitable[str]: ...
@overload
def enqueue(
    conn: asyncpg.Connection, queue: str, *, namespace: str = ..., **fields: Any
) -> Awaitable[str]: ...
@overload
def enqueue(
    conn: psycopg.Connection[Any], queue: str, *, namespace: str = ..., **fields: Any
) -> str: ...
def enqueue(
    conn: Any, queue: str, *, namespace: str = DEFAULT_NAMESPACE, **fields: Any
) -> str | Awaitable[str]:
    """Add ``queue``'s task (``submit``'s fields: ``run_at`` or ``delay``, ``payload``, keys,
    ...) to the outbox in ``conn``'s current transaction; the row id, which is the task's
    idempotency key unless ``idempotency_key`` is given. The fields are checked first
    (``InvalidArgument`` naming the field): nothing is inserted for a task the node would
    refuse. A sync psycopg connection answers at once; an async one or asyncpg's answers an
    awaitable."""
    row = new_row(queue, fields, namespace=namespace)
    module = type(conn).__module__
    if module.startswith("asyncpg"):
        return _asyncpg_insert(conn, row)
    if module.startswith("psycopg"):
        import psycopg as pg

        if isinstance(conn, pg.AsyncConnection):
            return _psycopg_async_insert(conn, row)
        if isinstance(conn, pg.Connection):
            conn.execute(_PYFORMAT, _pyformat_args(row))
            return str(row.id)
    raise ConfigError(
        f"enqueue takes a psycopg 3 or asyncpg connection, not {type(conn).__name__}; "
        "use enqueue_sqlalchemy or enqueue_django for those"
    )


async def _asyncpg_insert(conn: asyncpg.Connection, row: OutboxRow) -> str:
    await conn.execute(_NUMBERED, row.id, row.namespace, row.queue, row.spec, CHANNEL)
    return str(row.id)


async def _psycopg_async_insert(conn: psycopg.AsyncConnection[Any], row: OutboxRow) -> str:
    await conn.execute(_PYFORMAT, _pyformat_args(row))
    return str(row.id)


def _named_args(row: OutboxRow) -> dict[str, Any]:
    return {
        "id": str(row.id),
        "namespace": row.namespace,
        "queue": row.queue,
        "spec": row.spec,
        "channel": CHANNEL,
    }


def enqueue_sqlalchemy(
    session: Any, queue: str, *, namespace: str = DEFAULT_NAMESPACE, **fields: Any
) -> Any:
    """``enqueue`` in a SQLAlchemy ``Session`` (answers the row id) or ``AsyncSession``
    (answers an awaitable of it), in the session's transaction, on PostgreSQL. Needs
    ``sqlalchemy``, which the application brings."""
    from sqlalchemy import text

    row = new_row(queue, fields, namespace=namespace)
    result = session.execute(text(_NAMED), _named_args(row))
    if isinstance(result, Awaitable):  # an AsyncSession
        return _awaited(result, str(row.id))
    return str(row.id)


async def _awaited(pending: Awaitable[Any], answer: str) -> str:
    await pending
    return answer


def enqueue_django(
    queue: str, *, using: str = "default", namespace: str = DEFAULT_NAMESPACE, **fields: Any
) -> str:
    """``enqueue`` on Django's database connection ``using`` (a PostgreSQL one), in its
    current transaction: call it inside ``transaction.atomic()``. Needs ``django``, which the
    application brings."""
    from django.db import connections

    row = new_row(queue, fields, namespace=namespace)
    connection = connections[using]
    if connection.vendor != "postgresql":
        raise ConfigError(f"enqueue_django needs a PostgreSQL database, {using!r} is not one")
    with connection.cursor() as cursor:
        cursor.execute(_PYFORMAT, (str(row.id), row.namespace, row.queue, row.spec, CHANNEL))
    return str(row.id)
