"""The ``chronoq`` CLI against real nodes: in-process through CliRunner, and as subprocesses.

The node runs on the test's event loop, so CLI invocations (each with its own ``asyncio.run``)
run in a thread, and subprocesses are awaited, never waited for with a blocking call.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import subprocess
import sys
import textwrap
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from chronoq.cli import main
from chronoq.client import Client
from chronoq.client.demo import DemoPayload, demo_payloads, percentile, summarize
from chronoq.models import Task, TaskState
from chronoq.node import Node

CLI = [sys.executable, "-m", "chronoq.cli"]
UNKNOWN_ID = "00000000-0000-4000-8000-000000000000"


@dataclass(frozen=True)
class Ran:
    exit_code: int
    stdout: str
    stderr: str


def _invoke(args: list[str], env: dict[str, str] | None) -> Ran:
    """Run ``main`` (the console script) with captured streams, as a user would run it."""
    with CliRunner().isolation(env=env) as (stdout, stderr, _):
        try:
            main(args)
            code = 0
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else 1
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
        return Ran(code, stdout.getvalue().decode(), stderr.getvalue().decode())


async def cli(*args: str, env: dict[str, str] | None = None) -> Ran:
    """Run the CLI in a thread (it runs its own event loop) and return what it printed."""
    return await asyncio.to_thread(_invoke, list(args), env)


def ok(result: Ran) -> str:
    assert result.exit_code == 0, result
    return result.stdout


def failed(result: Ran, code: int, *needles: str) -> str:
    """Assert a clean failure: the exit code and one line naming the problem, no traceback."""
    assert result.exit_code == code, result
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), result
    for needle in needles:
        assert needle in lines[0], (needle, lines[0])
    return lines[0]


@pytest.fixture
async def address(make_node: Callable[..., Awaitable[Node]]) -> str:
    node = await make_node()  # the system clock: the CLI submits relative to real time
    return node.address


@pytest.fixture
async def client(address: str) -> AsyncIterator[Client]:
    c = Client(address, timeout=10)
    try:
        yield c
    finally:
        await c.close()


async def run_process(*args: str, cwd: Path | None = None, timeout: float = 60) -> tuple[int, str, str]:
    proc = await asyncio.create_subprocess_exec(
        *CLI, *args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=cwd
    )
    try:
        stdout, stderr = await asyncio.wait_for(proc.communicate(), timeout)
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
    assert proc.returncode is not None
    return proc.returncode, stdout.decode(), stderr.decode()


@pytest.fixture
async def start_process() -> AsyncIterator[Callable[..., Awaitable[asyncio.subprocess.Process]]]:
    """Start long-running CLI processes; each is terminated (then killed) at the end."""
    procs: list[asyncio.subprocess.Process] = []

    async def start(*args: str, cwd: Path | None = None) -> asyncio.subprocess.Process:
        proc = await asyncio.create_subprocess_exec(
            *CLI, *args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=cwd
        )
        procs.append(proc)
        return proc

    try:
        yield start
    finally:
        for proc in procs:
            if proc.returncode is None:
                proc.send_signal(signal.SIGTERM)
                try:
                    await asyncio.wait_for(proc.wait(), 15)
                except TimeoutError:
                    proc.kill()
                    await proc.wait()


async def wait_for_state(client: Client, task_id: str, *states: TaskState) -> Task:
    for _ in range(200):
        task = await client.get(task_id)
        if task.state in states:
            return task
        await asyncio.sleep(0.05)
    raise AssertionError(f"task {task_id} stayed {task.state.name}, wanted {states}")


# ---------------------------------------------------------------------- tasks


async def test_submit_get_list_cancel(address: str) -> None:
    task_id = ok(await cli("submit", "mail", "--in", "1h", "--payload", "hello",
                           "--priority", "3", "--address", address)).strip()
    assert re.fullmatch(r"[0-9a-f-]{36}", task_id)

    got = json.loads(ok(await cli("get", task_id, "--json", "--address", address)))
    assert got["id"] == task_id and got["state"] == "SCHEDULED" and got["payload"] == "hello"
    assert got["priority"] == 3
    run_at = datetime.fromisoformat(got["run_at"])
    assert timedelta(minutes=59) < run_at - datetime.now(UTC) <= timedelta(hours=1)

    table = ok(await cli("get", task_id, "--address", address))
    assert task_id in table and "SCHEDULED" in table

    listed = json.loads(ok(await cli("list", "--queue", "mail", "--json", "--address", address)))
    assert [t["id"] for t in listed] == [task_id]
    scheduled = json.loads(ok(await cli("list", "--state", "scheduled", "--json",
                                        "--address", address)))
    assert [t["id"] for t in scheduled] == [task_id]
    assert json.loads(ok(await cli("list", "--state", "dead", "--json", "--address", address))) == []
    assert task_id in ok(await cli("list", "--address", address, env={"COLUMNS": "160"}))

    assert "CANCELLED" in ok(await cli("cancel", task_id, "--address", address))
    again = await cli("cancel", task_id, "--address", address)
    failed(again, 1, "FAILED_PRECONDITION", "CANCELLED")


async def test_submit_at_key_count_and_env(address: str, client: Client) -> None:
    when = (datetime.now(UTC) + timedelta(days=30)).replace(microsecond=0)
    at = when.astimezone(timezone(timedelta(hours=2))).isoformat()
    assert at.endswith("+02:00")
    first = ok(await cli("submit", "q", "--at", at, "--key", "k1", "--address", address)).strip()
    second = await cli("submit", "q", "--at", at, "--key", "k1", "--address", address)
    assert ok(second).strip() == first
    assert "already submitted" in second.stderr
    task = await client.get(first)
    assert task.run_at == when
    assert task.idempotency_key == "k1"

    many = ok(await cli("submit", "bulk", "--count", "2500", "--key", "b", "--address", address))
    ids = many.split()
    assert len(ids) == len(set(ids)) == 2500
    assert (await client.get(ids[-1])).idempotency_key == "b-2499"

    # --rate paces the batches: 30 tasks at 20/s go as a batch of 20, then one of 10 a second
    # later, as the tasks' own creation times show.
    paced = ok(await cli("submit", "paced", "--count", "30", "--rate", "20",
                         "--address", address)).split()
    created = sorted([(await client.get(i)).created_at for i in paced])  # type: ignore[type-var]
    assert len(paced) == 30 and created[-1] - created[0] >= timedelta(seconds=0.9)

    env = {"CHRONOQ_ADDRESS": address, "CHRONOQ_SUBMIT_MAX_ATTEMPTS": "7",
           "CHRONOQ_SUBMIT_IN": "10m", "CHRONOQ_SUBMIT_MISFIRE": "skip"}
    via_env = ok(await cli("submit", "envq", "--misfire-grace", "5s", env=env)).strip()
    task = await client.get(via_env)
    assert task.max_attempts == 7 and task.misfire_policy.name == "SKIP"
    assert task.misfire_grace == timedelta(seconds=5)


async def test_bad_input_is_one_clean_line(address: str, tmp_path: Path) -> None:
    failed(await cli("submit", "q", "--in", "5x", "--address", address), 2, "not a duration")
    failed(await cli("submit", "q", "--in", "30", "--address", address), 2, "no unit")
    failed(await cli("submit", "q", "--at", "2030-01-01T00:00:00", "--address", address),
           2, "no time zone")
    failed(await cli("submit", "q", "--at", "2030-01-01T00:00:00Z", "--in", "5s",
                     "--address", address), 2, "not both")
    failed(await cli("submit", "bad queue!", "--address", address), 1, "INVALID_ARGUMENT", "queue")
    failed(await cli("submit", "q", "--in", "1000d", "--address", address),
           1, "INVALID_ARGUMENT", "horizon")
    failed(await cli("submit", "q", "--priority", "99999999999", "--address", address),
           2, "--priority", "2147483647")
    failed(await cli("submit", "q", "--priority", "-99999999999", "--address", address),
           2, "--priority", "-2147483648")
    failed(await cli("submit", "q", "--payload-file", str(tmp_path / "nope"),
                     "--address", address), 2, "cannot read")
    failed(await cli("get", UNKNOWN_ID, "--address", address), 1, "NOT_FOUND", UNKNOWN_ID)
    failed(await cli("get", "not-a-uuid", "--address", address), 1, "INVALID_ARGUMENT")
    failed(await cli("cancel", UNKNOWN_ID, "--address", address), 1, "NOT_FOUND")
    failed(await cli("dlq", "requeue", UNKNOWN_ID, "--address", address), 1, "INVALID_ARGUMENT")
    failed(await cli("get", UNKNOWN_ID, "--address", "127.0.0.1:1"), 1, "UNAVAILABLE")


async def test_address_may_list_several_nodes(address: str) -> None:
    several = f"{address},localhost:{address.rpartition(':')[2]}"  # names resolve
    task_id = ok(await cli("submit", "q", "--in", "1h", "--address", several)).strip()
    assert task_id in ok(await cli("get", task_id, "--address", several))


async def test_usage_errors_from_the_console_script_are_one_line() -> None:
    for args, needle in (
        (["submit"], "Missing argument"),
        (["submit", "q", "--in", "5x"], "not a duration"),
        (["list", "--state", "bogus"], "bogus"),
        (["get", UNKNOWN_ID, "--address", "127.0.0.1:1"], "UNAVAILABLE"),
        (["worker", "--address", "127.0.0.1:1"], "--queue"),
        (["node", "--dsn", "postgresql://x@127.0.0.1:1/x", "--virtual-clock"], "--etcd"),
        (["dev", "--nodes", "3", "--host", "0.0.0.0"], "listen on 127.0.0.1 only"),
        (["node", "drain", "--address", "127.0.0.1:1,127.0.0.1:2"], "one node at a time"),
        (["get", UNKNOWN_ID, "--address", "127.0.0.1:1,127.0.0.1:2"], "UNAVAILABLE"),
        (["get", UNKNOWN_ID, "--address", "127.0.0.1:1,nohost"], "'nohost' is not host:port"),
    ):
        code, stdout, stderr = await run_process(*args)
        assert code in (1, 2), (args, code, stderr)
        assert "Traceback" not in stderr and "Traceback" not in stdout
        lines = stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("error: ") and needle in lines[0], lines


async def test_status(address: str) -> None:
    ok(await cli("submit", "q", "--in", "2m", "--address", address))
    data = json.loads(ok(await cli("status", "--json", "--address", address)))
    assert len(data["members"]) == 1 and data["members"][0]["address"] == address
    assert data["partitions"] == 16
    assert sum(b["pending"] for b in data["buckets"]) == 1
    assert len(data["ownership"]) == 16
    text = ok(await cli("status", "--address", address, env={"COLUMNS": "160"}))
    for title in ("members", "pending tasks per bucket", "partition ownership"):
        assert title in text


# ---------------------------------------------------------------------- workers and the DLQ


async def test_worker_with_demo_handler_and_dlq(
    address: str, client: Client, start_process: Callable[..., Awaitable[asyncio.subprocess.Process]]
) -> None:
    good = ok(await cli("submit", "w", "--payload", '{"n": 1, "fail_attempts": 1}',
                        "--address", address)).strip()
    fatal = ok(await cli("submit", "w", "--payload", '{"n": 2, "fatal": true}',
                         "--address", address)).strip()
    plain = ok(await cli("submit", "w", "--payload", "not json", "--address", address)).strip()

    worker = await start_process("worker", "--address", address, "--queue", "w",
                                 "--concurrency", "4")
    done = await wait_for_state(client, good, TaskState.SUCCEEDED)
    assert done.attempt == 2
    dead = await wait_for_state(client, fatal, TaskState.DEAD)
    assert dead.attempt == 1 and "fatal on purpose" in (dead.last_error or "")
    await wait_for_state(client, plain, TaskState.SUCCEEDED)

    worker.send_signal(signal.SIGTERM)
    stdout, stderr = await asyncio.wait_for(worker.communicate(), 20)
    assert worker.returncode == 0, stderr.decode()
    assert "worker stopped: claimed 4, succeeded 2, failed 2" in stdout.decode()

    dlq = json.loads(ok(await cli("dlq", "list", "--json", "--address", address)))
    assert [t["id"] for t in dlq] == [fatal]
    assert "fatal on purpose" in dlq[0]["last_error"]
    assert fatal in ok(await cli("dlq", "list", "--address", address, env={"COLUMNS": "160"}))
    requeued = ok(await cli("dlq", "requeue", fatal, "--address", address))
    assert fatal in requeued and "READY" in requeued
    failed(await cli("dlq", "requeue", fatal, "--address", address), 1, "not DEAD")


async def test_worker_runs_handlers_from_a_module(
    address: str, client: Client, tmp_path: Path,
    start_process: Callable[..., Awaitable[asyncio.subprocess.Process]],
) -> None:
    seen = tmp_path / "seen.txt"
    (tmp_path / "my_handlers.py").write_text(textwrap.dedent(f"""
        from pathlib import Path

        def record(ctx):
            with Path({str(seen)!r}).open("a") as f:
                f.write(ctx.queue + " " + ctx.payload.decode() + "\\n")

        HANDLERS = {{"alpha": record, "beta": record}}
    """))
    first = ok(await cli("submit", "alpha", "--payload", "one", "--address", address)).strip()
    second = ok(await cli("submit", "beta", "--payload", "two", "--address", address)).strip()
    await start_process("worker", "--module", "my_handlers", "--address", address, cwd=tmp_path)
    await wait_for_state(client, first, TaskState.SUCCEEDED)
    await wait_for_state(client, second, TaskState.SUCCEEDED)
    assert sorted(seen.read_text().splitlines()) == ["alpha one", "beta two"]

    code, _, stderr = await run_process("worker", "--module", "my_handlers", "--queue", "gamma",
                                        "--address", address, cwd=tmp_path)
    assert code == 2 and "no handler for gamma" in stderr
    code, _, stderr = await run_process("worker", "--module", "no_such_module_here",
                                        "--address", address, cwd=tmp_path)
    assert code == 2 and "cannot import" in stderr and "Traceback" not in stderr


# ---------------------------------------------------------------------- the demo


@pytest.mark.parametrize("nodes", [3, 1])
def test_demo_runs_to_the_end(tmp_path: Path, nodes: int) -> None:
    """The quick start's command: by default a 3-node cluster on an embedded etcd."""
    proc = subprocess.Popen(
        [*CLI, "demo", "--tasks", "300", "--over", "5s", "--workers", "2",
         "--data-dir", str(tmp_path / "stack"), *(["--nodes", "1"] if nodes == 1 else [])],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env={**os.environ, "COLUMNS": "120"},
    )
    try:
        stdout, stderr = proc.communicate(timeout=90)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0, stdout + stderr
    assert "Traceback" not in stderr

    def value(metric: str) -> int:
        match = re.search(rf"^\W*{metric}\W+(\d+)", stdout, re.MULTILINE)
        assert match, (metric, stdout)
        return int(match.group(1))

    assert value("submitted") == 300
    assert value("succeeded") + value("dead") == 300
    assert value("dead") == value("dead expected")
    assert value("fired") == 300
    assert value("retried") > 0
    assert "lateness p99" in stdout
    # Every node fired, and together they owned every partition.
    per_node = re.findall(r"fired by (\S+)\W+(\d+) \((\d+) partitions\)", stdout)
    assert len(per_node) == nodes, stdout
    assert all(int(fired) > 0 for _, fired, _ in per_node)
    assert sum(int(owned) for _, _, owned in per_node) == 256
    assert sum(int(fired) for _, fired, _ in per_node) >= 300
    # Postgres was stopped: nothing left running on the data directory.
    assert not (tmp_path / "stack" / "postgres" / "postmaster.pid").exists()


