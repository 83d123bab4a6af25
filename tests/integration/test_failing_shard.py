"""A shard whose link is cut fails a call over the shards once; the calls after it leave that
shard out at once, without asking it again, until a probe of it answers, so an owner's next
statements fire the other shard's tasks instead of waiting for the cut one's timeout each.
Healed, the shard is asked again and its tasks fire (none lost)."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime, timedelta
from typing import Any
from urllib.parse import urlsplit

import pytest

from chronoq.chaos.proxy import ProxyHub
from chronoq.clock import SystemClock
from chronoq.coordinator.local import LocalOwnership
from chronoq.embedded.postgres import EmbeddedPostgres
from chronoq.errors import ShardUnavailable, StoreUnavailable
from chronoq.models import TaskSpec, TaskState
from chronoq.node.clock_check import ClockCheck
from chronoq.store.rows import FireResult
from chronoq.store.sharded import ShardedStore
from chronoq.store.store import Store
from tests.contract.conftest import PARTITIONS, TWO_SHARDS
from tests.integration.conftest import through

pytestmark = pytest.mark.timeout(90)

NOW = datetime(2030, 1, 1, 12, 0, 10, tzinfo=UTC)
DUE = NOW + timedelta(minutes=1)
LATER = NOW + timedelta(minutes=3)
#: Statements give up this soon here (a node's give up after 15 s), so the cut costs 1 s.
COMMAND_TIMEOUT_S = 1.0


class Counted:
    """How often a real store's ``fire_due`` was called (the store itself does the work)."""

    def __init__(self, store: Store) -> None:
        self.calls = 0
        real: Callable[..., Awaitable[FireResult]] = store.fire_due

        async def fire_due(*args: Any, **kwargs: Any) -> FireResult:
            self.calls += 1
            return await real(*args, **kwargs)

        store.fire_due = fire_due  # type: ignore[method-assign]


async def connect_shards(dsns: dict[str, str], stores: dict[str, Store]) -> None:
    """A store per shard of ``TWO_SHARDS`` into ``stores`` (filled as each opens, so the
    caller closes whatever opened even when a later one fails)."""
    for name in TWO_SHARDS.shards:
        stores[name] = await Store.connect(
            dsns[name],
            partitions=PARTITIONS,
            min_size=1,
            max_size=4,
            command_timeout=COMMAND_TIMEOUT_S,
            holds=TWO_SHARDS.held_by(name),
        )


async def test_a_failing_shard_is_left_out_until_it_answers_a_probe(
    two_dsns: tuple[str, str], postgres: EmbeddedPostgres, hub: ProxyHub
) -> None:
    tcp = urlsplit(postgres.over_tcp(two_dsns[1]))
    link = hub.add(f"{tcp.hostname}:{tcp.port}", "shard-1")
    dsns = {"shard-0": two_dsns[0], "shard-1": through(tcp.geturl(), link)}
    stores: dict[str, Store] = {}
    try:
        await connect_shards(dsns, stores)
        sharded = ShardedStore(stores, lambda: TWO_SHARDS)
        sharded.set_map(TWO_SHARDS)
        on_1 = set(TWO_SHARDS.held_by("shard-1"))
        fences = await sharded.take_fences_local(range(PARTITIONS), "node-a")
        owned = {p: f.token for p, f in fences.items()}
        owned_on_1 = {p: t for p, t in owned.items() if p in on_1}
        shard_1 = Counted(stores["shard-1"])

        on_0 = sorted(set(range(PARTITIONS)) - on_1)
        first = await sharded.submit([TaskSpec(queue="q", run_at=DUE) for _ in range(40)], NOW)
        first_on_0 = [o.task.id for o in first if o.task.partition not in on_1]
        assert first_on_0 and len(first_on_0) < len(first)

        link.cut()
        fired = await sharded.fire_due(owned, LATER)  # shard-1 times out: its part fails
        assert shard_1.calls == 1
        assert fired.fired == len(first_on_0)

        # shard-0 only (a submit over both shards would wait for shard-1 and fail)
        second = await stores["shard-0"].submit(
            [TaskSpec(queue="q", run_at=DUE) for _ in on_0], NOW, partitions=on_0
        )
        fired = await sharded.fire_due(owned, LATER)  # shard-1 is not asked again
        assert shard_1.calls == 1
        assert fired.fired == len(second)
        with pytest.raises(ShardUnavailable, match="shard-1"):
            await sharded.fire_due(owned_on_1, LATER)  # it alone: refused without a call
        assert shard_1.calls == 1

        link.heal()
        everything = [o.task.id for o in [*first, *second]]
        for _ in range(60):  # the probe answers once the link is back (each bounded)
            await sharded.fire_due(owned, LATER)
            states = [(await sharded.get(t, "default")).state for t in everything]
            if all(s is TaskState.READY for s in states):
                break  # every task of both rounds fired, shard-1's after the heal
            await asyncio.sleep(0.25)
        else:
            raise AssertionError(f"shard-1's tasks never fired after the heal: {states}")
        assert shard_1.calls > 1
    finally:
        for store in stores.values():
            await store.close()


