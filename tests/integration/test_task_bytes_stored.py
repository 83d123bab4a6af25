"""The store's ``task_bytes`` fragment and the Python count agree on a task whose trace
context PostgreSQL would otherwise compress: a claim's statement and a stream's push keep
one byte budget, and neither undercounts what an answer carries."""

from __future__ import annotations

from datetime import UTC, datetime
from importlib import resources

from chronoq import tracecontext
from chronoq.limits import TASK_FIXED_BYTES, task_bytes
from chronoq.models import TaskSpec
from chronoq.store import Store

#: The largest context a submit may carry, every value alike: it compresses to a few percent.
CARRIER = tuple(
    sorted((f"k{i}", "a" * tracecontext.MAX_VALUE_CHARS) for i in range(tracecontext.MAX_ENTRIES))
)


def task_bytes_fragment() -> str:
    """The ``task_bytes`` fragment of the store's queries, its comments left out."""
    text = resources.files("chronoq.store").joinpath("queries.sql").read_text()
    body = text.split("-- fragment: task_bytes\n", 1)[1].split("\n-- fragment:", 1)[0]
    return "\n".join(line for line in body.splitlines() if not line.startswith("--"))


async def test_a_compressible_trace_context_counts_its_full_size(store: Store) -> None:
    spec = TaskSpec(queue="q", run_at=datetime.now(UTC), trace_context=CARRIER)
    [outcome] = await store.submit([spec], datetime.now(UTC))
    async with store.connection() as conn:
        counted = await conn.fetchval(
            f"SELECT {task_bytes_fragment()} FROM tasks t WHERE t.id = $1::uuid",
            outcome.task.id,
        )
    # Compressed, the context would count a few hundred bytes instead of its 4 KiB and more.
    assert counted > tracecontext.MAX_ENTRIES * tracecontext.MAX_VALUE_CHARS
    # Kept out of line, the stored form has no 4-byte header for pg_column_size to read:
    # the Python count may be those 4 bytes above, never below.
    assert 0 <= task_bytes(outcome.task) - (counted + TASK_FIXED_BYTES) <= 4
