"""The fault plan: the kinds of fault, how long each holds, and a seeded, replayable schedule.

Pure: no I/O. ``schedule`` lays the chosen kinds out over the run, one fault at a time with
quiet gaps in between (Jepsen's nemesis style, so every extra execution can be traced to one
fault): the same seed gives the same kinds, instants, holds and target picks. Targets are
picked from the pick number at injection time (``chronoq.chaos.faults.Injector`` plays it).
"""

from __future__ import annotations

import enum
import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass


class FaultKind(enum.StrEnum):
    KILL_NODE = "kill-node"  # SIGKILL a node, start it again after the hold
    FREEZE_NODE = "freeze-node"  # SIGSTOP a node for half its lease TTL: it keeps its lease
    FREEZE_NODE_PAST_TTL = "freeze-node-past-ttl"  # SIGSTOP past the lease TTL, then SIGCONT
    KILL_WORKER = "kill-worker"  # SIGKILL a worker with a handler running
    PAUSE_WORKER = "pause-worker"  # SIGSTOP a worker mid-task past the task lease
    KILL_ETCD_MEMBER = "kill-etcd-member"  # SIGKILL a follower, restart it
    KILL_ETCD_LEADER = "kill-etcd-leader"  # SIGKILL the raft leader, restart it
    RESTART_POSTGRES = "restart-postgres"  # crash (SIGKILL) or clean stop, then start
    CUT_NODE_ETCD = "cut-node-etcd"  # blackhole one node's etcd traffic
    CUT_NODE_POSTGRES = "cut-node-postgres"  # blackhole one node's PostgreSQL traffic
    CLOCK_JUMP = "clock-jump"  # restart one node with its clock ahead or behind
    ROLLING_RESTART = "rolling-restart"  # graceful restart of every node, one by one
    DISK_FULL = "disk-full"  # fill PostgreSQL's (size-capped) filesystem, hold, free it
    SLOW_LINKS_ETCD = "slow-links-etcd"  # every node's etcd links slow and lossy
    SLOW_LINKS_POSTGRES = "slow-links-postgres"  # every node's PostgreSQL links slow and lossy
    CLOCK_DRIFT = "clock-drift"  # one node's clock drifts away and back, without a restart
    # A replicated store (--pg-members > 1, PostgreSQL members under Patroni):
    KILL_PG_PRIMARY = "kill-pg-primary"  # SIGKILL the primary's postmaster; Patroni restarts it
    KILL_PG_MEMBER = "kill-pg-member"  # SIGKILL the primary's Patroni and postgres; restart later
    SWITCHOVER = "switchover"  # graceful switchover to the synchronous standby
    KILL_PG_STANDBY = "kill-pg-standby"  # SIGKILL the synchronous standby whole; restart later
    # Store shards (--store-shards > 1):
    KILL_SHARD_PRIMARY = "kill-shard-primary"  # SIGKILL one shard's postmaster; it comes back
    # A move of random partitions between two shards (variant kill-node: its driver is
    # SIGKILLed mid-move and started again after its lease):
    MOVE_PARTITIONS = "move-partitions"


#: Faults of a replicated store: in ``all`` only when the store is one (they replace
#: restart-postgres there, which needs a single server).
STORE_HA_KINDS = (
    FaultKind.KILL_PG_PRIMARY,
    FaultKind.KILL_PG_MEMBER,
    FaultKind.SWITCHOVER,
    FaultKind.KILL_PG_STANDBY,
)
#: Faults of a store of several shards: in ``all`` only when the store has them.
SHARD_KINDS = (FaultKind.KILL_SHARD_PRIMARY, FaultKind.MOVE_PARTITIONS)
ALL_KINDS = tuple(k for k in FaultKind if k not in STORE_HA_KINDS and k not in SHARD_KINDS)
#: Faults that need the single embedded PostgreSQL (its process or its filesystem).
SINGLE_STORE_KINDS = (FaultKind.RESTART_POSTGRES, FaultKind.DISK_FULL)
#: Former names, still accepted on the command line (histories keep the name they ran with).
ALIASES = {"pause-node": FaultKind.FREEZE_NODE_PAST_TTL}
#: A freeze shorter than the lease TTL, as a fraction of it: keepalives go every third of the
#: TTL, so the lease outlives the pause wherever in that cycle it falls.
FREEZE_UNDER_TTL = 0.5

# Seconds a fault costs beyond its hold (restarts, waiting for a task in flight).
OVERHEAD: dict[FaultKind, float] = {
    FaultKind.KILL_NODE: 3.0, FaultKind.FREEZE_NODE: 0.5, FaultKind.FREEZE_NODE_PAST_TTL: 0.5,
    FaultKind.KILL_WORKER: 2.0,
    FaultKind.PAUSE_WORKER: 1.0, FaultKind.KILL_ETCD_MEMBER: 2.0,
    FaultKind.KILL_ETCD_LEADER: 2.0, FaultKind.RESTART_POSTGRES: 3.0,
    FaultKind.CUT_NODE_ETCD: 0.5, FaultKind.CUT_NODE_POSTGRES: 0.5,
    FaultKind.CLOCK_JUMP: 6.0, FaultKind.ROLLING_RESTART: 9.0,
    FaultKind.DISK_FULL: 3.0,  # freeing the space, maybe a PostgreSQL start
    FaultKind.SLOW_LINKS_ETCD: 1.0, FaultKind.SLOW_LINKS_POSTGRES: 1.0,  # delayed bytes land
    FaultKind.CLOCK_DRIFT: 3.0,  # the node measures its clock right again and rejoins
    # Patroni: crash recovery (2-10 s), a member's restart from its data (10-30 s), a
    # switchover (4-20 s), as seen on a loaded 2-core machine; then the nodes rejoin.
    FaultKind.KILL_PG_PRIMARY: 15.0, FaultKind.KILL_PG_MEMBER: 35.0,
    FaultKind.SWITCHOVER: 20.0, FaultKind.KILL_PG_STANDBY: 30.0,
    # A single shard's crash recovery (1-3 s), or its Patroni's restart of the postmaster.
    FaultKind.KILL_SHARD_PRIMARY: 10.0,
    FaultKind.MOVE_PARTITIONS: 3.0,  # the status polls; a killed driver's restart
}
#: Patroni's leader key TTL (chronoq.embedded.ha.config.TTL_S): a lost primary is replaced
#: after it, so a member kill is held past it to force the failover.
PATRONI_TTL_S = 20.0