async def test_dev_cluster_runs_and_stops_cleanly(
    tmp_path: Path, start_process: Callable[..., Awaitable[asyncio.subprocess.Process]]
) -> None:
    """`chronoq dev --nodes 3`: etcd, PostgreSQL and three node processes sharing the
    partitions; any node takes a task; Ctrl-C stops every process and removes the scratch dir."""
    proc = await start_process("dev", "--nodes", "3", "--data-dir", str(tmp_path / "stack"),
                               "--port", "0", "--partitions", "16", "--lease-ttl", "2")
    assert proc.stdout is not None
    nodes: dict[str, int] = {}  # address -> pid
    try:
        for _ in range(20):
            line = (await asyncio.wait_for(proc.stdout.readline(), 90)).decode()
            if match := re.search(r"gRPC address\s+(\S+)\s+\((node-\d), pid (\d+)\)", line):
                nodes[match.group(1)] = int(match.group(3))
            if "Ctrl-C to stop" in line:
                break
        assert len(nodes) == 3, nodes
        first, second, _ = nodes
        status = json.loads(ok(await cli("status", "--json", "--address", first)))
        owned = {m["node_id"]: m["owned_partitions"] for m in status["members"]}
        assert sorted(owned) == ["node-0", "node-1", "node-2"] and sum(owned.values()) == 16
        task_id = ok(await cli("submit", "q", "--in", "300ms", "--address", second)).strip()
        async with Client(first) as client:
            task = await wait_for_state(client, task_id, TaskState.READY)
        assert task.fired_at is not None

        proc.send_signal(signal.SIGINT)
        _, stderr = await asyncio.wait_for(proc.communicate(), 60)
        assert proc.returncode == 0, stderr.decode()
        assert "Traceback" not in stderr.decode()
        assert not (tmp_path / "stack" / "postgres" / "postmaster.pid").exists()
        assert [p.name for p in (tmp_path / "stack").iterdir() if p.name.startswith("cluster-")] == []
        for pid in nodes.values():
            with pytest.raises(ProcessLookupError):
                os.kill(pid, 0)
    finally:
        for pid in nodes.values():  # node processes run in their own sessions: never leave one
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


