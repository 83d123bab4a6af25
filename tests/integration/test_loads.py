"""The loads the leading member publishes, over a real etcd and PostgreSQL: a backlog of
overdue tasks (what a slow store leaves behind its owner) moves no partition, the same
tasks still coming do. Bare ownerships, no firing: the backlog stays put while counted."""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import AsyncIterator, Sequence
from datetime import datetime, timedelta
from typing import Any

import pytest

from chronoq.buckets import bucket_of
from chronoq.clock import ManualClock
from chronoq.coordinator.etcd import ClusterSettings
from chronoq.coordinator.ownership import EtcdOwnership
from chronoq.partitionmap import PartitionMap
from chronoq.store import Store

pytestmark = pytest.mark.timeout(60)

PARTITIONS = 16
TASKS = 3000


@pytest.fixture
async def members(
    etcd: Any, cluster_name: str, store: Store, clock: ManualClock
) -> AsyncIterator[list[EtcdOwnership]]:
    """Two members owning their share; their own loads pass never runs (the test calls it)."""
    settings = ClusterSettings(
        etcd=etcd.client_settings(cluster_name),
        lease_ttl=2,
        reconcile_interval=0.5,
        load_interval=3600,
    )
    made: list[EtcdOwnership] = []
    try:
        for name in ("m0", "m1"):
            own = EtcdOwnership(
                store, name, f"{name}:0", settings, clock, partitions=PartitionMap(PARTITIONS)
            )
            made.append(own)
            await own.start()
        await settled(made)
        yield made
    finally:
        for own in made:
            await asyncio.wait_for(own.stop(), 20)


async def settled(members: Sequence[EtcdOwnership], timeout: float = 10) -> dict[int, str]:
    """Every partition owned, by the member the assignment names."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while True:
        owners = {p: m.node_id for m in members for p in m.owned()}
        if len(owners) == PARTITIONS and owners == members[0].assignment():
            return owners
        assert loop.time() < deadline, f"not settled: {Counter(owners.values())}"
        await asyncio.sleep(0.05)


async def pending(store: Store, partitions: list[int], run_at: datetime) -> None:
    """``TASKS`` SCHEDULED tasks due at ``run_at``, spread over ``partitions``."""
    async with store.pool.acquire() as conn:
        await conn.execute(
            """
            INSERT INTO tasks (id, namespace, queue, partition, bucket, run_at, state,
                               max_attempts, backoff_initial_ms, backoff_max_ms,
                               lease_timeout_ms, misfire_grace_ms, created_at)
            SELECT gen_random_uuid(), 'default', 'loads', ($1::smallint[])[1 + i % $2], $3, $4,
                   0, 3, 1000, 1000, 30000, 60000, $4
            FROM generate_series(1, $5) AS i
            """,
            partitions,
            len(partitions),
            bucket_of(run_at, store.bucket_seconds),
            run_at,
            TASKS,
        )


async def test_an_overdue_backlog_moves_no_partition_and_coming_work_does(
    members: list[EtcdOwnership], store: Store, clock: ManualClock
) -> None:
    before = await settled(members)
    leader = next(m for m in members if m.leads())
    victim = Counter(before.values()).most_common(1)[0][0]
    crowded = sorted(p for p, n in before.items() if n == victim)[:3]
    now = clock.now()
    # Due 5 s ago, in the current bucket, and not fired: an owner whose store is slow.
    await pending(store, crowded, now - timedelta(seconds=5))
    assert bucket_of(now - timedelta(seconds=5), store.bucket_seconds) == bucket_of(
        now, store.bucket_seconds
    )
    for _ in range(3):  # pass after pass, as the leader's loop would
        assert not await leader.publish_loads()
    assert leader.published_loads() == {}
    assert leader.assignment() == before

    # The same tasks still to come, two minutes ahead: a hot bucket, spread before it is due.
    async with store.pool.acquire() as conn:
        ahead = now + timedelta(minutes=2)
        await conn.execute(
            "UPDATE tasks SET run_at = $1, bucket = $2 WHERE queue = 'loads'",
            ahead,
            bucket_of(ahead, store.bucket_seconds),
        )
    assert await leader.publish_loads()
    loop = asyncio.get_running_loop()
    deadline = loop.time() + 10
    while not set(crowded) <= leader.published_loads().keys():
        assert loop.time() < deadline, "the coming loads never reached the view"
        await asyncio.sleep(0.05)
    after = await settled(members)
    assert {after[p] for p in crowded} != {victim}  # a hot partition left the crowded member
