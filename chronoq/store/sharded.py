"""A task store of several shards behind the same port: each call goes where the shard map
says (``docs/design/shards.md``), and calls that span shards fan out and merge.

Routing, by port:

- **by partition** (owner statements, reads and retention over given partitions): the
  partitions grouped by ``map.shard_of(p)``, one statement per shard, concurrently, the
  answers merged (``chronoq.store.fanout``). Retention runs shard after shard, so one call
  deletes at most ``batch`` rows in all.
- **by task id**: ``routing.id_partition`` names the shard; lease and id lists are grouped.
- **by placement** (submits): each spec's partition is computed here
  (``routing.submit_partitions``) and handed to the shard's store, one transaction per shard,
  concurrently. Specs are checked for what a shard would refuse (NUL in text) before any
  shard writes; a shard that fails after others committed raises ``BatchPartlyAccepted``
  (UNAVAILABLE, "outcome unknown"): the SDK, which keys every task, repeats the whole batch.
  A key of a task made before routing is answered by that task (``chronoq.store.legacy``).
- **by queue**: a claim reads each shard's head of its queues first (at most ``max_tasks``
  READY tasks, unlocked), merges them into how many each shard claims (the best by
  priority and run_at within the byte budget), and each shard claims that many under a
  strict share of the budget: no task is leased that the answer does not keep, so no
  attempt is spent on a task no worker gets. While one shard alone held ready tasks of the
  queues at the last claim, it is claimed at once, the others' heads read beside it. Queue
  limits and their token buckets live on the map's first shard (``shard-0``, never removed
  and never a partition's move): one statement counts a namespace's limits against its
  cap, and every claim of a limited queue takes its tokens there, then claims on any shard
  and gives back what it did not use.
- **admin**: listings keyset by id over every shard (each shard's page after the token,
  merged, cut where the first shard's page ended); counts summed; fences concatenated.
- **notices**: announced on one shard (the first that answers), listened to on every shard.
- **reachability and clock**: ``probe`` is every shard, ``probe_shard(name)`` one;
  ``server_clock`` is the first answering shard's, ``server_clock_of(name)`` any shard's.

A down shard: a call that needs it alone raises ``ShardUnavailable`` naming it; reads,
counts and owner statements over several shards skip it (logged; a node's per-shard health
says which), unless every shard they need is down; a write that must reach it fails (a
submit with ``BatchPartlyAccepted`` when others committed). A listing does not skip a shard:
its page token would walk past that shard's rows for good.

``PartitionMoved`` (a shard that no longer holds a partition at the caller's map version):
``refresh()`` is awaited (at most ``REFRESH_S``), and the refused part of the call is routed
again under the new map, once; refused again, the error goes to the caller.

When one shard holds every partition, each call goes straight to its store: the single
deployment pays an attribute read and an identity check per call.

For the node (``node.py``): build ``ShardedStore({"shard-0": store, ...}, view.current,
refresh=view.refresh)``; call ``add_store`` when the map gains a shard (before routing to
it), ``set_map`` when the view delivers a new map (pushes its version into each store, which
passes it to the fenced writes); per-shard health from ``probe_shard``, the clock check per
shard through ``server_clock_of``. ``ShardedSchedules(sharded)`` replaces ``Schedules``.
"""

from __future__ import annotations

from chronoq.store.shard_bulk import ShardBulk
from chronoq.store.shard_claims import SOLE_ENTRIES, ShardClaims
from chronoq.store.shard_health import ShardHealth
from chronoq.store.shard_history import ShardHistory
from chronoq.store.shard_listings import ShardListings
from chronoq.store.shard_partitions import ByPartition
from chronoq.store.shard_placement import Placement
from chronoq.store.shard_queues import ShardQueues
from chronoq.store.shard_routing import REFRESH_S, SKIP_WARN_S, DueSoon, ShardRouting
from chronoq.store.sharded_schedules import RECOUNT_BATCH, ShardedSchedules

__all__ = [
    "RECOUNT_BATCH",
    "REFRESH_S",
    "SKIP_WARN_S",
    "SOLE_ENTRIES",
    "DueSoon",
    "ShardRouting",
    "ShardedSchedules",
    "ShardedStore",
]


class ShardedStore(
    Placement,
    ShardClaims,
    ShardQueues,
    ShardListings,
    ShardBulk,
    ByPartition,
    ShardHealth,
    ShardHistory,
):
    """The task store as shards (one ``Store`` per shard), routed by ``current_map()``.

    ``refresh``: makes ``current_map()`` answer the newest map (awaited after a
    ``PartitionMoved``, at most ``REFRESH_S``).

    Its parts, by how a call routes: ``shard_routing`` (the map, the fan-out core),
    ``shard_placement`` (submits), ``shard_ids`` (by task id and leases), ``shard_claims``
    (claims, queue limits), ``shard_queues`` (queue settings, on every shard),
    ``shard_partitions`` (owner statements, reads, retention),
    ``shard_listings`` (listings, counts, fences, requeue), ``shard_bulk`` (bulk operations
    by filter), ``shard_health`` (notices, probes, clocks) and ``shard_history`` (the sweep
    into the task history, its slices); ``sharded_schedules``
    holds ``ShardedSchedules``.
    """
