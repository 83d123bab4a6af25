"""A local stack with several store shards: each shard its own embedded PostgreSQL (own data
directory, socket directory and ``chronoq`` password), all migrated, and every server gone
(by PID) after the stop."""

from __future__ import annotations

import subprocess
import sys
from datetime import timedelta
from pathlib import Path

import asyncpg
import pytest

from chronoq.devstack import DevStack, DevStackSettings
from chronoq.embedded import processes
from chronoq.embedded.passfile import passfile_text
from chronoq.embedded.shards import StoreShards
from chronoq.errors import ConfigError
from chronoq.store.migrations import pending

pytestmark = pytest.mark.timeout(240)


def _node_takes_store_shards() -> bool:
    help_text = subprocess.run(
        [sys.executable, "-m", "chronoq.cli", "node", "--help"],
        capture_output=True, text=True, timeout=60, check=False,
    ).stdout  # fmt: skip
    return "--store-shard" in help_text


def _parent(pid: int) -> int:
    stat = Path(f"/proc/{pid}/stat").read_text()
    return int(stat.rpartition(")")[2].split()[1])


async def _identity(dsn: str) -> tuple[int, list[int]]:
    """The postmaster that answers (its backend's parent), and the migrations not applied."""
    conn = await asyncpg.connect(dsn)
    try:
        backend = await conn.fetchval("SELECT pg_backend_pid()")
        return _parent(int(backend)), await pending(conn)
    finally:
        await conn.close()


async def test_a_two_shard_store_starts_both_servers_and_migrates_the_second(
    tmp_path: Path,
) -> None:
    """The store half of the stack (what the nodes are given), without the nodes."""
    stack = DevStack(DevStackSettings(data_dir=tmp_path / "dev", partitions=16, store_shards=2))
    pids: list[int] = []
    try:
        await stack.start_store()
        dsns = stack.shard_dsns
        assert list(dsns) == ["shard-0", "shard-1"]
        shard0_server, _ = await _identity(dsns["shard-0"])
        shard1_server, shard1_pending = await _identity(dsns["shard-1"])
        shard1 = stack.shards.servers[0].postgres
        assert shard1 is not None and shard1.data_dir.is_relative_to(tmp_path / "dev")
        assert (shard0_server, shard1_server) == (stack.postgres.pid, shard1.pid)
        assert shard1_pending == []
        pids = stack.postgres.server_pids() + stack.shards.servers[0].server_pids()
        assert stack.postgres.pid in pids and stack.shards.servers[0].primary_pid in pids
    finally:
        await stack.stop()
    alive = [p for p in pids if processes.alive(p)]
    assert not alive, f"processes {alive} outlived the stop"


async def test_store_shards_start_together_each_its_own_server_and_stop_by_pid(
    tmp_path: Path,
) -> None:
    shards = StoreShards(tmp_path / "shards", 3, durable=False)
    assert [s.name for s in shards.servers] == ["shard-1", "shard-2"]
    try:
        shards.start()
        dsns = shards.ensure_database("chronoq")
        pids = {s.name: s.server_pids() for s in shards.servers}
        postmasters = {s.name: s.primary_pid for s in shards.servers}
        assert all(pids.values()) and len(set(postmasters.values())) == 2
        data_dirs = {s.postgres.data_dir for s in shards.servers if s.postgres is not None}
        sockets = {s.postgres.socket_dir for s in shards.servers if s.postgres is not None}
        passwords = {s.postgres.app_password for s in shards.servers if s.postgres is not None}
        assert len(data_dirs) == len(sockets) == len(passwords) == 2
        for server in shards.servers:
            assert server.postgres is not None
            assert server.postgres.socket_dir.stat().st_mode & 0o077 == 0
            assert server.postgres.app_password_file.stat().st_mode & 0o077 == 0
        # One shard's password does not open another shard's server.
        first, second = (s.postgres for s in shards.servers if s.postgres is not None)
        wrong = second.dsn_for("chronoq").replace(
            second.app_password, first.app_password
        )
        with pytest.raises(asyncpg.InvalidPasswordError):
            await asyncpg.connect(wrong)
        assert len(dsns) == 2
    finally:
        shards.stop()
    for name, found in pids.items():
        alive = [p for p in found if processes.alive(p)]
        assert not alive, f"{name}: processes {alive} outlived the stop"


def test_store_shards_out_of_range_are_refused_with_the_bound(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="1 to 8"):
        DevStackSettings(data_dir=tmp_path, store_shards=9)
    with pytest.raises(ConfigError, match="more shards than partitions"):
        DevStackSettings(data_dir=tmp_path, store_shards=3, partitions=2)
    with pytest.raises(ConfigError, match="1 to 8"):
        DevStackSettings(data_dir=tmp_path, store_shards=0)


def test_the_password_file_names_each_server_and_no_command_line_has_a_password() -> None:
    text = passfile_text(
        [
            "postgresql://chronoq:pw1@/chronoq?host=%2Ftmp%2Fcqpg-1&port=5433",
            "postgresql://chronoq:pw2@127.0.0.2:6001,127.0.0.3:6002/chronoq"
            "?target_session_attrs=read-write",
        ],
        fallback="postgresql://chronoq:pw0@/chronoq?host=%2Ftmp%2Fcqpg-0&port=5432",
    )
    assert text.splitlines() == [
        "localhost:5433:chronoq:chronoq:pw1",
        "127.0.0.2:6001:chronoq:chronoq:pw2",
        "127.0.0.3:6002:chronoq:chronoq:pw2",
        "*:*:chronoq:chronoq:pw0",
    ]


@pytest.mark.skipif(not _node_takes_store_shards(), reason="chronoq node has no --store-shard")
async def test_a_two_shard_stack_comes_up_migrated_on_two_servers_and_stops_clean(
    tmp_path: Path,
) -> None:
    settings = DevStackSettings(
        data_dir=tmp_path / "dev", port=0, partitions=16, store_shards=2,
        tick=timedelta(milliseconds=50), drop_database=True,
    )  # fmt: skip
    stack = DevStack(settings)
    pids: list[int] = []
    try:
        await stack.start()
        dsns = stack.shard_dsns
        assert list(dsns) == ["shard-0", "shard-1"]
        seen = [await _identity(dsn) for dsn in dsns.values()]
        assert seen[0][0] != seen[1][0], "both shards answered from one server"
        assert [p for _, p in seen] == [[], []]
        node = next(iter(stack.cluster.nodes.values())) if stack.cluster else None
        assert node is not None and "--store-shard" in node.args
        assert not any("pw" in a and "@" in a and ":" in a.split("@")[0] for a in node.args)
        state = stack.state()
        assert [s["name"] for s in state["store_shards"]] == ["shard-1"]
        pids = stack.postgres.server_pids() + [
            p for s in stack.shards.servers for p in s.server_pids()
        ]
        assert len(pids) >= 2
    finally:
        await stack.stop()
    alive = [p for p in pids if processes.alive(p)]
    assert not alive, f"processes {alive} outlived the stop"
