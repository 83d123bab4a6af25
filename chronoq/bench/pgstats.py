"""What PostgreSQL did while a benchmark run ran: vacuums, checkpoints, and its statements.

A latency tail on a busy machine has many possible owners. These figures say whether the
store's own housekeeping ran meanwhile (an autovacuum or autoanalyze of ``tasks``, a
checkpoint) and, with the statement statistics loaded (``DIAGNOSTIC_SETTINGS``), which
statements took the server's time, so that a run that goes bad can be told apart from one
that merely ran on a slower minute.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

import asyncpg

#: Server settings that record what a slow run did: statement statistics, the plan of any
#: statement slower than 100 ms, every autovacuum and checkpoint, and lock waits over 20 ms.
DIAGNOSTIC_SETTINGS: Mapping[str, str] = {
    "shared_preload_libraries": "pg_stat_statements,auto_explain",
    "pg_stat_statements.max": "1000",
    "pg_stat_statements.track_planning": "on",
    "auto_explain.log_min_duration": "100ms",
    "auto_explain.log_analyze": "off",
    "log_autovacuum_min_duration": "0",
    "log_checkpoints": "on",
    "log_lock_waits": "on",
    "deadlock_timeout": "20ms",
}
#: Statements listed per run, by server time.
TOP_STATEMENTS = 6
#: Characters of a statement's text kept: enough to name it.
QUERY_CHARS = 110

_TABLE = """
SELECT n_live_tup, n_dead_tup, autovacuum_count, autoanalyze_count, vacuum_count
FROM pg_stat_user_tables WHERE relname = 'tasks'
"""
_CHECKPOINTS = "SELECT num_timed + num_requested FROM pg_stat_checkpointer"
_LIBRARY_LOADED = "SELECT EXISTS (SELECT FROM pg_settings WHERE name = 'pg_stat_statements.max')"
_STATEMENTS = """
SELECT queryid, calls, total_exec_time, total_plan_time, rows, query FROM pg_stat_statements
WHERE dbid = (SELECT oid FROM pg_database WHERE datname = current_database())
"""


@dataclass
class Statement:
    query: str
    calls: int
    total_ms: float  # executing
    rows: int
    plan_ms: float = 0.0  # planning (with ``track_planning``; a custom plan per execution)

    @property
    def mean_ms(self) -> float:
        return self.total_ms / self.calls if self.calls else 0.0


@dataclass
class Snapshot:
    live: int = 0
    dead: int = 0
    autovacuums: int = 0
    autoanalyzes: int = 0
    vacuums: int = 0
    checkpoints: int = 0
    statements: dict[int, Statement] = field(default_factory=dict)


@dataclass
class RunStats:
    """Between two snapshots: what ran, and the statements that took the time."""

    dead_at_start: int
    autovacuums: int
    autoanalyzes: int
    checkpoints: int
    statements: list[Statement] = field(default_factory=list)

    def line(self) -> str:
        return (
            f"autovacuum {self.autovacuums}, autoanalyze {self.autoanalyzes}, "
            f"checkpoints {self.checkpoints}, dead rows at start {self.dead_at_start:,}"
        )

    def top(self) -> list[str]:
        return [
            f"{s.total_ms:9.0f} ms {s.calls:7,} calls {s.mean_ms:7.2f} ms/call "
            f"(+{s.plan_ms / max(s.calls, 1):5.2f} planning) {s.rows:8,} rows  {s.query}"
            for s in self.statements
        ]


async def snapshot(dsn: str) -> Snapshot:
    """The counters now (statements only where ``pg_stat_statements`` is loaded)."""
    conn = await asyncpg.connect(dsn)
    try:
        table = await conn.fetchrow(_TABLE)
        snap = Snapshot(checkpoints=int(await conn.fetchval(_CHECKPOINTS) or 0))
        if table is not None:
            snap.live, snap.dead = table["n_live_tup"], table["n_dead_tup"]
            snap.autovacuums = table["autovacuum_count"]
            snap.autoanalyzes = table["autoanalyze_count"]
            snap.vacuums = table["vacuum_count"]
        if await _loaded(conn):
            # Made by the superuser with the database where the library is loaded (the
            # embedded server); a no-op then, for a role that may not create it.
            await conn.execute("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
            for r in await conn.fetch(_STATEMENTS):
                snap.statements[r["queryid"]] = Statement(
                    " ".join(r["query"].split())[:QUERY_CHARS],
                    r["calls"],
                    r["total_exec_time"],
                    r["rows"],
                    r["total_plan_time"],
                )
    finally:
        await conn.close()
    return snap


async def _loaded(conn: asyncpg.Connection) -> bool:
    """Whether the library is loaded: its settings exist once it is (``pg_settings`` shows
    them to every role; ``shared_preload_libraries`` only to privileged ones)."""
    return bool(await conn.fetchval(_LIBRARY_LOADED))


def between(before: Snapshot, after: Snapshot) -> RunStats:
    """What happened from ``before`` to ``after``: counts, and the statements by time spent."""
    moved: list[Statement] = []
    for qid, s in after.statements.items():
        was = before.statements.get(qid)
        calls = s.calls - (was.calls if was else 0)
        if calls > 0:
            moved.append(
                Statement(
                    s.query,
                    calls,
                    s.total_ms - (was.total_ms if was else 0.0),
                    s.rows - (was.rows if was else 0),
                    s.plan_ms - (was.plan_ms if was else 0.0),
                )
            )
    moved.sort(key=lambda s: s.total_ms + s.plan_ms, reverse=True)
    return RunStats(
        dead_at_start=before.dead,
        autovacuums=after.autovacuums - before.autovacuums,
        autoanalyzes=after.autoanalyzes - before.autoanalyzes,
        checkpoints=after.checkpoints - before.checkpoints,
        statements=moved[:TOP_STATEMENTS],
    )
