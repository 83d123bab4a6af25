"""``chronoq dev`` runs its PostgreSQL with a password, and keeps it out of sight.

The nodes' role (``chronoq``, not the superuser) has a password generated on the first run
and kept in the data directory (mode 0600), like the superuser's; the printed DSN masks it and
goes through the unix socket in a private directory; the node processes get it in their
environment, not on their command lines (which every local account can read); a client
without it is refused.
"""

from __future__ import annotations

import asyncio
import re
import signal
from collections.abc import Awaitable, Callable
from pathlib import Path

import asyncpg
import pytest

from chronoq.embedded.postgres import APP_PASSWORD_FILE, PASSWORD_FILE
from tests.integration.test_cli import cli, ok, start_process

__all__ = ["start_process"]  # the fixture, shared with test_cli

pytestmark = pytest.mark.timeout(180)


def _cmdline(pid: int) -> str:
    return Path(f"/proc/{pid}/cmdline").read_bytes().decode()


async def test_dev_keeps_its_database_password_out_of_sight(
    tmp_path: Path, start_process: Callable[..., Awaitable[asyncio.subprocess.Process]]
) -> None:
    data = tmp_path / "stack"
    proc = await start_process(
        "dev",
        "--nodes",
        "2",
        "--data-dir",
        str(data),
        "--port",
        "0",
        "--partitions",
        "8",
        "--lease-ttl",
        "2",
    )
    assert proc.stdout is not None
    printed: list[str] = []
    for _ in range(30):
        line = (await asyncio.wait_for(proc.stdout.readline(), 120)).decode()
        printed.append(line)
        if "Ctrl-C to stop" in line or not line:
            break
    output = "".join(printed)
    superuser = (data / "postgres" / PASSWORD_FILE).read_text().strip()
    password_file = data / "postgres" / APP_PASSWORD_FILE
    password = password_file.read_text().strip()
    assert len(password) >= 32 and password_file.stat().st_mode & 0o777 == 0o600
    assert password not in output and superuser not in output
    dsn = re.search(r"PostgreSQL DSN (\S+)", output)
    assert dsn is not None, output
    assert re.fullmatch(
        r"postgresql://chronoq:\*\*\*@/chronoq\?host=%2Ftmp%2Fcqpg-\w+&port=\d+", dsn.group(1)
    )
    assert f"password file  {password_file}" in output

    nodes = [int(pid) for pid in re.findall(r"\(node-\d, pid (\d+)\)", output)]
    assert len(nodes) == 2, output
    for pid in nodes:  # what `ps` shows any local account
        cmdline = _cmdline(pid)
        assert "--dsn" in cmdline and password not in cmdline and superuser not in cmdline

    address = re.search(r"gRPC address\s+(\S+)", output)
    assert address is not None
    status = ok(await cli("status", "--address", address.group(1)))  # the nodes reach the store
    assert "node-0" in status and "node-1" in status

    server = dsn.group(1).replace(":***@", "@")
    with pytest.raises(asyncpg.InvalidPasswordError):
        await asyncpg.connect(server)
    conn = await asyncpg.connect(server, password=password)
    try:
        assert await conn.fetchval("SELECT count(*) FROM tasks") == 0
    finally:
        await conn.close()

    proc.send_signal(signal.SIGINT)
    _, stderr = await asyncio.wait_for(proc.communicate(), 60)
    assert proc.returncode == 0, stderr.decode()
    assert password not in stderr.decode() and superuser not in stderr.decode()