# ---------------------------------------------------------------------- the demo workload


def test_demo_payload_round_trip_and_garbage() -> None:
    payload = DemoPayload(n=7, sleep_ms=3, fail_attempts=2, fatal=False)
    assert DemoPayload.decode(payload.encode()) == payload
    assert DemoPayload.decode(b"hello") == DemoPayload()
    assert DemoPayload.decode(b"[1, 2]") == DemoPayload()
    assert DemoPayload.decode(b'{"sleep_ms": -5, "fail_attempts": "x", "fatal": 1}') == (
        DemoPayload(sleep_ms=0)
    )
    assert DemoPayload.decode(b"\xff\xfe") == DemoPayload()


def test_demo_payloads_are_deterministic_and_follow_the_fail_rate() -> None:
    a = demo_payloads(10_000, fail_rate=0.1, seed=3)
    assert a == demo_payloads(10_000, fail_rate=0.1, seed=3)
    failing = sum(p.fatal or p.fail_attempts > 0 for p in a)
    fatal = sum(p.fatal for p in a)
    assert 800 < failing < 1200 and 50 < fatal < 150
    assert not any(p.fatal or p.fail_attempts for p in demo_payloads(500, fail_rate=0.0))
    with pytest.raises(ValueError):
        demo_payloads(1, fail_rate=1.5)


