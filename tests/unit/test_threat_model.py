"""The threat model names, for every surface, a test that tries the attack: those tests exist.

A row whose test was renamed or removed would leave a protection unproven while the page still
claims it; this keeps the page and the suite in step.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PAGE = ROOT / "docs" / "threat-model.md"
#: ``tests/...py::test_name`` in the table's last column (several may be given, one per cell).
_TEST = re.compile(r"`(tests/[\w/]+\.py)::(\w+)`")
#: Surfaces the page must cover, by the name of their row.
SURFACES = (
    "gRPC API",
    "worker streams",
    "console",
    "lab",
    "metrics",
    "etcd",
    "PostgreSQL",
    "Patroni",
    "token files",
    "local accounts",
)


def rows() -> list[list[str]]:
    """The threat table's rows (after its header and rule), as cells."""
    lines = PAGE.read_text().splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("| surface"))
    table = []
    for line in lines[start + 2 :]:
        if not line.startswith("|"):
            break
        table.append([cell.strip() for cell in line.strip("|").split("|")])
    return table


def test_every_surface_has_rows() -> None:
    surfaces = {row[0] for row in rows()}
    for surface in SURFACES:
        assert any(surface.lower() in s.lower() for s in surfaces), f"no row for {surface}"


def test_every_row_names_tests_that_exist() -> None:
    defined: dict[Path, set[str]] = {}
    for row in rows():
        found = _TEST.findall(row[-1])
        assert found, f"row {row[0]!r} / {row[1]!r} names no test"
        for path, name in found:
            file = ROOT / path
            assert file.is_file(), f"{path} (row {row[0]!r}) does not exist"
            if file not in defined:
                tree = ast.parse(file.read_text())
                defined[file] = {
                    n.name
                    for n in ast.walk(tree)
                    if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef)
                }
            assert name in defined[file], f"{path}::{name} (row {row[0]!r}) is not defined"
