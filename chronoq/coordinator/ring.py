"""Partition assignment: consistent hashing with bounded loads.

Pure: no I/O, no clock, no randomness. Every node runs ``assign`` on the same membership
revision and the same loads and must reach the same owner map without talking to the others,
so the result depends only on the arguments (never on their order, on ``PYTHONHASHSEED`` or on
the interpreter) and is pinned by tests, since nodes of two releases share a cluster during a
rolling upgrade.

Algorithm (Mirrokni, Thorup, Zadimoghaddam, "Consistent Hashing with Bounded Loads", 2016; the
variant used by Vimeo and HAProxy): each member sits on a hash ring at ``vnodes`` points, each
partition hashes to a point and walks clockwise to the first member that can take it without
going above ``capacity``. Plain consistent hashing moves only ~1/N of the partitions when a
member joins or leaves; the capacity bound keeps a hot member from drowning, at the price of a
few extra moves (a *cascade*) when a member's fill changes.

A partition's weight is ``1 + loads.get(partition, 0)``: the base weight of 1 stands for the
fixed cost of owning a partition (watching its key, polling its buckets, reaping its leases), so
idle partitions still spread evenly, and a cluster with no due work behaves like unit loads.

Guarantee, with ``mean = total weight / len(members)`` and ``cap = capacity(...)``: every
member's load is at most ``max(cap, mean + (1 - 1/len(members)) * heaviest weight)``. So with
unit loads (or whenever ``(1 - 1/N) * heaviest <= cap - mean``, e.g. no partition heavier than
``epsilon * mean``) no member is above ``cap``. A member ends above ``cap`` only through a
partition that fitted on no member; that partition goes to the least-loaded member, never
dropped.
"""

from __future__ import annotations

import bisect
import hashlib
import math
from collections.abc import Iterator, Mapping, Sequence

DEFAULT_EPSILON = 0.25
DEFAULT_VNODES = 64
BASE_WEIGHT = 1.0
"""Weight every partition carries on top of its due work (see the module docstring)."""


def stable_hash(key: str | bytes) -> int:
    """Ring position of ``key``: the first 8 bytes of BLAKE2b, big-endian.

    Never Python's ``hash()``: it is salted per process, and every node must agree.
    """
    data = key.encode() if isinstance(key, str) else key
    return int.from_bytes(hashlib.blake2b(data, digest_size=8).digest(), "big")


def capacity(total_load: float, members: int, epsilon: float) -> float:
    """Most load one member may take: ``ceil((1 + epsilon) * total_load / members)``.

    The ceiling guarantees ``members * capacity >= total_load``, so with unit weights a member
    with room always exists. Float noise just above an integer is dropped first
    (``1.1 * 10 == 11.000000000000002`` must give 11, not 12), but never below the mean.
    """
    if members < 1:
        raise ValueError("members must be >= 1")
    if epsilon < 0 or not math.isfinite(epsilon):
        raise ValueError("epsilon must be finite and >= 0")
    if total_load < 0 or not math.isfinite(total_load):
        raise ValueError("total_load must be finite and >= 0")
    mean = total_load / members
    raw = (1.0 + epsilon) * mean
    cap = math.ceil(raw)
    if cap - raw > 1.0 - 1e-9 * max(1.0, raw):
        cap -= 1
    return float(max(cap, math.ceil(mean)))


