"""The embedded stack of 2 store shards x 3 Patroni members (``chronoq dev --store-shards 2
--pg-members 3``) lives through one shard's primary postmaster killed: the other shard keeps
firing and taking submits, the killed shard gets a new primary and its partitions resume, and
no acknowledged submit is lost on either shard.

The stack is ``DevStack``, the code ``chronoq dev`` runs, in this process (its nodes are
processes of their own). Skipped, saying why, where Patroni cannot be installed.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import time
import uuid
from collections.abc import AsyncIterator, Sequence
from datetime import timedelta
from pathlib import Path

import asyncpg
import pytest

from chronoq.client import Client, NewTask
from chronoq.devstack import DevStack, DevStackSettings
from chronoq.embedded import processes
from chronoq.embedded.ha import PatroniCluster, PatroniUnavailable
from chronoq.embedded.ha.install import ensure_patroni
from chronoq.embedded.shards import shard_name
from chronoq.errors import ChronoqError
from chronoq.models import DEFAULT_NAMESPACE, Lease, TaskState
from chronoq.routing import id_partition, key_partition

pytestmark = [pytest.mark.slow, pytest.mark.timeout(420)]

PARTITIONS = 8
QUEUE = "sharded-ha"
#: Bounds of every wait below (each loop ends by itself).
SETTLE_S = 90.0


def _proc_pids_under(root: Path) -> list[int]:
    """PIDs of processes whose command line names ``root`` (Patroni's configuration and each
    postmaster's ``-D`` live there; etcd's and the nodes' data too)."""
    mark = str(root).encode()
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        with contextlib.suppress(OSError):
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                if mark in f.read():
                    found.append(int(entry))
    return found


def _cluster_pids(ha: PatroniCluster) -> set[int]:
    """Every Patroni and postgres process of ``ha`` running now."""
    pids: set[int] = set()
    for member in ha.members.values():
        if member.patroni_pid is not None:
            pids.add(member.patroni_pid)
        pids.update(processes.server_pids(member.data_dir, ha.bin_dir))
    return pids


@pytest.fixture
async def stack(tmp_path: Path) -> AsyncIterator[DevStack]:
    try:
        await asyncio.to_thread(ensure_patroni)
    except PatroniUnavailable as exc:
        pytest.skip(f"Patroni cannot run here: {exc}")
    root = tmp_path / "dev"
    dev = DevStack(
        DevStackSettings(
            data_dir=root, port=0, partitions=PARTITIONS, pg_members=3, store_shards=2,
            tick=timedelta(milliseconds=50), lease_ttl=5,
        )
    )  # fmt: skip
    seen: set[int] = set()
    try:
        await dev.start()
        yield dev
    finally:
        for ha in _clusters(dev):
            with contextlib.suppress(OSError):
                seen |= _cluster_pids(ha)
        await dev.stop()
        left = [p for p in seen if processes.alive(p)] + [
            p for p in _proc_pids_under(root) if p not in seen
        ]
        assert not left, f"processes of the stack left after stop: {sorted(set(left))}"


def _clusters(dev: DevStack) -> list[PatroniCluster]:
    """shard-0's Patroni cluster, then shard-1's."""
    found = [dev.ha] if dev.ha is not None else []
    return found + [s.ha for s in dev.shards.servers if s.ha is not None]


def _keys_for(partitions: set[int], count: int) -> list[str]:
    """``count`` idempotency keys that route into ``partitions``."""
    keys: list[str] = []
    while len(keys) < count:
        key = uuid.uuid4().hex
        if key_partition(DEFAULT_NAMESPACE, key, PARTITIONS) in partitions:
            keys.append(key)
    return keys


async def _submit(client: Client, keys: Sequence[str], delay: float) -> list[str]:
    ids = await client.submit_ids(
        [NewTask(queue=QUEUE, idempotency_key=k, delay=timedelta(seconds=delay)) for k in keys]
    )
    return [i for i, _ in ids]


async def _work(client: Client, done: dict[str, float], stop: asyncio.Event) -> None:
    """Claim and complete until ``stop``; ``done``: task id -> when it was completed."""
    while not stop.is_set():
        try:
            tasks = await client.claim([QUEUE], max_tasks=50, wait=timedelta(seconds=0.5))
            for task in tasks:
                await client.complete(Lease(task.id, task.attempt))
                done[task.id] = time.monotonic()
        except ChronoqError:
            await asyncio.sleep(0.1)  # a shard away: the worker claims again


async def _rows(dsn: str, ids: Sequence[str]) -> dict[str, tuple[int, float | None]]:
    """id -> (state, fired_at as epoch seconds) of the tasks of ``ids`` found on one shard."""
    conn = await asyncpg.connect(dsn, timeout=10)
    try:
        rows = await conn.fetch(
            "SELECT id::text, state, extract(epoch FROM fired_at)::float8 AS fired"
            " FROM tasks_with_history WHERE id = ANY($1::uuid[])",
            list(ids),
        )
    finally:
        await conn.close()
    return {r["id"]: (r["state"], r["fired"]) for r in rows}


async def _wait_done(done: dict[str, float], ids: Sequence[str], what: str) -> None:
    deadline = time.monotonic() + SETTLE_S
    while any(i not in done for i in ids):
        missing = [i for i in ids if i not in done]
        assert time.monotonic() < deadline, f"{what}: {len(missing)} never ran: {missing[:5]}"
        await asyncio.sleep(0.2)


class Traffic:
    """Keyed submits to each shard's partitions and ``Status`` calls, until ``stop``."""

    def __init__(self, client: Client, held: dict[str, set[int]]) -> None:
        self.client = client
        self.held = held
        self.stop = asyncio.Event()
        self.acked: dict[str, list[tuple[str, float]]] = {s: [] for s in held}  # (id, when)
        self.health: list[tuple[float, dict[str, str]]] = []  # (when, shard -> health)
        self.errors: list[str] = []  # of Status calls

    def start(self) -> list[asyncio.Task[None]]:
        loops = [asyncio.create_task(self._submits(s)) for s in self.held]
        return [*loops, asyncio.create_task(self._statuses())]

    async def _submits(self, shard: str) -> None:
        """The killed shard's submits wait out its failover in the SDK."""
        while not self.stop.is_set():
            try:
                ids = await _submit(self.client, _keys_for(self.held[shard], 3), 0.2)
            except ChronoqError:  # not acknowledged: nothing to find later
                continue
            self.acked[shard].extend((i, time.time()) for i in ids)
            await asyncio.sleep(0.05)

    async def _statuses(self) -> None:
        """``Status`` keeps answering while a shard is down, and names it."""
        while not self.stop.is_set():
            try:
                seen = await self.client.status()
            except ChronoqError as exc:
                self.errors.append(str(exc))
            else:
                assert seen.shard_map is not None
                shards = {h.name: h.health for h in seen.shard_map.shards}
                self.health.append((time.time(), shards))
            await asyncio.sleep(0.3)


def _state_postmasters(dev: DevStack) -> list[set[int]]:
    """The postmaster PIDs ``dev.json`` names, shard-0's first."""
    state = json.loads(dev.state_file.read_text())
    members = [state["postgres_members"], *(s["members"] for s in state["store_shards"])]
    return [{m["postmaster_pid"] for m in ms if m["postmaster_pid"]} for ms in members]


def _live_postmasters(ha: PatroniCluster) -> set[int]:
    return {pid for m in ha.members.values() if (pid := m.postmaster_pid) is not None}


@pytest.mark.parametrize("killed", [0, 1], ids=["shard-0", "shard-1"])
async def test_one_shard_primary_killed_is_that_shards_outage_only(
    stack: DevStack, killed: int
) -> None:
    dev = stack
    shard0, shard1 = _clusters(dev)
    down, up = shard_name(killed), shard_name(1 - killed)
    victim = (shard0, shard1)[killed]
    # Each shard its own Patroni cluster: its own scope, one primary and two streaming
    # replicas (Patroni's REST API, GET /cluster), no member shared.
    assert shard0.scope != shard1.scope
    for name, ha in ((shard_name(0), shard0), (shard_name(1), shard1)):
        seen = await asyncio.to_thread(ha.wait_ready, SETTLE_S)
        assert seen.leader is not None and len(seen.streaming) == 2, (name, seen)
    ports = [{m.address.pg_port for m in ha.members.values()} for ha in (shard0, shard1)]
    assert not ports[0] & ports[1]

    stop = asyncio.Event()
    done: dict[str, float] = {}
    async with (
        Client(",".join(dev.addresses), timeout=10) as client,
        Client(",".join(dev.addresses), timeout=10) as worker_client,
    ):
        status = await client.status()
        held: dict[str, set[int]] = {shard_name(0): set(), shard_name(1): set()}
        for p in status.ownership:
            held[p.shard].add(p.partition)
        assert all(held.values()), f"a shard holds no partition: {held}"
        on = {p: s for s, ps in held.items() for p in ps}
        worker = asyncio.create_task(_work(worker_client, done, stop))
        try:
            # Both shards take submits, fire and run them.
            first = {s: await _submit(client, _keys_for(ps, 10), 0.3) for s, ps in held.items()}
            for s, ids in first.items():
                assert {on[id_partition(uuid.UUID(i), PARTITIONS)] for i in ids} == {s}
                await _wait_done(done, ids, f"{s} before the kill")

            # One shard's primary postmaster killed by PID. Meanwhile the other takes submits
            # and fires them; the killed shard's submits wait out its failover in the SDK.
            old_leader = victim.leader()
            assert old_leader is not None
            killed_pid = victim.members[old_leader].postmaster_pid
            assert killed_pid is not None
            killed_at = time.time()
            os.kill(killed_pid, signal.SIGKILL)
            traffic = Traffic(client, held)
            loops = traffic.start()
            new_leader = await asyncio.to_thread(victim.wait_writable, SETTLE_S)
            recovered_at = time.time()
            await asyncio.sleep(2)  # the killed shard's partitions take submits again
            traffic.stop.set()
            await asyncio.gather(*loops)
            acked, health = traffic.acked, traffic.health

            new_pid = victim.members[new_leader].postmaster_pid
            assert new_pid is not None and new_pid != killed_pid
            during = [i for i, t in acked[up] if killed_at < t < recovered_at]
            assert during, f"{up} acknowledged no submit while {down} was down"
            after = [i for i, t in acked[down] if t > recovered_at]
            assert after, f"{down} took no submit after its failover"
            answered = [h for t, h in health if killed_at < t < recovered_at]
            assert answered, f"Status answered nothing during the outage: {traffic.errors[:3]}"
            blamed = {s for _, h in health for s, v in h.items() if v != "ok"}
            assert blamed <= {down}, f"health named {blamed} down, only {down} was"

            every = {s: first[s] + [i for i, _ in acked[s]] for s in held}
            for ids in every.values():
                await _wait_done(done, ids, "after the failover")

            # Patroni restarts a killed primary in place when it can; the shard's partitions
            # also follow the primary to another member (the nodes' multi-host DSN and
            # password file name every member).
            moved_to = await asyncio.to_thread(victim.switchover)
            assert moved_to != new_leader
            later = await _submit(client, _keys_for(held[down], 10), 0.3)
            every[down] += later
            await _wait_done(done, later, f"{down} after a switchover")
        finally:
            stop.set()
            await worker

    # dev.json names the postmasters that run now (operators act on its PIDs).
    deadline = time.monotonic() + 10
    while _state_postmasters(dev) != [_live_postmasters(ha) for ha in (shard0, shard1)]:
        assert time.monotonic() < deadline, (
            f"dev.json names postmasters {_state_postmasters(dev)}, running: "
            f"{[_live_postmasters(ha) for ha in (shard0, shard1)]}"
        )
        await asyncio.sleep(0.2)

    # No acknowledged submit lost, each on the shard its partition names; the other shard
    # fired during the killed one's outage.
    rows = {s: await _rows(dev.shard_dsns[s], ids) for s, ids in every.items()}
    for s, ids in every.items():
        lost = [i for i in ids if i not in rows[s]]
        assert not lost, f"{s}: {len(lost)} acknowledged submits lost: {lost[:5]}"
        assert {rows[s][i][0] for i in ids} == {int(TaskState.SUCCEEDED)}
    fired_during = [i for i in during if (f := rows[up][i][1]) is not None and f < recovered_at]
    print(
        f"killed {old_leader}'s postmaster {killed_pid} on {down}; new primary "
        f"{new_leader} (postmaster {new_pid}) after {recovered_at - killed_at:.1f} s, then "
        f"{moved_to} by switchover; "
        f"{up} acked {len(during)} and fired {len(fired_during)} meanwhile; Status answered "
        f"{len(answered)} times ({len(traffic.errors)} errors), {down} seen down in "
        f"{sum(1 for h in answered if h.get(down) != 'ok')}; "
        f"acked {', '.join(f'{s}: {len(ids)}' for s, ids in every.items())}, 0 lost"
    )
    assert fired_during, f"{up} fired nothing while {down} was down"
