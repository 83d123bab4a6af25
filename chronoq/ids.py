"""Task ids: UUIDs whose first 48 bits are the creation time in milliseconds (RFC 9562 v7).

Random (v4) ids scatter each new task's entries over the whole primary-key and listing
indexes: with millions of tasks pending, every insert and every state change then touches
a cold leaf page somewhere in gigabytes of index, and the cost of a task grows with the size
of the table. Time-ordered ids put the entries of tasks created together side by side at the
right edge of those indexes, where the pages are hot. The 74 random bits keep ids unguessable
and unique; the partition of such an id is a hash of all 16 bytes.

The store mints task and schedule ids as version 8 now (``chronoq.routing``), which keep this
48-bit millisecond prefix and carry their partition: index locality holds as before (ids of
one moment still sort side by side, v7 and v8 alike) and a by-id call reads the partition off
the id. v7 ids made here remain valid task ids (``routing.id_partition`` hashes them) and
serve as the SDK's minted idempotency keys.
"""

from __future__ import annotations

import os
import uuid

_STAMP = (1 << 48) - 1
_VERSION_7 = 0x70  # high nibble of byte 6
_VARIANT = 0x80  # high two bits of byte 8: 0b10


def time_ordered_id_bytes(count: int, unix_ms: int) -> list[bytes]:
    """``count`` new v7 ids for ``unix_ms`` (milliseconds since the epoch) as their 16 bytes,
    from one read of the system's randomness: 48 bits of time, the version nibble, 12 random
    bits, the variant's two bits, 62 random bits."""
    if count <= 0:
        return []
    raw = os.urandom(10 * count)
    stamp = (unix_ms & _STAMP).to_bytes(6, "big")
    return [
        stamp
        + bytes((_VERSION_7 | (raw[i] & 0x0F), raw[i + 1], _VARIANT | (raw[i + 2] & 0x3F)))
        + raw[i + 3 : i + 10]
        for i in range(0, 10 * count, 10)
    ]


def time_ordered_ids(count: int, unix_ms: int) -> list[uuid.UUID]:
    """``time_ordered_id_bytes`` as UUIDs."""
    return [uuid.UUID(bytes=b) for b in time_ordered_id_bytes(count, unix_ms)]
