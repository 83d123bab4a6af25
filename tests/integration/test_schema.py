"""The migrated schema, and the state numbers its indexes and the named queries use."""

from __future__ import annotations

import re

import pytest

from chronoq.models import TaskState
from chronoq.store import Store
from chronoq.store.migrations import pending
from chronoq.store.sql import migrations, queries

pytestmark = pytest.mark.timeout(60)

S = TaskState

# The columns of `tasks` after every migration, in order, with their types: the row mapping
# (`rows._task`) and the insert statements read and write these.
TASK_COLUMNS = [
    ("id", "uuid"),
    ("namespace", "text"),
    ("queue", "text"),
    ("partition", "smallint"),
    ("bucket", "bigint"),
    ("run_at", "timestamp with time zone"),
    ("state", "smallint"),
    ("priority", "integer"),
    ("payload", "bytea"),
    ("idempotency_key", "text"),
    ("attempt", "integer"),
    ("max_attempts", "integer"),
    ("retry_base", "integer"),
    ("backoff_initial_ms", "bigint"),
    ("backoff_max_ms", "bigint"),
    ("lease_timeout_ms", "bigint"),
    ("misfire_policy", "smallint"),
    ("misfire_grace_ms", "bigint"),
    ("lease_until", "timestamp with time zone"),
    ("worker_id", "text"),
    ("last_error", "text"),
    ("created_at", "timestamp with time zone"),
    ("fired_at", "timestamp with time zone"),
    ("finished_at", "timestamp with time zone"),
    ("fired_by", "text"),
    ("fire_token", "bigint"),
    ("content_type", "text"),  # 0008: NULL is application/octet-stream
    ("trace_context", "jsonb"),  # 0009: NULL is untraced
    ("concurrency_key", "text"),  # 0016: queue controls, NULL is none
    ("unique_key", "text"),
    ("unique_until", "timestamp with time zone"),
    ("debounce_key", "text"),
    ("debounce_until", "timestamp with time zone"),
    ("labels", "jsonb"),
    ("unique_closed", "boolean"),  # 0019: a unique_for window closed early (internal)
]

# The rows each partial index of `tasks` holds, by the state its predicate names.
INDEX_STATES = {"tasks_due": S.SCHEDULED, "tasks_ready": S.READY, "tasks_leases": S.RUNNING}

# The states each named query compares with or writes, by name: a renumbered TaskState, or a
# query that names the wrong number, shows up here.
QUERY_STATES = {
    "cancel": {S.SCHEDULED, S.READY, S.RUNNING, S.DEAD, S.CANCELLED},
    "claim": {S.READY, S.RUNNING},
    "claim_keyed": {S.READY, S.RUNNING},
    "key_candidates": {S.READY, S.RUNNING},
    "key_heads": {S.READY, S.RUNNING},
    "ready_heads": {S.READY},
    "complete": {S.RUNNING, S.SUCCEEDED},
    "completed_by": {S.SUCCEEDED},
    "delete_unfired_occurrences": {S.SCHEDULED},
    "due_soon": {S.SCHEDULED},
    "due_task_ids": {S.SCHEDULED},
    "expired_leases": {S.RUNNING},
    "fire_due": {S.SCHEDULED, S.READY, S.SKIPPED},
    "fire_ids": {S.SCHEDULED, S.READY, S.SKIPPED},
    "fire_ids_leasing": {S.SCHEDULED, S.READY, S.RUNNING, S.SKIPPED},
    "release_handed": {S.RUNNING, S.READY},
    "heartbeat": {S.RUNNING},
    "insert_task_ids": {S.READY},
    "insert_tasks_counted": {S.READY},
    "insert_tasks": {S.READY},
    "pending_by_bucket": {S.SCHEDULED},
    "quarantine_tasks": {S.DEAD},
    "quarantine_unclaimable": {S.READY, S.DEAD},
    "queue_depth": {S.SCHEDULED, S.READY, S.RUNNING},
    "queue_counts": {S.SCHEDULED, S.READY, S.RUNNING, S.DEAD},
    "recount_queue_counts": {S.SCHEDULED, S.READY, S.RUNNING, S.DEAD},
    "label_counts": {S.SCHEDULED, S.READY, S.RUNNING, S.DEAD},
    "oldest_ready": {S.READY},
    "ready_counts": {S.READY},
    "release": {S.RUNNING, S.READY},
    "requeue_dead": {S.DEAD, S.READY},
    "retry_running": {S.RUNNING, S.READY, S.DEAD},
    "retire_finished": {S.SUCCEEDED, S.CANCELLED, S.SKIPPED},
    "bulk_cancel": {S.CANCELLED},
    "bulk_requeue": {S.SCHEDULED, S.READY, S.RUNNING},
    "bulk_run_now": {S.READY},
    "debounce_pending": {S.SCHEDULED},
    "debounce_pending_many": {S.SCHEDULED},
    "kept_ready": {S.READY},
    "skip_overdue_ready": {S.READY, S.SKIPPED},
    "unique_blockers": {S.SCHEDULED, S.READY, S.RUNNING},
    "unique_holders": {S.SCHEDULED, S.READY, S.RUNNING},
}

