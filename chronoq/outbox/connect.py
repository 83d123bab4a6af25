"""Connections of the relay and the migrator to the application's PostgreSQL (asyncpg), with
the driver's errors translated into one chronoq error whose message masks the password."""

from __future__ import annotations

from typing import TYPE_CHECKING

from chronoq.errors import ChronoqError
from chronoq.redact import mask_text

if TYPE_CHECKING:
    import asyncpg


class AppDatabaseUnavailable(ChronoqError):
    """The application's PostgreSQL (the outbox's database) could not be reached."""


async def connect(dsn: str, *, timeout: float = 10.0) -> asyncpg.Connection:
    """A connection to ``dsn`` within ``timeout`` seconds. Statements of the outbox are short,
    and a relay that hangs must not hold its locked rows: the server ends any statement
    after ``timeout`` and a transaction left idle after ``2 * timeout``."""
    try:
        import asyncpg
    except ImportError as exc:  # an install without the extra
        raise ChronoqError(
            "the outbox relay and migrations need asyncpg: pip install 'chronoq[outbox]'"
        ) from exc

    ms = str(int(timeout * 1000))
    try:
        return await asyncpg.connect(
            dsn,
            timeout=timeout,
            command_timeout=timeout,
            server_settings={
                "application_name": "chronoq-outbox",
                "statement_timeout": ms,
                "idle_in_transaction_session_timeout": str(int(timeout * 2000)),
            },
        )
    except (OSError, TimeoutError, asyncpg.PostgresError) as exc:
        raise AppDatabaseUnavailable(
            f"cannot connect to the application's database: {mask_text(str(exc))}"
        ) from exc
    except (ValueError, asyncpg.InterfaceError) as exc:
        raise AppDatabaseUnavailable(
            f"the DSN is not a PostgreSQL DSN: {mask_text(str(exc))}"
        ) from exc
