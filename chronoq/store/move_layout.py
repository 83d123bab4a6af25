"""The tables a move copies, their columns on both shards, and the statements' fixed text."""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from chronoq.store.move_history import LIVE_HISTORY


@dataclass(frozen=True)
class _Tracked:
    """A table whose rows a round compares one by one (uuid id, partition column); ``live``
    says which of its rows a move copies."""

    table: str
    kind: int
    live: str = "TRUE"


#: The routes to tasks made before routing (``chronoq.store.legacy``) are tracked like tasks:
#: there can be one per such task, too many to copy whole in the frozen last round. The
#: history of finished tasks (migration 0022, kind 3 in move_rows) goes with its partition
#: too, but for its expired rows (their slice is about to be dropped). A row the sweep moves
#: from tasks into the history during a round may be copied in both or neither until the
#: next round; the frozen last round sees the source still.
_TRACKED = (
    _Tracked("tasks", 0),
    _Tracked("schedules", 1),
    _Tracked("legacy_routes", 2),
    _Tracked("task_history", 3, LIVE_HISTORY),
)
HISTORY = "task_history"
#: Tables keyed by partition whose rows of the moving partitions are copied whole each round
#: (one row per partition or a few): the fences.
_REPLACED = ("partition_fences",)


def index_name(move_id: str) -> str:
    """The source's index of one move (a hash: any move id makes a valid identifier)."""
    return "move_" + hashlib.blake2b(move_id.encode(), digest_size=8).hexdigest()


def _ident(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


@dataclass(frozen=True)
class _Layout:
    columns: dict[str, tuple[str, ...]]
    replaced: tuple[str, ...]


_MOVE_ROWS = ("partition", "kind", "id", "source_xmin")
#: A transaction of the mover waits on the other server between statements: longer than the
#: store's 1 s idle bound, still bounded for a mover that died in one.
_IDLE = "SET LOCAL idle_in_transaction_session_timeout = '30s'"
_TEMP = """
CREATE TEMP TABLE IF NOT EXISTS chronoq_move_seen
    (partition smallint NOT NULL, id uuid NOT NULL, source_xmin bigint NOT NULL);
CREATE TEMP TABLE IF NOT EXISTS chronoq_move_gone
    (n bigint PRIMARY KEY, partition smallint NOT NULL, id uuid NOT NULL);
CREATE TEMP TABLE IF NOT EXISTS chronoq_move_changed (n bigint PRIMARY KEY, id uuid NOT NULL);
CREATE TEMP TABLE IF NOT EXISTS chronoq_move_stage_{table} (LIKE {table});
ALTER TABLE chronoq_move_stage_{table} ADD COLUMN IF NOT EXISTS chronoq_source_xmin bigint;
TRUNCATE chronoq_move_seen, chronoq_move_gone, chronoq_move_changed, chronoq_move_stage_{table};
"""
_DROP_TEMP = (
    "DROP TABLE IF EXISTS chronoq_move_seen, chronoq_move_gone, chronoq_move_changed,"
    " chronoq_move_stage_tasks, chronoq_move_stage_schedules,"
    " chronoq_move_stage_legacy_routes, chronoq_move_stage_task_history"
)


async def _columns(conn: Any, table: str) -> list[tuple[str, str]]:
    rows = await conn.fetch(
        "SELECT a.attname, format_type(a.atttypid, a.atttypmod) AS type FROM pg_attribute a"
        " WHERE a.attrelid = to_regclass($1) AND a.attnum > 0 AND NOT a.attisdropped"
        " ORDER BY a.attnum",
        table,
    )
    return [(r["attname"], r["type"]) for r in rows]


def _list(columns: Sequence[str]) -> str:
    return ", ".join(_ident(c) for c in columns)


def _count(status: str) -> int:
    """Rows of an ``INSERT 0 n`` / ``DELETE n`` status."""
    return int(status.split()[-1]) if status else 0


def _last(versions: Sequence[int] | None) -> str:
    return str(versions[-1]) if versions else "none"
