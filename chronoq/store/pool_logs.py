"""Keeps the PostgreSQL driver's own logs quiet during an outage.

While PostgreSQL is down, asyncpg's pool tries to reopen its minimum number of connections
and logs a warning *with a traceback* for each failed try (after 1, 2, 4 ... 60 s). The
outage is already reported once, by the node's loops that hit it (a line when it starts, a
line when it ends); the driver's copies say nothing more. This filter drops them when the
error is a connection failure, and leaves every other driver message alone.
"""

from __future__ import annotations

import logging

import asyncpg

log = logging.getLogger("chronoq.store")

POOL_LOGGER = "asyncpg.pool"
# The errors of a server that is down, restarting or cut off (as the store translates them
# into StoreUnavailable): nothing to fix in chronoq, and reported once by the loops already.
OUTAGE_ERRORS: tuple[type[BaseException], ...] = (
    OSError,
    TimeoutError,
    asyncpg.exceptions.PostgresConnectionError,
    asyncpg.exceptions.OperatorInterventionError,  # includes CannotConnectNowError
    asyncpg.exceptions.InterfaceError,
    asyncpg.exceptions.InternalClientError,
)


class PoolOutageFilter(logging.Filter):
    """Drops the pool's per-retry tracebacks of an outage (kept at debug, one line each)."""

    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[1] if record.exc_info else None
        if isinstance(exc, OUTAGE_ERRORS):
            log.debug("%s (%s: %s)", record.getMessage(), type(exc).__name__, exc)
            return False
        return True


def quiet_pool_outages() -> None:
    """Install the filter on asyncpg's pool logger, once per process."""
    pool_logger = logging.getLogger(POOL_LOGGER)
    if not any(isinstance(f, PoolOutageFilter) for f in pool_logger.filters):
        pool_logger.addFilter(PoolOutageFilter())
