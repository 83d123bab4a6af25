"""The client commands load no server code: `chronoq get` needs neither a node nor PostgreSQL."""

from __future__ import annotations

import subprocess
import sys

CLIENT_COMMANDS = (
    "chronoq.cli",
    "chronoq.cli.tasks",
    "chronoq.cli.schedules",
    "chronoq.cli.status",
    "chronoq.cli.worker",
)
SERVER_MODULES = ("chronoq.node", "chronoq.embedded", "chronoq.store", "asyncpg")

PROBE = f"""
import sys
for name in {CLIENT_COMMANDS!r}:
    __import__(name)
loaded = sorted(
    m for m in sys.modules if any(m == s or m.startswith(s + ".") for s in {SERVER_MODULES!r})
)
print(",".join(loaded))
"""


def test_client_command_modules_import_no_server_code() -> None:
    done = subprocess.run(
        [sys.executable, "-c", PROBE], capture_output=True, text=True, timeout=60, check=True
    )
    assert done.stdout.strip() == "", f"server modules loaded: {done.stdout.strip()}"


def test_get_runs_without_server_code() -> None:
    """`chronoq get` (here: its --help, which parses every option) loads no server module."""
    probe = f"""
import contextlib, io, sys
from chronoq.cli import main
with contextlib.redirect_stdout(io.StringIO()), contextlib.suppress(SystemExit):
    main(["get", "--help"])
servers = {SERVER_MODULES!r}
print(",".join(m for m in sys.modules
      if m in servers or m.startswith(tuple(s + "." for s in servers))))
"""
    done = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, timeout=60, check=True
    )
    assert done.stdout.strip() == "", f"server modules loaded: {done.stdout.strip()}"
