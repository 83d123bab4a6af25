"""Where a task lives: the partition of a submit, and task ids that carry their partition.

Pure, no I/O. With the store in shards (``chronoq.shardmap``), a partition decides the shard,
so two things must hold:

- **A keyed submit always lands in the same partition.** The partition of a task with a
  routing key is a hash of its namespace and that key (``key_partition``): a repeated
  idempotent submit reaches the same partition, so the same shard, whose unique index on
  (namespace, idempotency_key) decides alone. ``submit_partition`` takes the keys in order of
  precedence and uses the first present (``spec_routing_key``: the concurrency key, the
  unique key, the debounce key, the idempotency key); a task without one gets a uniformly
  drawn partition.
- **A task id names its partition.** ``GetTask``, ``CancelTask``, heartbeats, completes and
  requeues reach one shard without a lookup: ``id_partition`` reads the partition off the id.

The id layout. Ids so far are RFC 9562 version 7 (``chronoq.ids``; v4 before that), whose
partition is a BLAKE2b hash of all 16 bytes (``chronoq.buckets.partition_of``). New ids are
version 8 (the RFC's layout for application-defined ids), which no id minted before has, so
the version nibble is an exact marker: no old id can be misread as new, and nothing is
rewritten. Bytes of a new id::

    0-5   unix time in ms (big-endian)   as v7: ids stay time-ordered, and old and new
                                         ids of the same moment sort side by side
    6     0x81: version 8, layout 1      the layout nibble leaves room for another format
    7     random (8 bits)
    8     variant 0b10, random (6 bits)
    9-10  the partition (big-endian u16) P <= 2**16; chronoq's limit is 32767
    11-15 random (40 bits)

That leaves 54 random bits per (millisecond, partition): ids stay unguessable (a by-id call
also needs the task's namespace) and unique (two ids collide only when one partition mints
both in the same millisecond with the same 54 bits; the primary key refuses it). SQL can
read the same fields: ``get_byte(uuid_send(id), 6) = 129`` marks a new id, and
``get_byte(uuid_send(id), 9) * 256 + get_byte(uuid_send(id), 10)`` is its partition.

Both hashes are part of the data format: changing either moves stored tasks out from under
their keys and ids (``tests/unit/test_routing.py`` pins known values).
"""

from __future__ import annotations

import hashlib
import os
import uuid
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING

from chronoq.buckets import partitions_of
from chronoq.errors import InvalidArgument

if TYPE_CHECKING:
    from chronoq.models import TaskSpec

#: Byte 6 of a new id: version 8 in the high nibble, layout 1 in the low one.
LAYOUT_BYTE = 0x81
#: The most partitions an id can carry (two bytes).
MAX_ID_PARTITIONS = 1 << 16
_VARIANT = 0x80
_STAMP = (1 << 48) - 1
#: Domain of the routing-key hash: no other hash of chronoq's shares its outputs.
_PERSON = b"chronoq.route.1"


def key_partition(namespace: str, key: str, partitions: int) -> int:
    """The partition of a routing key of ``namespace``: BLAKE2b-64 (personalised) of the
    length-prefixed namespace and the key, modulo ``partitions``. Stable across processes,
    nodes and versions."""
    _check_partitions(partitions)
    ns = namespace.encode()
    digest = hashlib.blake2b(
        len(ns).to_bytes(4, "big") + ns + key.encode(), digest_size=8, person=_PERSON
    ).digest()
    return int.from_bytes(digest, "big") % partitions


def routing_key(keys: Iterable[str | None]) -> str | None:
    """The first key present (neither None nor empty: the wire's empty string is "none")."""
    for key in keys:
        if key:
            return key
    return None


def spec_routing_key(spec: TaskSpec) -> str | None:
    """A spec's placement key, in order of precedence: its concurrency key (so one statement
    counts a key's running tasks), else its unique key, else its debounce key (so one
    statement finds a key's pending task), else its idempotency key. A spec with a
    concurrency key and a unique or debounce key is placed by the concurrency key: its
    uniqueness holds among the tasks placed alike."""
    return routing_key(
        (spec.concurrency_key, spec.unique_key, spec.debounce_key, spec.idempotency_key)
    )


def spec_routes(specs: Iterable[TaskSpec]) -> list[tuple[str, str | None]]:
    """(namespace, routing key) of each spec, as ``submit_partitions`` takes them."""
    return [
        (
            s.namespace,
            s.concurrency_key or s.unique_key or s.debounce_key or s.idempotency_key or None,
        )
        for s in specs
    ]