def test_summarize_and_percentile() -> None:
    base = datetime(2030, 1, 1, tzinfo=UTC)

    def task(state: TaskState, attempt: int, late_ms: int | None) -> Task:
        fired = None if late_ms is None else base + timedelta(milliseconds=late_ms)
        fields: dict[str, Any] = {"id": "x", "namespace": "d", "queue": "q", "partition": 0,
                                  "bucket": 0}
        return Task(state=state, run_at=base, attempt=attempt, fired_at=fired, **fields)

    summary = summarize([
        task(TaskState.SUCCEEDED, 1, 10), task(TaskState.SUCCEEDED, 2, 20),
        task(TaskState.DEAD, 3, None), task(TaskState.SCHEDULED, 0, None),
        task(TaskState.READY, 0, 40),
    ])
    assert (summary.submitted, summary.fired, summary.succeeded, summary.retried, summary.dead) == (
        5, 4, 2, 2, 1
    )
    assert summary.unfinished == {"SCHEDULED": 1, "READY": 1}
    assert summary.lateness_p50 == timedelta(milliseconds=20)
    assert summary.lateness_max == timedelta(milliseconds=40)

    values = [timedelta(milliseconds=i) for i in range(1, 101)]
    assert percentile(values, 0.99) == timedelta(milliseconds=99)
    assert percentile(values, 0.5) == timedelta(milliseconds=50)
    assert percentile(values, 1.0) == timedelta(milliseconds=100)
    assert percentile([], 0.5) is None