def default_holds(lease_ttl: float, lease_timeout: float) -> dict[FaultKind, float]:
    """How long each fault lasts: past the node lease for node faults, past the task lease
    for worker pauses, so that each one forces the takeover it is meant to test."""
    return {
        FaultKind.KILL_NODE: lease_ttl + 2.0,
        FaultKind.FREEZE_NODE: FREEZE_UNDER_TTL * lease_ttl,
        FaultKind.FREEZE_NODE_PAST_TTL: lease_ttl + 1.5,
        FaultKind.KILL_WORKER: 1.0,
        FaultKind.PAUSE_WORKER: lease_timeout + 2.0,
        FaultKind.KILL_ETCD_MEMBER: 4.0,
        FaultKind.KILL_ETCD_LEADER: 4.0,
        FaultKind.RESTART_POSTGRES: 1.0,
        FaultKind.CUT_NODE_ETCD: lease_ttl + 2.0,
        FaultKind.CUT_NODE_POSTGRES: lease_ttl + 2.0,
        FaultKind.CLOCK_JUMP: 6.0,
        FaultKind.ROLLING_RESTART: 0.0,
        FaultKind.DISK_FULL: 8.0,
        FaultKind.SLOW_LINKS_ETCD: 12.0,
        FaultKind.SLOW_LINKS_POSTGRES: 12.0,
        FaultKind.CLOCK_DRIFT: 30.0,  # 20 s away at 50 ms/s, 10 s back
        FaultKind.KILL_PG_PRIMARY: 0.0,  # Patroni restarts it at once
        FaultKind.KILL_PG_MEMBER: PATRONI_TTL_S + 2.0,
        FaultKind.SWITCHOVER: 0.0,
        FaultKind.KILL_PG_STANDBY: 4.0,
        FaultKind.KILL_SHARD_PRIMARY: 3.0,  # down that long, then started again
        FaultKind.MOVE_PARTITIONS: 30.0,  # at most: the move is followed until it ends
    }


def parse_kinds(
    text: str, *, replicated: bool = False, sharded: bool = False
) -> list[FaultKind]:
    """``kill-node,freeze-node`` (or ``all``) as fault kinds; ValueError names a bad one.

    ``replicated``: the store is PostgreSQL under Patroni; ``all`` then has its faults in
    place of those of a single server. ``sharded``: several store shards; ``all`` has the
    shard faults too."""
    if text.strip() == "all":
        shard = list(SHARD_KINDS) if sharded else []
        if replicated:
            single = [k for k in ALL_KINDS if k not in SINGLE_STORE_KINDS]
            return [*single, *STORE_HA_KINDS, *shard]
        return [*ALL_KINDS, *shard]
    kinds = []
    for name in (n.strip() for n in text.split(",") if n.strip()):
        if name in ALIASES:
            kinds.append(ALIASES[name])
            continue
        try:
            kinds.append(FaultKind(name))
        except ValueError:
            known = ", ".join(k.value for k in FaultKind)
            raise ValueError(f"unknown fault {name!r}; known: {known}, or all") from None
    return kinds


@dataclass(frozen=True)
class PlannedFault:
    at: float  # seconds from the start of the run
    kind: FaultKind
    pick: int  # chooses the target among the candidates at injection time
    hold: float
    variant: str = ""  # restart-postgres: crash|clean; clock-jump, clock-drift: +|-;
    # move-partitions: "" or kill-node


def schedule(
    kinds: Sequence[FaultKind],
    duration: float,
    seed: int,
    holds: Mapping[FaultKind, float],
    *,
    first_at: float = 4.0,
    gap: tuple[float, float] = (2.0, 4.0),
    tail: float = 3.0,
) -> list[PlannedFault]:
    """Faults back to back with quiet gaps, each kind once (in a seeded order) before any
    repeats, until the next one would not end ``tail`` seconds before ``duration``."""
    if not kinds:
        return []
    rng = random.Random(seed)
    order = list(dict.fromkeys(kinds))
    rng.shuffle(order)
    out: list[PlannedFault] = []
    at = first_at
    for i in range(10_000):  # bounded: every step moves ``at`` forward
        kind = order[i] if i < len(order) else rng.choice(order)
        hold = holds[kind]
        if at + hold + OVERHEAD[kind] > duration - tail:
            if i < len(order):
                continue  # a long one does not fit: maybe a shorter one does
            break
        variant = ""
        if kind is FaultKind.RESTART_POSTGRES:
            variant = rng.choice(["crash", "clean"])
        elif kind in (FaultKind.CLOCK_JUMP, FaultKind.CLOCK_DRIFT):
            variant = rng.choice(["+", "-"])
        elif kind is FaultKind.MOVE_PARTITIONS:
            variant = rng.choice(["", "kill-node"])
        out.append(PlannedFault(round(at, 3), kind, rng.randrange(1 << 30), hold, variant))
        at += hold + OVERHEAD[kind] + rng.uniform(*gap)
    return out
