"""Routing on the real store: a keyed submit lands in its key's partition, every new id
carries its row's partition, a schedule's occurrences share its partition, and rows minted
before routing (v7 ids placed by id hash) are still found, fired and worked."""

from __future__ import annotations

import asyncio
import uuid
from datetime import timedelta
from typing import Any

import pytest

from chronoq.buckets import bucket_of, partition_of
from chronoq.client import Client, NewTask
from chronoq.clock import ManualClock
from chronoq.ids import time_ordered_ids
from chronoq.models import Lease, TaskSpec, TaskState
from chronoq.node import Node
from chronoq.routing import carries_partition, id_partition, key_partition
from chronoq.store import Store
from tests.integration.conftest import NodeFactory
from tests.integration.test_cluster_inproc import cluster, settled
from tests.integration.test_schedules import BY_HAND, by_hand, pump

pytestmark = pytest.mark.timeout(60)


async def test_a_keyed_submit_lands_in_the_partition_of_its_key(
    store: Store, clock: ManualClock
) -> None:
    now = clock.now()
    specs = [
        *(TaskSpec(queue="q", run_at=now, idempotency_key=f"order-{i}") for i in range(50)),
        *(TaskSpec(queue="q", run_at=now, namespace="t2", idempotency_key=f"order-{i}")
          for i in range(50)),
        *(TaskSpec(queue="q", run_at=now + timedelta(hours=1)) for _ in range(200)),
    ]  # fmt: skip
    out = await store.submit(specs, now)
    assert all(o.created for o in out)
    for spec, o in zip(specs, out, strict=True):
        if spec.idempotency_key is not None:
            assert o.task.partition == key_partition(
                spec.namespace, spec.idempotency_key, store.partitions
            )
    # The namespace is part of the routing key: the same keys of two namespaces spread apart.
    assert [o.task.partition for o in out[:50]] != [o.task.partition for o in out[50:100]]
    # Keyless tasks are drawn over the partitions, not piled into one.
    assert len({o.task.partition for o in out[100:]}) >= store.partitions // 2
    # Every new id carries the partition of its row: by-id calls need no lookup.
    for o in out:
        assert carries_partition(uuid.UUID(o.task.id).bytes)
        assert id_partition(uuid.UUID(o.task.id), store.partitions) == o.task.partition
    ids = await store.submit_ids([TaskSpec(queue="q", run_at=now) for _ in range(20)], now)
    for task_id, _created in ids:
        row = await store.get(task_id, "default")
        assert id_partition(uuid.UUID(task_id), store.partitions) == row.partition
    # ... and ids stay time-ordered (stamped by the system's time): a later submit sorts after.
    await asyncio.sleep(0.005)
    (later,) = await store.submit([TaskSpec(queue="q", run_at=now)], clock.now())
    assert uuid.UUID(later.task.id).bytes[:6] > uuid.UUID(out[0].task.id).bytes[:6]


async def test_one_key_submitted_through_two_nodes_is_one_task_in_its_partition(
    make_node: NodeFactory, etcd: Any, cluster_name: str, store: Store
) -> None:
    settings = cluster(etcd, cluster_name)
    nodes = [await make_node(cluster=settings, node_id=f"n{i}") for i in range(2)]
    await settled(nodes)
    clients = [Client(n.address) for n in nodes]
    try:
        keys = [f"pay-{i}" for i in range(20)]
        for key in keys:
            first, second = await asyncio.gather(
                *(c.submit("pay", idempotency_key=key, delay=timedelta(hours=1)) for c in clients)
            )
            assert first.task.id == second.task.id
            assert sorted([first.created, second.created]) == [False, True]
            assert first.task.partition == key_partition("default", key, store.partitions)
        # A retry through either node later still answers the first task.
        again = await clients[1].submit_many(
            [NewTask(queue="pay", idempotency_key=k, delay=timedelta(hours=1)) for k in keys]
        )
        assert not any(s.created for s in again)
        assert await store.count_by_state() == {TaskState.SCHEDULED: len(keys)}
    finally:
        for c in clients:
            await c.close()


async def test_a_schedule_and_its_occurrences_share_its_partition(
    make_node: NodeFactory, clock: ManualClock, store: Store
) -> None:
    node = await by_hand(await make_node(clock=clock, schedule_interval=BY_HAND))
    client = Client(node.address)
    try:
        made = await client.create_schedule(
            "every20", "occ", every=timedelta(seconds=20), start_at=clock.now()
        )
        assert made.partition == key_partition("default", "every20", store.partitions)
        assert id_partition(uuid.UUID(made.id), store.partitions) == made.partition
        await pump(node)  # counted in the store: the node may have made them already
        tasks = (await client.list(queue="occ")).tasks
        assert len(tasks) == 4
        for t in tasks:
            assert t.partition == made.partition
            assert id_partition(uuid.UUID(t.id), store.partitions) == made.partition
    finally:
        await client.close()


async def legacy_row(store: Store, task_id: uuid.UUID, run_at: Any, key: str) -> int:
    """A SCHEDULED task as chronoq wrote it before routing: a v7 id, placed by its hash."""
    partition = partition_of(task_id.bytes, store.partitions)
    async with store.pool.acquire() as conn:
        await conn.execute(
            """
            INSERT INTO tasks (id, namespace, queue, partition, bucket, run_at, state,
                               idempotency_key, max_attempts, backoff_initial_ms, backoff_max_ms,
                               lease_timeout_ms, misfire_grace_ms, created_at)
            VALUES ($1, 'default', 'legacy', $2, $3, $4::timestamptz, $5, $6, 3, 1000, 60000, 30000,
                    60000, $4::timestamptz - interval '1 minute')
            """,
            task_id,
            partition,
            bucket_of(run_at, store.bucket_seconds),
            run_at,
            int(TaskState.SCHEDULED),
            key,
        )
    return partition


async def test_a_task_with_an_id_from_before_routing_is_found_fired_and_worked(
    node: Node, client: Client, clock: ManualClock, store: Store
) -> None:
    run_at = clock.now() + timedelta(seconds=30)
    (legacy_id,) = time_ordered_ids(1, int(clock.now().timestamp() * 1000))
    by_hash = partition_of(legacy_id.bytes, store.partitions)
    # A key whose partition now (by key) is not the legacy row's (by id hash).
    key = next(
        k
        for k in (f"old-{i}" for i in range(100))
        if key_partition("default", k, store.partitions) != by_hash
    )
    partition = await legacy_row(store, legacy_id, run_at, key)
    task_id = str(legacy_id)
    assert not carries_partition(uuid.UUID(task_id).bytes)
    assert id_partition(uuid.UUID(task_id), store.partitions) == partition
    got = await client.get(task_id)
    assert got.partition == partition and got.state is TaskState.SCHEDULED
    # A keyed resubmit of the old key answers the old task, wherever its key would route now.
    again = await client.submit("legacy", idempotency_key=key, delay=timedelta(seconds=30))
    assert not again.created and again.task.id == task_id
    # The owner fires it, a worker claims and completes it by its id.
    clock.advance(timedelta(seconds=31))
    assert node.firer is not None
    for _ in range(50):
        await node.firer.tick()
        if (await client.get(task_id)).state is TaskState.READY:
            break
        await asyncio.sleep(0.02)
    (claimed,) = await client.claim(["legacy"], max_tasks=5)
    assert claimed.id == task_id
    done = await client.complete(Lease(task_id, claimed.attempt))
    assert done.state is TaskState.SUCCEEDED