# ---------------------------------------------------------------------- a node on a DSN


async def test_node_on_a_dsn_serves_until_sigterm(
    dsn: str, start_process: Callable[..., Awaitable[asyncio.subprocess.Process]]
) -> None:
    node = await start_process("node", "--dsn", dsn, "--port", "0", "--node-id", "cli-node",
                               "--partitions", "16", "--tick-ms", "50")
    assert node.stdout is not None
    line = (await asyncio.wait_for(node.stdout.readline(), 30)).decode()
    match = re.search(r"node cli-node serving on (\S+)", line)
    assert match, line
    address = match.group(1)

    task_id = ok(await cli("submit", "q", "--in", "200ms", "--address", address)).strip()
    async with Client(address) as client:
        task = await wait_for_state(client, task_id, TaskState.READY)
        assert task.fired_at is not None and task.fired_at >= task.run_at
    status = json.loads(ok(await cli("status", "--json", "--address", address)))
    assert status["node_id"] == "cli-node" and status["partitions"] == 16

    node.send_signal(signal.SIGTERM)
    _, stderr = await asyncio.wait_for(node.communicate(), 20)
    assert node.returncode == 0, stderr.decode()
    assert "Traceback" not in stderr.decode()


async def test_dev_stack_keeps_tasks_across_runs(
    tmp_path: Path, start_process: Callable[..., Awaitable[asyncio.subprocess.Process]]
) -> None:
    async def start_dev() -> tuple[asyncio.subprocess.Process, str]:
        proc = await start_process("dev", "--data-dir", str(tmp_path / "stack"), "--port", "0",
                                   "--partitions", "8")
        assert proc.stdout is not None
        for _ in range(5):
            line = (await asyncio.wait_for(proc.stdout.readline(), 60)).decode()
            if match := re.search(r"gRPC address\s+(\S+)", line):
                return proc, match.group(1)
        raise AssertionError("no address printed")

    async def stop_dev(proc: asyncio.subprocess.Process) -> None:
        proc.send_signal(signal.SIGINT)
        _, stderr = await asyncio.wait_for(proc.communicate(), 30)
        assert proc.returncode == 0, stderr.decode()
        assert "Traceback" not in stderr.decode()
        assert not (tmp_path / "stack" / "postgres" / "postmaster.pid").exists()

    proc, address = await start_dev()
    task_id = ok(await cli("submit", "later", "--in", "1h", "--address", address)).strip()
    await stop_dev(proc)

    proc, address = await start_dev()
    got = json.loads(ok(await cli("get", task_id, "--json", "--address", address)))
    assert got["state"] == "SCHEDULED"
    await stop_dev(proc)