async def test_a_new_connection_behind_a_cut_link_gives_up_with_the_command_timeout(
    dsn: str, postgres: EmbeddedPostgres, hub: ProxyHub
) -> None:
    tcp = urlsplit(postgres.over_tcp(dsn))
    link = hub.add(f"{tcp.hostname}:{tcp.port}", "store")
    store = await Store.connect(
        through(tcp.geturl(), link), min_size=1, max_size=1, command_timeout=COMMAND_TIMEOUT_S
    )
    try:
        link.cut()
        await store.pool.expire_connections()  # the next call opens a new connection
        # The driver's own connect timeout is 60 s; the store's is its command timeout.
        with pytest.raises(StoreUnavailable):
            await asyncio.wait_for(store.count_by_state(), 20)
    finally:
        link.heal()
        await store.close()


class ClockReads:
    """How often a real store's server clock was opened (the store itself reads it)."""

    def __init__(self, store: Store) -> None:
        self.opened = 0
        real = store.server_clock

        def server_clock() -> Any:
            self.opened += 1
            return real()

        store.server_clock = server_clock  # type: ignore[method-assign]


async def test_the_clock_check_reads_the_next_shard_while_the_first_is_cut_off(
    two_dsns: tuple[str, str], postgres: EmbeddedPostgres, hub: ProxyHub
) -> None:
    """The first shard is every node's reference clock; cut off, the next one stands in, so
    the clock check (a critical loop: it feeds every node's health) keeps measuring."""
    tcp = urlsplit(postgres.over_tcp(two_dsns[0]))
    link = hub.add(f"{tcp.hostname}:{tcp.port}", "shard-0")
    dsns = {"shard-0": through(tcp.geturl(), link), "shard-1": two_dsns[1]}
    stores: dict[str, Store] = {}
    try:
        await connect_shards(dsns, stores)
        sharded = ShardedStore(stores, lambda: TWO_SHARDS)
        sharded.set_map(TWO_SHARDS)
        reads = {name: ClockReads(store) for name, store in stores.items()}
        ownership = LocalOwnership(stores["shard-1"], "node-a")
        check = ClockCheck(sharded, SystemClock(), ownership)

        assert await check.check() is False
        assert (reads["shard-0"].opened, reads["shard-1"].opened) == (1, 0)  # the first's

        link.cut()
        await stores["shard-0"].pool.expire_connections()
        for _ in range(3):  # the first read waits for the cut shard's timeout, then moves on
            assert await asyncio.wait_for(check.check(), 10) is False
        assert check.last is not None and abs(check.last.offset) < timedelta(seconds=1)
        assert reads["shard-1"].opened == 3
        assert reads["shard-0"].opened == 2  # asked once more, then left out while failing

        link.heal()
        for _ in range(40):  # once a probe of it answers, the first shard is the reference
            before = (reads["shard-0"].opened, reads["shard-1"].opened)
            await check.check()
            if (reads["shard-0"].opened, reads["shard-1"].opened) == (before[0] + 1, before[1]):
                break
            await asyncio.sleep(0.25)
        else:
            raise AssertionError("the clock check never went back to the first shard")
    finally:
        for store in stores.values():
            await store.close()
