"""The shard map: which store shard holds each partition, with a version.

Pure, no I/O. The map lives in etcd beside the ownership keys (``docs/design/shards.md``);
every node routes a partition's statements to the shard the map names, and each shard checks
the version a write was routed under (store-side fencing of the map). Any change makes a new
map with the version one higher; a map is whole or refused: ``from_json`` answers a valid
map or raises ``ShardMapInvalid``, never a partial one.

Shards are named ``shard-0``, ``shard-1``, ...; the single store of a deployment from before
shards is ``shard-0`` holding every partition at version 1 (``single``), so it needs no data
migration. Partition lists are written as the CLI takes them: ``0-63``, ``0-15,32,40-47``.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from chronoq.buckets import MAX_PARTITIONS
from chronoq.errors import InvalidArgument
from chronoq.errors import ShardMapConflict as ShardMapConflict
from chronoq.errors import ShardMapInvalid as ShardMapInvalid

SHARD_PREFIX = "shard-"
#: Shards a map may name: far more than partitions will ever usefully spread over.
MAX_SHARDS = 1024
#: Characters of a partition list (CLI or RPC field) read at most: every partition of the
#: largest cluster written one by one would not fit; ranges always do.
MAX_PARTITION_SPEC = 16_384
#: Bytes of a serialised map read at most (etcd's request limit is 1.5 MiB). The worst map,
#: shards alternating partition by partition at ``MAX_PARTITIONS``, takes about 200 KB.
MAX_MAP_BYTES = 1 << 20
#: The version of the JSON layout ``to_json`` writes.
MAP_FORMAT = 1

_SHARD_NAME = re.compile(r"shard-(0|[1-9][0-9]{0,5})")
_ITEM = re.compile(r"([0-9]{1,6})(?:-([0-9]{1,6}))?")


def shard_name(number: int) -> str:
    """The name of shard ``number``: ``shard-0``, ``shard-1``, ..."""
    if not 0 <= number < MAX_SHARDS:
        raise ValueError(f"shard number must be in 0..{MAX_SHARDS - 1}, got {number}")
    return f"{SHARD_PREFIX}{number}"


def shard_number(name: str) -> int:
    """The number of a shard name; ``ValueError`` naming the expected form otherwise."""
    match = _SHARD_NAME.fullmatch(name) if isinstance(name, str) else None
    if match is None or int(match.group(1)) >= MAX_SHARDS:
        raise ValueError(
            f"{str(name)[:40]!r} is not a shard name (shard-0 .. shard-{MAX_SHARDS - 1})"
        )
    return int(match.group(1))


# ------------------------------------------------------------------ partition lists


def _parse(text: str, partitions: int, limit: int = MAX_PARTITION_SPEC) -> list[int]:
    """The partitions a list names, ascending; ``ValueError`` saying what to fix."""
    if len(text) > limit:
        raise ValueError(
            f"is {len(text)} characters long; the limit is {limit} "
            "(write ranges such as 0-63 instead of single partitions)"
        )
    if not text.strip():
        raise ValueError("names no partition: give some, e.g. 0-63 or 0-15,32,40-47")
    last = partitions - 1
    seen: dict[int, str] = {}
    for raw in text.split(","):
        item = raw.strip()
        if not item:
            raise ValueError(f"has an empty item between commas in {text[:60]!r}")
        match = _ITEM.fullmatch(item)
        if match is None:
            raise ValueError(
                f"{item[:40]!r} is neither a partition nor a range (write N or A-B, e.g. 0-63)"
            )
        low = int(match.group(1))
        high = int(match.group(2)) if match.group(2) is not None else low
        if high < low:
            raise ValueError(f"range {item} runs backwards: write {high}-{low}")
        if high > last:
            raise ValueError(
                f"partition {high} (in {item}) is out of range: this cluster has "
                f"{partitions} partitions, 0-{last}"
            )
        for p in range(low, high + 1):
            if p in seen:
                raise ValueError(f"partition {p} is listed twice (in {seen[p]} and {item})")
            seen[p] = item
    return sorted(seen)


def parse_partitions(text: str, partitions: int) -> tuple[int, ...]:
    """The partitions a list such as ``0-15,32,40-47`` names, ascending and each once.

    Raises ``InvalidArgument`` (field ``partitions``) for an empty list, an item that is not
    ``N`` or ``A-B``, a range that runs backwards, a partition outside ``0..partitions-1``, a
    partition listed twice, or a list longer than ``MAX_PARTITION_SPEC``.
    """
    try:
        return tuple(_parse(text, partitions))
    except ValueError as exc:
        raise InvalidArgument("partitions", str(exc)) from None


def format_partitions(partitions: Iterable[int]) -> str:
    """The shortest list ``parse_partitions`` reads back as these partitions: ``0-15,32``."""
    out: list[str] = []
    ordered = sorted(set(partitions))
    i = 0
    while i < len(ordered):
        j = i
        while j + 1 < len(ordered) and ordered[j + 1] == ordered[j] + 1:
            j += 1
        out.append(str(ordered[i]) if i == j else f"{ordered[i]}-{ordered[j]}")
        i = j + 1
    return ",".join(out)


# ------------------------------------------------------------------ the map


@dataclass(frozen=True)
class Move:
    """Partitions that go from one shard to another: the unit of an online move."""

    partitions: tuple[int, ...]
    source: str
    target: str

    def __str__(self) -> str:
        return f"{format_partitions(self.partitions)}: {self.source} -> {self.target}"


@dataclass(frozen=True)
class ShardMap:
    """Partition → shard, versioned. ``shards``: every registered shard in number order,
    those that hold nothing yet included; ``placement[p]``: the shard holding partition ``p``.

    Construction checks every rule and raises ``ShardMapInvalid``: a version >= 1, shard names
    ``shard-N`` each once and in order, 1..``MAX_PARTITIONS`` partitions, each held by a
    registered shard.
    """

    version: int
    shards: tuple[str, ...]
    placement: tuple[str, ...]

    def __post_init__(self) -> None:
        if type(self.version) is not int or self.version < 1:
            raise ShardMapInvalid(
                f"shard map: version must be an integer >= 1, not {self.version!r}"
            )
        if not 1 <= len(self.shards) <= MAX_SHARDS:
            raise ShardMapInvalid(f"shard map: must name 1..{MAX_SHARDS} shards")
        try:
            numbers = [shard_number(s) for s in self.shards]
        except ValueError as exc:
            raise ShardMapInvalid(f"shard map: {exc}") from None
        if numbers != sorted(set(numbers)):
            raise ShardMapInvalid("shard map: shards must be listed once each, by number")
        if not 1 <= len(self.placement) <= MAX_PARTITIONS:
            raise ShardMapInvalid(f"shard map: must place 1..{MAX_PARTITIONS} partitions")
        known = set(self.shards)
        for p, shard in enumerate(self.placement):
            if shard not in known:
                raise ShardMapInvalid(
                    f"shard map: partition {p} is on {str(shard)[:40]!r}, which is not a "
                    "registered shard"
                )

    @property
    def partitions(self) -> int:
        return len(self.placement)

    def shard_of(self, partition: int) -> str:
        return self.placement[partition]

    def held_by(self, shard: str) -> tuple[int, ...]:
        """The partitions ``shard`` holds, ascending (none for an unknown shard)."""
        return tuple(p for p, s in enumerate(self.placement) if s == shard)

    def sizes(self) -> dict[str, int]:
        """Partitions held per registered shard, in shard order (zeros included)."""
        out = dict.fromkeys(self.shards, 0)
        for s in self.placement:
            out[s] += 1
        return out

    def next_shard(self) -> str:
        """The name ``with_shard`` gives the next shard registered."""
        return shard_name(shard_number(self.shards[-1]) + 1)

    def with_shard(self) -> ShardMap:
        """The map with one more (empty) shard registered, named ``next_shard()``."""
        if len(self.shards) >= MAX_SHARDS:
            raise InvalidArgument("shard", f"a cluster has at most {MAX_SHARDS} shards")
        return ShardMap(self.version + 1, (*self.shards, self.next_shard()), self.placement)

    def check_shard(self, shard: str) -> str:
        """``shard`` if registered; ``InvalidArgument`` listing the registered ones."""
        if shard not in self.shards:
            listed = ", ".join(self.shards[:8]) + (", ..." if len(self.shards) > 8 else "")
            raise InvalidArgument("shard", f"no shard named {str(shard)[:40]!r} (known: {listed})")
        return shard

    def plan_move(self, partitions: Iterable[int], target: str) -> tuple[Move, ...]:
        """The moves (one per source shard, in shard order) that bring ``partitions`` to
        ``target``; those already there are left out. ``InvalidArgument`` for an unknown
        target, a partition out of range, or nothing to move."""
        self.check_shard(target)
        wanted = sorted(set(partitions))
        for p in wanted:
            if not 0 <= p < self.partitions:
                raise InvalidArgument(
                    "partitions", f"partition {p} is out of range: 0-{self.partitions - 1}"
                )
        by_source: dict[str, list[int]] = {}
        for p in wanted:
            if self.placement[p] != target:
                by_source.setdefault(self.placement[p], []).append(p)
        if not by_source:
            listed = format_partitions(wanted) or "no partition"
            raise InvalidArgument("partitions", f"{listed} on {target} already: nothing to move")
        return tuple(Move(tuple(by_source[s]), s, target) for s in self.shards if s in by_source)

    def moved(self, move: Move) -> ShardMap:
        """The map after ``move``, one version up. ``ShardMapConflict`` when the map no longer
        matches the move (a partition not on its source, an unknown shard)."""
        for shard in (move.source, move.target):
            if shard not in self.shards:
                raise ShardMapConflict(
                    f"shard map version {self.version} has no {shard}: plan the move again"
                )
        if not move.partitions or move.source == move.target:
            raise ShardMapConflict(f"move {move} changes nothing")
        placement = list(self.placement)
        for p in move.partitions:
            if not 0 <= p < self.partitions or placement[p] != move.source:
                where = placement[p] if 0 <= p < self.partitions else "no shard"
                raise ShardMapConflict(
                    f"shard map version {self.version}: partition {p} is on {where}, not "
                    f"{move.source}: plan the move again"
                )
            placement[p] = move.target
        return ShardMap(self.version + 1, self.shards, tuple(placement))

    def plan_rebalance(self) -> tuple[Move, ...]:
        """Moves that even out the partitions held per shard, moving the fewest.

        After the plan every two shards differ by at most one partition. Each shard's quota
        is ``P // S`` or one more; the ``P % S`` shards holding most get the larger quota
        (ties: the lower number), which minimises what must move. Only shards above their
        quota give, each its highest-numbered partitions; shards below it take them in shard
        order, so a target receives contiguous runs. Deterministic: the same map gives the
        same plan on every node.
        """
        sizes = self.sizes()
        base, extra = divmod(self.partitions, len(self.shards))
        ranked = sorted(self.shards, key=lambda s: (-sizes[s], shard_number(s)))
        quota = {s: base + (1 if i < extra else 0) for i, s in enumerate(ranked)}
        giving: list[tuple[str, int]] = []
        for s in self.shards:
            surplus = sizes[s] - quota[s]
            if surplus > 0:
                held = self.held_by(s)
                giving += [(s, p) for p in held[len(held) - surplus :]]
        moves: dict[tuple[str, str], list[int]] = {}
        i = 0
        for target in self.shards:
            for _ in range(quota[target] - sizes[target]):
                source, p = giving[i]
                moves.setdefault((source, target), []).append(p)
                i += 1
        return tuple(Move(tuple(ps), s, t) for (s, t), ps in moves.items())

    def moved_all(self, moves: Sequence[Move]) -> ShardMap:
        """The map after ``moves`` in order, one version up per move."""
        out = self
        for move in moves:
            out = out.moved(move)
        return out

    # -------------------------------------------------------------- etcd form

    def to_json(self) -> str:
        """The map as etcd stores it: each shard with its partitions as a list, e.g.
        ``{"format": 1, "version": 2, "partitions": 256, "shards": {"shard-0": "0-255",
        "shard-1": ""}}``."""
        held: dict[str, list[int]] = {s: [] for s in self.shards}
        for p, s in enumerate(self.placement):
            held[s].append(p)
        return json.dumps(
            {
                "format": MAP_FORMAT,
                "version": self.version,
                "partitions": self.partitions,
                "shards": {s: format_partitions(ps) for s, ps in held.items()},
            },
            separators=(",", ":"),
        )

    @classmethod
    def from_json(cls, data: str | bytes) -> ShardMap:
        """A map read back from ``to_json``'s form; ``ShardMapInvalid`` naming the fault for
        anything else (too large, not JSON, a duplicate key, an unknown format, a partition
        held twice or by no shard), so a corrupt map is never half applied."""
        if len(data) > MAX_MAP_BYTES:
            raise ShardMapInvalid(f"shard map: {len(data)} bytes, more than {MAX_MAP_BYTES}")
        try:
            doc = json.loads(data, object_pairs_hook=_no_duplicates)
        except (ValueError, UnicodeDecodeError, RecursionError) as exc:
            raise ShardMapInvalid(f"shard map: not valid JSON ({str(exc)[:80]})") from None
        if not isinstance(doc, dict) or set(doc) != {"format", "version", "partitions", "shards"}:
            raise ShardMapInvalid(
                "shard map: must be an object with exactly format, version, partitions, shards"
            )
        if doc["format"] != MAP_FORMAT or type(doc["format"]) is not int:
            raise ShardMapInvalid(
                f"shard map: format {str(doc['format'])[:20]} is unknown to this version "
                f"(it reads {MAP_FORMAT}): upgrade the node"
            )
        partitions, held = doc["partitions"], doc["shards"]
        if type(partitions) is not int or not 1 <= partitions <= MAX_PARTITIONS:
            raise ShardMapInvalid(f"shard map: partitions must be in 1..{MAX_PARTITIONS}")
        if not isinstance(held, dict) or not all(isinstance(v, str) for v in held.values()):
            raise ShardMapInvalid("shard map: shards must map each name to its partition list")
        try:
            shards = tuple(sorted(held, key=shard_number))
        except ValueError as exc:
            raise ShardMapInvalid(f"shard map: {exc}") from None
        return cls(doc["version"], shards, _placement(shards, held, partitions))


def single(partitions: int) -> ShardMap:
    """The map of one store: ``shard-0`` holds every partition, version 1 (a deployment
    from before shards is exactly this, with no migration)."""
    return ShardMap(1, (shard_name(0),), (shard_name(0),) * partitions)


def registered(partitions: int, shards: int) -> ShardMap:
    """Version 1 with ``shards`` registered and ``shard-0`` holding every partition: the first
    map of a store that already has rows on ``shard-0`` (an upgrade), which only moves may
    spread (``chronoq store rebalance``)."""
    return ShardMap(1, tuple(shard_name(n) for n in range(shards)), (shard_name(0),) * partitions)


def even(partitions: int, shards: int) -> ShardMap:
    """Version 1 of a cluster created with ``shards`` shards: contiguous ranges, the first
    ``partitions % shards`` shards one partition larger (``shard-0`` first)."""
    if not 1 <= shards <= min(partitions, MAX_SHARDS):
        raise ShardMapInvalid(
            f"shard map: {shards} shards cannot split {partitions} partitions (1..{partitions})"
        )
    names = tuple(shard_name(n) for n in range(shards))
    base, extra = divmod(partitions, shards)
    placement: list[str] = []
    for n, name in enumerate(names):
        placement += [name] * (base + (1 if n < extra else 0))
    return ShardMap(1, names, tuple(placement))


def _placement(shards: Sequence[str], held: Mapping[str, str], partitions: int) -> tuple[str, ...]:
    """Each partition's shard from each shard's partition list: every partition exactly once."""
    placement: list[str | None] = [None] * partitions
    for shard in shards:
        if not held[shard].strip():
            continue  # registered, holds nothing yet
        try:
            ps = _parse(held[shard], partitions, MAX_MAP_BYTES)
        except ValueError as exc:
            raise ShardMapInvalid(f"shard map: {shard}'s partitions {exc}") from None
        for p in ps:
            if placement[p] is not None:
                raise ShardMapInvalid(
                    f"shard map: partition {p} is held by {placement[p]} and {shard}"
                )
            placement[p] = shard
    missing = [p for p, s in enumerate(placement) if s is None]
    if missing:
        raise ShardMapInvalid(
            f"shard map: no shard holds partitions {format_partitions(missing)[:80]}"
        )
    return tuple(s for s in placement if s is not None)


def _no_duplicates(pairs: list[tuple[str, Any]]) -> Mapping[str, Any]:
    """A JSON object's members, refusing a key given twice (``json`` keeps the last)."""
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise ValueError(f"key {key[:40]!r} appears twice")
        out[key] = value
    return out
