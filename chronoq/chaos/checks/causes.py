"""Fault kinds grouped by what they may cause (a failover, a duplicate, a stop of the store)."""

from __future__ import annotations

# Fault kinds by what they may cause ("pause-node": the former name of freeze-node-past-ttl).
NODE_FREEZES = frozenset({"freeze-node", "freeze-node-past-ttl", "pause-node"})
FAILOVER = frozenset({"kill-node", "cut-node-etcd", "cut-node-postgres"}) | NODE_FREEZES
# Faults after which workers must keep starting tasks: the other nodes still fire.
EXEC_GAP_BOUNDED = frozenset({"kill-node"}) | NODE_FREEZES
GRACEFUL = frozenset({"clock-jump", "rolling-restart", "clock-drift"})
# A replicated store's faults (chronoq.embedded.ha): like restart-postgres, nobody can take
# over while the store fails over, and an ack that did not reach it may repeat a task.
STORE_FAILOVER = frozenset({"kill-pg-primary", "kill-pg-member", "switchover", "kill-pg-standby"})
# One store shard's postmaster killed: its partitions stop until it is back (nobody can take
# them over), an ack that did not reach it may repeat a task; the other shards' partitions
# keep firing (``shard_outages`` reports how late they fired during the outage).
SHARD_OUTAGE = frozenset({"kill-shard-primary"})
# A move of partitions between shards: writes of the moving partitions are refused while a
# group is frozen (an ack or a heartbeat refused past its retries lets a lease expire), and
# its variant kill-node kills the move's driver node.
SHARD_MOVE = frozenset({"move-partitions"})
# A full disk under PostgreSQL: writes fail until space returns; nobody can take over.
INFRA = frozenset({"restart-postgres", "kill-etcd-member", "kill-etcd-leader", "disk-full"}) \
    | STORE_FAILOVER | SHARD_OUTAGE
WORKER = frozenset({"kill-worker", "pause-worker"})
# Every node's links slow and lossy (target "all nodes"): a reset PostgreSQL connection
# loses a heartbeat or the answer to a commit, as a restart does; etcd links explain none.
SLOW_STORE_LINKS = frozenset({"slow-links-postgres"})
# Faults that can make a task run twice without targeting its worker: a heartbeat or an
# acknowledgement that did not reach the store, so the lease expired.
DUPLICATE_CAUSES = FAILOVER | GRACEFUL | frozenset({"restart-postgres", "disk-full"}) \
    | STORE_FAILOVER | SLOW_STORE_LINKS | SHARD_OUTAGE | SHARD_MOVE
#: ``fired_by`` of rows no owner fired (a submit due at once, a retry, a requeue).
NOT_OWNER = frozenset({"submit", "retry", "requeue"})
