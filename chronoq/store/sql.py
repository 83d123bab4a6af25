"""Loads the named queries of ``queries.sql`` (``-- name: x`` sections)."""

from __future__ import annotations

import re
from functools import cache
from importlib import resources

_SECTION = re.compile(r"^-- (name|fragment): (\w+)\s*$", re.MULTILINE)
_INCLUDE = re.compile(r"\{\{(\w+)\}\}")


@cache
def queries() -> dict[str, str]:
    """Named queries, with ``{{fragment}}`` references expanded (one definition of the
    fencing clause that every owner statement shares). Each text carries a comment that
    names it, which PostgreSQL keeps: ``pg_stat_activity``, ``pg_stat_statements`` and the
    server's log then say which statement of chronoq they show."""
    text = resources.files("chronoq.store").joinpath("queries.sql").read_text()
    parts = _SECTION.split(text)
    named: dict[str, str] = {}
    fragments: dict[str, str] = {}
    for kind, name, body in zip(parts[1::3], parts[2::3], parts[3::3], strict=True):
        lines = [ln for ln in body.strip().splitlines() if not ln.lstrip().startswith("--")]
        sql = "\n".join(lines).rstrip().rstrip(";")
        (fragments if kind == "fragment" else named)[name] = sql
    # A fragment may use fragments defined before it (one level: the page bound uses the
    # task's size).
    for name, sql in fragments.items():
        fragments[name] = _INCLUDE.sub(lambda m: fragments[m.group(1)], sql)
    return {
        name: _named(name, _INCLUDE.sub(lambda m: fragments[m.group(1)], sql))
        for name, sql in named.items()
    }


def _named(name: str, sql: str) -> str:
    """``sql`` with a comment naming it after its first word: PostgreSQL's statement
    statistics keep a statement from its first token on, so a leading comment would be cut."""
    first, rest = sql.split(None, 1)
    return f"{first} /* chronoq {name} */ {rest}"


def q(name: str) -> str:
    """The SQL text of the named query."""
    return queries()[name]


def migrations() -> list[tuple[int, str, str]]:
    """(version, name, sql) of every migration, in order."""
    folder = resources.files("chronoq.store").joinpath("migrations")
    found = []
    for entry in folder.iterdir():
        match = re.match(r"^(\d{4})_(\w+)\.sql$", entry.name)
        if match:
            found.append((int(match[1]), match[2], entry.read_text()))
    return sorted(found)
