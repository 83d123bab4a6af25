"""The transactional outbox: enqueue a task in the application's own PostgreSQL transaction,
and a relay that moves committed rows to chronoq (docs/outbox.md).

A task exists in chronoq if and only if the transaction that enqueued it committed:
eventually (as soon as a relay runs), at least once, and never twice thanks to the row's
idempotency key. ``chronoq outbox migrate --dsn APP_DSN`` creates the table; ``chronoq outbox
relay --dsn APP_DSN --address NODES`` runs a relay. The helpers need only the driver the
application already has; the relay and migrations need asyncpg (``chronoq[outbox]``).
"""

from __future__ import annotations

from chronoq.outbox.connect import AppDatabaseUnavailable
from chronoq.outbox.enqueue import enqueue, enqueue_django, enqueue_sqlalchemy
from chronoq.outbox.relay import Relay, RelayStats
from chronoq.outbox.schema import CHANNEL, FAILED_TABLE, TABLE, migrate, migration_sql

__all__ = [
    "CHANNEL",
    "FAILED_TABLE",
    "TABLE",
    "AppDatabaseUnavailable",
    "Relay",
    "RelayStats",
    "enqueue",
    "enqueue_django",
    "enqueue_sqlalchemy",
    "migrate",
    "migration_sql",
]
