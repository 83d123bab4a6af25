"""Loads the named queries of ``queries.sql`` (``-- name: x`` sections)."""

from __future__ import annotations

import re
from functools import cache
from importlib import resources

_NAME = re.compile(r"^-- name: (\w+)\s*$", re.MULTILINE)


@cache
def queries() -> dict[str, str]:
    text = resources.files("chronoq.store").joinpath("queries.sql").read_text()
    parts = _NAME.split(text)
    named: dict[str, str] = {}
    for name, body in zip(parts[1::2], parts[2::2], strict=True):
        lines = [ln for ln in body.strip().splitlines() if not ln.lstrip().startswith("--")]
        named[name] = "\n".join(lines).rstrip().rstrip(";")
    return named


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