def assign(
    partitions: int | Sequence[int],
    members: Sequence[str],
    loads: Mapping[int, float] | None = None,
    *,
    epsilon: float = DEFAULT_EPSILON,
    vnodes: int = DEFAULT_VNODES,
) -> dict[int, str]:
    """Owner of each partition: consistent hashing with bounded loads.

    Args:
        partitions: a count ``P`` (partitions ``0..P-1``) or the partition numbers themselves.
        members: member ids; order and duplicates do not matter.
        loads: due work per partition; missing partitions count 0, keys that are not among
            ``partitions`` are ignored. ``None`` means unit weights.
        epsilon: slack over the mean load; a huge value gives plain consistent hashing.
        vnodes: ring points per member; more points, smoother spread, slower ring build.

    Returns:
        ``{partition: member}`` covering every partition, or ``{}`` when there are no members.

    Partitions are placed heaviest first, then by number: a fixed order makes the map a pure
    function of the inputs, and heavy ones first pack best (they find room while it exists).
    """
    if vnodes < 1:
        raise ValueError("vnodes must be >= 1")
    numbers = _partition_numbers(partitions)
    names = sorted(set(members))
    if not names or not numbers:
        return {}
    weights = {p: _weight(p, loads) for p in numbers}
    cap = capacity(math.fsum(weights.values()), len(names), epsilon)
    ring = _Ring(names, vnodes)
    filled = dict.fromkeys(names, 0.0)
    owners: dict[int, str] = {}
    for p in sorted(numbers, key=lambda p: (-weights[p], p)):
        owner = _place(ring.walk(_partition_key(p)), filled, weights[p], cap)
        filled[owner] += weights[p]
        owners[p] = owner
    return dict(sorted(owners.items()))


def member_loads(
    assignment: Mapping[int, str], loads: Mapping[int, float] | None
) -> dict[str, float]:
    """Load per member under ``assignment``, weighted as ``assign`` weighs partitions.

    Members that own nothing are absent: the map does not know them.
    """
    totals: dict[str, list[float]] = {}
    for p, member in assignment.items():
        totals.setdefault(member, []).append(_weight(p, loads))
    return {member: math.fsum(ws) for member, ws in sorted(totals.items())}


def moved(before: Mapping[int, str], after: Mapping[int, str]) -> set[int]:
    """Partitions whose owner changed, including ones present in only one map.

    These are the handoffs a rebalance costs: each means a stop, a key delete and a backfill.
    """
    return {p for p in before.keys() | after.keys() if before.get(p) != after.get(p)}


def _place(candidates: list[str], filled: Mapping[str, float], weight: float, cap: float) -> str:
    """First member clockwise with room; else the least loaded, ties going to ring order."""
    for member in candidates:
        if filled[member] + weight <= cap:
            return member
    # min() keeps the first of equals, so ties resolve clockwise, deterministically.
    return min(candidates, key=filled.__getitem__)


class _Ring:
    """Sorted virtual points of the members; ``walk`` lists members clockwise from a key."""

    def __init__(self, members: Sequence[str], vnodes: int) -> None:
        # Ties between points (astronomically rare) break by member id, keeping it pure.
        points = sorted(
            (stable_hash(f"{member}/{i}"), member) for member in members for i in range(vnodes)
        )
        self._positions = [pos for pos, _ in points]
        self._owners = [member for _, member in points]
        self._count = len(set(members))

    def walk(self, key: str) -> list[str]:
        """Distinct members in clockwise order from ``key``'s position (wrapping around)."""
        seen: dict[str, None] = {}
        for member in self._clockwise(bisect.bisect_left(self._positions, stable_hash(key))):
            seen.setdefault(member)
            if len(seen) == self._count:
                break
        return list(seen)

    def _clockwise(self, start: int) -> Iterator[str]:
        n = len(self._owners)
        for i in range(n):
            yield self._owners[(start + i) % n]


def _partition_numbers(partitions: int | Sequence[int]) -> list[int]:
    if isinstance(partitions, int):
        if partitions < 0:
            raise ValueError("partitions must be >= 0")
        return list(range(partitions))
    return sorted(set(partitions))


def _partition_key(partition: int) -> str:
    return f"partition/{partition}"


def _weight(partition: int, loads: Mapping[int, float] | None) -> float:
    load = 0.0 if loads is None else float(loads.get(partition, 0.0))
    if load < 0 or not math.isfinite(load):
        raise ValueError(f"load of partition {partition} must be finite and >= 0, got {load}")
    return BASE_WEIGHT + load
