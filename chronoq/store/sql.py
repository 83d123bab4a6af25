"""Loads the named queries of ``queries.sql`` (``-- name: x`` sections)."""

from __future__ import annotations

import re
from functools import cache, lru_cache
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
    def expand(m: re.Match[str]) -> str:
        # {{map_version}} stays for q() to fill in (a value, not a fragment).
        return m.group(0) if m.group(1) == _MAP_VERSION else fragments[m.group(1)]

    for name, sql in fragments.items():
        fragments[name] = _INCLUDE.sub(expand, sql)
    return {name: _named(name, _INCLUDE.sub(expand, sql)) for name, sql in named.items()}


def _named(name: str, sql: str) -> str:
    """``sql`` with a comment naming it after its first word: PostgreSQL's statement
    statistics keep a statement from its first token on, so a leading comment would be cut."""
    first, rest = sql.split(None, 1)
    return f"{first} /* chronoq {name} */ {rest}"


_MAP_VERSION = "map_version"
_MAP_VERSION_MARK = "{{" + _MAP_VERSION + "}}"


@lru_cache(maxsize=4096)
def q(name: str, map_version: int = 1) -> str:
    """The SQL text of the named query; a write of partitions checks that this shard holds
    them live at ``map_version`` (the shard map version the caller routes by), written into
    the text as a number: it changes once per move, and a parameter would renumber every
    statement. A new version is one more prepared statement per connection."""
    return queries()[name].replace(_MAP_VERSION_MARK, str(int(map_version)))


def migrations() -> list[tuple[int, str, str]]:
    """(version, name, sql) of every migration, in order."""
    folder = resources.files("chronoq.store").joinpath("migrations")
    found = []
    for entry in folder.iterdir():
        match = re.match(r"^(\d{4})_(\w+)\.sql$", entry.name)
        if match:
            found.append((int(match[1]), match[2], entry.read_text()))
    return sorted(found)
