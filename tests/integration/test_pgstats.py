"""The benchmarks' PostgreSQL diagnostics on a real server: its settings start it, and a run's
statements, vacuums and slow plans are read back."""

from __future__ import annotations

import asyncio
from pathlib import Path

import asyncpg
import pytest

from chronoq.bench import pgstats
from chronoq.embedded.postgres import EmbeddedPostgres
from chronoq.store import Store
from chronoq.store.sql import q

pytestmark = pytest.mark.timeout(120)


async def test_diagnostic_settings_record_statements_vacuums_and_slow_plans(
    tmp_path: Path,
) -> None:
    server = EmbeddedPostgres(tmp_path / "pg", durable=False, settings=pgstats.DIAGNOSTIC_SETTINGS)
    await asyncio.to_thread(server.start)
    try:
        dsn = await asyncio.to_thread(server.create_database, "diag")
        store = await Store.connect(dsn, partitions=4, min_size=1, max_size=2)
        await store.close()
        before = await pgstats.snapshot(dsn)
        conn = await asyncpg.connect(dsn)
        try:
            await conn.execute("SELECT pg_sleep(0.15)")  # over auto_explain's 100 ms
            await conn.fetch(q("count_by_state"))  # a statement of chronoq's, by its name
            await conn.execute("VACUUM tasks")
        finally:
            await conn.close()
        await asyncio.sleep(1.2)  # backends publish their statistics about once a second
        after = await pgstats.snapshot(dsn)
        run = pgstats.between(before, after)
        assert after.vacuums == before.vacuums + 1
        assert any("pg_sleep" in s.query for s in run.statements), run.statements
        named = [s for s in run.statements if "chronoq count_by_state" in s.query]
        assert named and named[0].plan_ms > 0, run.statements  # planning is tracked too
        log = server.log_file.read_text()
        assert "duration:" in log and "pg_sleep" in log  # the slow statement's plan
    finally:
        await asyncio.to_thread(server.stop)
