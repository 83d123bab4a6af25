"""Task ids: UUIDs whose first 48 bits are the creation time in milliseconds (RFC 9562 v7).

Random (v4) ids scatter each new task's entries over the whole primary-key and listing
indexes: with millions of tasks pending, every insert and every state change then touches
a cold leaf page somewhere in gigabytes of index, and the cost of a task grows with the size
of the table. Time-ordered ids put the entries of tasks created together side by side at the
right edge of those indexes, where the pages are hot. The 74 random bits keep ids unguessable
and unique; the partition is a hash of all 16 bytes, so placement stays uniform.
"""

from __future__ import annotations

import os
import uuid

_VERSION_7 = 0x7 << 76
_VARIANT = 0b10 << 62
_RAND_A = (1 << 12) - 1
_RAND_B = (1 << 62) - 1


def time_ordered_ids(count: int, unix_ms: int) -> list[uuid.UUID]:
    """``count`` new v7 ids for ``unix_ms`` (milliseconds since the epoch), from one read of
    the system's randomness."""
    if count <= 0:
        return []
    raw = os.urandom(10 * count)
    stamp = (unix_ms & ((1 << 48) - 1)) << 80
    out = []
    for i in range(0, 10 * count, 10):
        rand = int.from_bytes(raw[i : i + 10], "big")
        rand_a = (rand >> 62) & _RAND_A
        rand_b = rand & _RAND_B
        out.append(uuid.UUID(int=stamp | _VERSION_7 | (rand_a << 64) | _VARIANT | rand_b))
    return out