_STATE_NUMBER = re.compile(
    r"\bstate(?:\s*\+\s*0)?\s*(?:=|<>|!=)\s*(\d+)\b"  # state = 1, state + 0 = 1
    r"|\bstate(?:\s*\+\s*0)?\s+(?:NOT\s+)?IN\s*\(([\d,\s]+)\)"  # state IN (0, 1, 2)
    r"|\bTHEN\s+(\d+)\s+ELSE\s+(\d+)\b"  # SET state = CASE ... THEN 6 ELSE 1 END
    r"|\bstate\s*=\s*CASE\s+WHEN\s+[\w.]+\s+THEN\s+(\d+)\s+WHEN",  # ... THEN 6 WHEN b THEN 2
    re.IGNORECASE,
)


def state_numbers(sql: str) -> set[int]:
    found: set[int] = set()
    for match in _STATE_NUMBER.finditer(sql):
        for group in match.groups():
            if group:
                found |= {int(n) for n in group.split(",")}
    return found


def test_named_queries_use_the_numbers_of_the_states_they_mean() -> None:
    used = {name: state_numbers(sql) for name, sql in queries().items()}
    assert {name: numbers for name, numbers in used.items() if numbers} == {
        name: {int(s) for s in states} for name, states in QUERY_STATES.items()
    }


def test_migrations_use_state_numbers_of_task_state() -> None:
    for version, name, sql in migrations():
        assert state_numbers(sql) <= {int(s) for s in TaskState}, (version, name)


# The same for the named queries that moved into a migration's function, by its version.
FUNCTION_STATES = {
    25: {S.READY, S.RUNNING},  # chronoq_insert_task_leased
    26: {S.READY},  # chronoq_insert_task_once
    27: {S.READY, S.RUNNING},  # chronoq_insert_task_leased, its fence first
}


def test_functions_of_named_queries_use_the_numbers_of_the_states_they_mean() -> None:
    used = {version: state_numbers(sql) for version, _name, sql in migrations()}
    for version, states in FUNCTION_STATES.items():
        assert used[version] == {int(s) for s in states}, version


async def test_migrated_schema_has_the_expected_tasks_table(store: Store) -> None:
    async with store.connection() as conn:
        assert await pending(conn) == []
        columns = await conn.fetch(
            "SELECT column_name, data_type FROM information_schema.columns"
            " WHERE table_name = 'tasks' ORDER BY ordinal_position"
        )
        indexes = await conn.fetch(
            "SELECT indexname, indexdef FROM pg_indexes WHERE tablename = 'tasks'"
        )
    assert [(c["column_name"], c["data_type"]) for c in columns] == TASK_COLUMNS
    predicates = {
        i["indexname"]: i["indexdef"].partition(" WHERE ")[2]
        for i in indexes
        if i["indexname"] in INDEX_STATES
    }
    assert predicates == {name: f"(state = {int(s)})" for name, s in INDEX_STATES.items()}


async def test_a_fresh_database_has_every_migration_pending(store: Store) -> None:
    async with store.connection() as conn, conn.transaction():
        await conn.execute("CREATE SCHEMA fresh")
        await conn.execute("SET LOCAL search_path TO fresh")
        assert await pending(conn) == [version for version, _n, _s in migrations()]
        await conn.execute("RESET search_path")
        assert await pending(conn) == []


def test_each_named_query_says_its_name_to_the_server() -> None:
    for name, sql in queries().items():
        first = sql.split()[0]
        assert sql.startswith(f"{first} /* chronoq {name} */ "), name
        assert sql.count("*/") == 1, name  # nothing else closes the comment early
