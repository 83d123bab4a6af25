"""Time-ordered task ids (pure): RFC 9562 version 7, ordered by their millisecond, unique,
and spread evenly over the partitions like random ids."""

from __future__ import annotations

import uuid
from collections import Counter

from hypothesis import given
from hypothesis import strategies as st

from chronoq.buckets import partition_of
from chronoq.ids import time_ordered_id_bytes, time_ordered_ids

MS = st.integers(min_value=0, max_value=(1 << 48) - 1)


@given(MS, st.integers(min_value=0, max_value=200))
def test_ids_are_version_7_and_carry_their_millisecond(unix_ms: int, count: int) -> None:
    ids = time_ordered_ids(count, unix_ms)
    assert len(ids) == count and len(set(ids)) == count
    for task_id in ids:
        assert task_id.version == 7 and task_id.variant == uuid.RFC_4122
        assert task_id.int >> 80 == unix_ms
        assert uuid.UUID(str(task_id)) == task_id  # survives the text form


@given(MS, st.integers(min_value=0, max_value=50))
def test_the_bytes_are_the_ids(unix_ms: int, count: int) -> None:
    raw = time_ordered_id_bytes(count, unix_ms)
    assert all(len(b) == 16 for b in raw) and len(set(raw)) == count
    for b in raw:
        task_id = uuid.UUID(bytes=b)
        assert task_id.version == 7 and task_id.variant == uuid.RFC_4122
        assert task_id.int >> 80 == unix_ms


@given(MS, st.integers(min_value=1, max_value=10_000))
def test_a_later_millisecond_sorts_after(unix_ms: int, later_by: int) -> None:
    (first,) = time_ordered_ids(1, unix_ms)
    (second,) = time_ordered_ids(1, min(unix_ms + later_by, (1 << 48) - 1))
    if second.int >> 80 > first.int >> 80:
        assert second > first and second.bytes > first.bytes  # as PostgreSQL orders uuid


def test_partitions_stay_uniform() -> None:
    ids = time_ordered_ids(64_000, 1_800_000_000_000)  # all in one millisecond
    counts = Counter(partition_of(i.bytes, 64) for i in ids)
    assert len(counts) == 64
    assert max(counts.values()) < 1.25 * 1000 and min(counts.values()) > 0.75 * 1000
