"""`chronoq dev` supervises what it starts: a killed PostgreSQL or node process comes back and
tasks fire again; with --no-restart they stay down (and the dead postmaster is reaped).

Each test runs `chronoq dev --nodes 2` as a subprocess (etcd, PostgreSQL, two node processes)
and SIGKILLs the postmaster and one node by the PIDs that dev printed, as a crash would.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import socket
import sys
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path

import pytest
from grpc_health.v1 import health_pb2

from chronoq.client import Client
from chronoq.local.cluster import health_of
from chronoq.models import TaskState

pytestmark = pytest.mark.timeout(240)

CLI = [sys.executable, "-m", "chronoq.cli"]
SERVING = health_pb2.HealthCheckResponse.SERVING


@dataclass
class Dev:
    proc: asyncio.subprocess.Process
    data_dir: Path
    stderr: Path
    postgres_pid: int
    postgres_port: int
    nodes: dict[str, int]  # address -> pid of each node process
    addresses: list[str] = field(default_factory=list)

    def state(self) -> dict[str, object]:
        return json.loads((self.data_dir / "dev.json").read_text())  # type: ignore[no-any-return]

    def log(self) -> str:
        """dev's log, with the terminal's line wrapping undone."""
        return " ".join(self.stderr.read_text(errors="replace").split())


@pytest.fixture
async def dev_processes() -> AsyncIterator[list[Dev]]:
    """Every dev started is interrupted at the end, and its node processes are killed by PID."""
    started: list[Dev] = []
    try:
        yield started
    finally:
        for dev in started:
            if dev.proc.returncode is None:
                dev.proc.send_signal(signal.SIGINT)
                try:
                    await asyncio.wait_for(dev.proc.wait(), 60)
                except TimeoutError:
                    dev.proc.kill()
                    await dev.proc.wait()
            for pid in dev.nodes.values():  # node processes run in their own sessions
                _kill(pid)


def _kill(pid: int) -> None:
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


async def start_dev(tmp_path: Path, started: list[Dev], *extra: str, nodes: int = 2) -> Dev:
    data_dir = tmp_path / "stack"
    stderr = tmp_path / "dev.err"
    with stderr.open("wb") as err:
        proc = await asyncio.create_subprocess_exec(
            *CLI,
            "dev",
            "--nodes",
            str(nodes),
            "--data-dir",
            str(data_dir),
            "--port",
            "0",
            "--partitions",
            "8",
            "--lease-ttl",
            "2",
            *extra,
            stdout=asyncio.subprocess.PIPE,
            stderr=err,
        )
    assert proc.stdout is not None
    addresses: dict[str, int] = {}
    postgres_pid = postgres_port = 0
    dev = Dev(proc, data_dir, stderr, 0, 0, addresses if nodes > 1 else {})
    started.append(dev)
    for _ in range(20):
        line = (await asyncio.wait_for(proc.stdout.readline(), 120)).decode()
        if match := re.search(r"gRPC address\s+(\S+)\s+\((node-\d), pid (\d+)\)", line):
            addresses[match.group(1)] = int(match.group(3))
        elif match := re.search(r"gRPC address\s+(\S+)", line):
            addresses[match.group(1)] = proc.pid  # one node, in dev's own process
        if match := re.search(r"PostgreSQL DSN \S+[?&]port=(\d+)", line):  # the socket's
            postgres_port = int(match.group(1))
        if match := re.search(r"PostgreSQL\s+pid (\d+)", line):
            postgres_pid = int(match.group(1))
        if "Ctrl-C to stop" in line:
            break
    assert len(addresses) == nodes and postgres_pid and postgres_port, dev.log()
    dev.postgres_pid, dev.postgres_port = postgres_pid, postgres_port
    dev.addresses = list(addresses)
    return dev


def gone(pid: int) -> bool:
    """No process at all: not even a zombie waiting to be reaped."""
    return not Path(f"/proc/{pid}").exists()


def accepting(port: int) -> bool:
    with socket.socket() as sock:
        sock.settimeout(1)
        return sock.connect_ex(("127.0.0.1", port)) == 0


async def fires(addresses: list[str]) -> None:
    """A task submitted now is fired by whichever node owns its partition."""
    async with Client(",".join(addresses), timeout=10) as client:
        submitted = await client.submit("after-crash", delay=timedelta(milliseconds=300))
        task = submitted.task
        for _ in range(300):  # bounded: 30 s
            got = await client.get(task.id)
            if got.state is TaskState.READY:
                assert got.fired_at is not None
                return
            await asyncio.sleep(0.1)
        raise AssertionError(f"task {task.id} never fired: {got.state.name}")


async def test_killed_postgres_and_node_come_back_and_tasks_fire(
    tmp_path: Path, dev_processes: list[Dev]
) -> None:
    dev = await start_dev(tmp_path, dev_processes)
    victim_address, victim_pid = next(iter(dev.nodes.items()))
    killed = time.monotonic()
    os.kill(dev.postgres_pid, signal.SIGKILL)
    os.kill(victim_pid, signal.SIGKILL)

    for _ in range(300):  # bounded: 30 s at least
        state = dev.state()
        postgres = state["postgres"]
        nodes = {n["address"]: n["pid"] for n in state["nodes"]}  # type: ignore[attr-defined]
        back = (
            postgres["pid"] not in (None, dev.postgres_pid)  # type: ignore[index]
            and nodes[victim_address] not in (None, victim_pid)
            and health_of(victim_address) == SERVING
            and re.search(r"node node-\d restarted: pid \d+", dev.log()) is not None
        )
        if back:
            break
        await asyncio.sleep(0.1)
    else:
        raise AssertionError(f"not restarted:\n{dev.log()}")
    took = time.monotonic() - killed
    dev.nodes[victim_address] = int(nodes[victim_address])
    print(f"PostgreSQL and node back and serving {took:.1f} s after the kill")
    assert gone(dev.postgres_pid) and gone(victim_pid)  # reaped, no zombie
    assert accepting(dev.postgres_port)
    log = dev.log()
    assert "PostgreSQL (pid" in log and "restarting it in 0.5 s" in log
    assert re.search(r"PostgreSQL restarted: pid \d+", log), log
    assert re.search(r"node node-\d restarted: pid \d+", log), log
    assert "Traceback" not in log

    await fires(list(dev.nodes))
    await fires([victim_address])  # the restarted node serves the API too


async def test_no_restart_leaves_them_down_and_reaps_the_postmaster(
    tmp_path: Path, dev_processes: list[Dev]
) -> None:
    dev = await start_dev(tmp_path, dev_processes, "--no-restart")
    (victim_address, victim_pid), (survivor, _) = dev.nodes.items()
    command = next(
        n["command"]
        for n in dev.state()["nodes"]  # type: ignore[attr-defined]
        if n["address"] == victim_address
    )
    os.kill(dev.postgres_pid, signal.SIGKILL)
    os.kill(victim_pid, signal.SIGKILL)

    for _ in range(100):  # bounded: 10 s
        if gone(dev.postgres_pid) and "not restarting" in dev.log():
            break
        await asyncio.sleep(0.1)
    assert gone(dev.postgres_pid), "the killed postmaster was left a zombie"
    await asyncio.sleep(3)  # well past the first restart delay (0.5 s)
    assert dev.proc.returncode is None
    assert not accepting(dev.postgres_port)
    assert health_of(victim_address) is None
    state = dev.state()
    assert state["restart"] is False
    assert state["postgres"]["pid"] is None  # type: ignore[index]
    log = dev.log()
    assert re.search(r"PostgreSQL \(pid \d+\) exited; not restarting it", log), log
    assert re.search(r"node node-\d \(pid \d+\) exited; not restarting it", log), log
    assert "restarted" not in log
    # The node's command line in dev.json is what an operator runs to bring it back.
    assert f"--port {victim_address.rsplit(':', 1)[1]}" in command
    assert health_of(survivor) is not None


async def test_single_node_dev_survives_a_postgres_kill(
    tmp_path: Path, dev_processes: list[Dev]
) -> None:
    """One in-process node: PostgreSQL comes back, the node reconnects and fires again."""
    dev = await start_dev(tmp_path, dev_processes, nodes=1)
    os.kill(dev.postgres_pid, signal.SIGKILL)
    for _ in range(300):  # bounded: 30 s at least
        pid = dev.state()["postgres"]["pid"]  # type: ignore[index]
        if pid not in (None, dev.postgres_pid) and accepting(dev.postgres_port):
            break
        await asyncio.sleep(0.1)
    else:
        raise AssertionError(f"PostgreSQL not restarted:\n{dev.log()}")
    assert gone(dev.postgres_pid)
    await fires(dev.addresses)
