"""The contracts stay portable: no SQL, no driver, no pool, nothing of one store's insides.

mypy checks that the contracts call only the port (their store is typed ``TaskStore``); this
checks what mypy does not: what they import and which raw-database names they touch. Only
``conftest.py`` builds stores of each shape, so only it may name a concrete store.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

HERE = Path(__file__).parent
CONTRACTS = sorted(p for p in HERE.glob("test_*.py") if p.name != Path(__file__).name)
#: What a contract may import: the standard library, pytest, the domain values and errors,
#: the pure helpers, the port, and the shared constants of this suite.
ALLOWED = (
    "__future__",
    "asyncio",
    "collections",
    "datetime",
    "typing",
    "uuid",
    "pytest",
    "chronoq.buckets",
    "chronoq.effects",
    "chronoq.errors",
    "chronoq.models",
    "chronoq.queue_settings",
    "chronoq.recurrence",
    "chronoq.store.port",
    "chronoq.taskfilter",
    "tests.contract.conftest",
)
#: Names of one database's insides: a contract touching one is not about the port.
FORBIDDEN = {"pool", "connection", "execute", "fetch", "fetchrow", "fetchval", "acquire", "q"}


def imported(tree: ast.AST) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
    return names


def test_there_are_contracts() -> None:
    assert len(CONTRACTS) >= 5


@pytest.mark.parametrize("path", CONTRACTS, ids=lambda p: p.name)
def test_a_contract_imports_only_the_port_and_domain_values(path: Path) -> None:
    tree = ast.parse(path.read_text())
    bad = {m for m in imported(tree) if not m.startswith(ALLOWED)}
    assert not bad, f"{path.name} imports {sorted(bad)}: speak the port only"


@pytest.mark.parametrize("path", CONTRACTS, ids=lambda p: p.name)
def test_a_contract_touches_no_database_insides(path: Path) -> None:
    tree = ast.parse(path.read_text())
    touched = {n.attr for n in ast.walk(tree) if isinstance(n, ast.Attribute)}
    touched |= {n.id for n in ast.walk(tree) if isinstance(n, ast.Name)}
    assert not touched & FORBIDDEN, f"{path.name} uses {sorted(touched & FORBIDDEN)}"
    text = path.read_text().upper()
    for keyword in ("SELECT ", "UPDATE ", "INSERT ", "DELETE FROM"):
        assert keyword not in text, f"{path.name} holds SQL ({keyword.strip()})"


def test_the_guard_sees_raw_sql() -> None:
    """The checks above would catch a contract that reaches into the database."""
    tree = ast.parse(
        "import asyncpg\nasync def t(s):\n    async with s.pool.acquire() as c:\n"
        "        await c.execute('UPDATE tasks SET state = 0')\n"
    )
    assert "asyncpg" in imported(tree)
    assert {"pool", "acquire", "execute"} <= {
        n.attr for n in ast.walk(tree) if isinstance(n, ast.Attribute)
    }