def submit_partition(
    namespace: str, keys: Iterable[str | None], partitions: int, draw: bytes | None = None
) -> int:
    """The partition of a new task: that of its first present routing key, else drawn at
    random (``draw``: 4 random bytes, from ``os.urandom`` when not given)."""
    key = routing_key(keys)
    if key is not None:
        return key_partition(namespace, key, partitions)
    _check_partitions(partitions)
    raw = os.urandom(4) if draw is None else draw
    return int.from_bytes(raw[:4], "big") % partitions


def submit_partitions(routes: Sequence[tuple[str, str | None]], partitions: int) -> list[int]:
    """``submit_partition`` of many new tasks, each given as (namespace, its first present
    routing key or None): the count checked once, each namespace's prefix built once, and
    the draws of keyless tasks read from the system's randomness in one go."""
    _check_partitions(partitions)
    raw = os.urandom(4 * sum(1 for _ns, key in routes if not key))
    # A hash state per namespace that has absorbed its prefix: copying it is cheaper than
    # keying a new one per task (this runs for every task of every submit).
    started: dict[str, hashlib.blake2b] = {}
    out = []
    drawn = 0
    for namespace, key in routes:
        if key:
            base = started.get(namespace)
            if base is None:
                ns = namespace.encode()
                base = started[namespace] = hashlib.blake2b(
                    len(ns).to_bytes(4, "big") + ns, digest_size=8, person=_PERSON
                )
            h = base.copy()
            h.update(key.encode())
            out.append(int.from_bytes(h.digest(), "big") % partitions)
        else:
            out.append(int.from_bytes(raw[drawn : drawn + 4], "big") % partitions)
            drawn += 4
    return out


def new_task_id_bytes(partitions: Sequence[int], unix_ms: int) -> list[bytes]:
    """One new id (16 bytes, layout above) per partition given, for ``unix_ms``, from one
    read of the system's randomness."""
    if not partitions:
        return []
    for p in (min(partitions), max(partitions)):
        if not 0 <= p < MAX_ID_PARTITIONS:
            raise ValueError(f"partition {p} does not fit in an id (0..{MAX_ID_PARTITIONS - 1})")
    head = (unix_ms & _STAMP).to_bytes(6, "big") + bytes((LAYOUT_BYTE,))
    raw = os.urandom(7 * len(partitions))
    return [
        head
        + raw[i : i + 1]
        + bytes((_VARIANT | (raw[i + 1] & 0x3F), p >> 8, p & 0xFF))
        + raw[i + 2 : i + 7]
        for i, p in zip(range(0, 7 * len(partitions), 7), partitions, strict=True)
    ]


def new_task_ids(partitions: Sequence[int], unix_ms: int) -> list[uuid.UUID]:
    """``new_task_id_bytes`` as UUIDs."""
    return [uuid.UUID(bytes=b) for b in new_task_id_bytes(partitions, unix_ms)]


def carries_partition(task_id: bytes) -> bool:
    """Whether an id's 16 bytes are of the new layout (version 8, layout 1)."""
    return len(task_id) == 16 and task_id[6] == LAYOUT_BYTE


def id_partition(task_id: bytes | uuid.UUID, partitions: int) -> int:
    """The partition of a task id: read off a new id, hashed for one minted before (v7, v4).

    ``InvalidArgument`` (field ``id``) for an id no chronoq of this cluster minted: another
    version 8 layout (a newer node's: upgrade this one) or a partition outside
    ``0..partitions-1``."""
    raw = task_id.bytes if isinstance(task_id, uuid.UUID) else task_id
    if len(raw) != 16:
        raise InvalidArgument("id", f"a task id has 16 bytes, not {len(raw)}")
    _check_partitions(partitions)
    if raw[6] >> 4 != 8:
        return partitions_of((raw,), partitions)[0]
    if raw[6] != LAYOUT_BYTE:
        raise InvalidArgument(
            "id", f"{uuid.UUID(bytes=raw)} has id layout {raw[6] & 0x0F}, unknown to this node"
        )
    p = int.from_bytes(raw[9:11], "big")
    if p >= partitions:
        raise InvalidArgument(
            "id",
            f"{uuid.UUID(bytes=raw)} names partition {p}; this cluster has {partitions}",
        )
    return p


def _check_partitions(partitions: int) -> None:
    if not 1 <= partitions <= MAX_ID_PARTITIONS:
        raise ValueError(f"partitions must be in 1..{MAX_ID_PARTITIONS}, got {partitions}")
