from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from hypothesis import given
from hypothesis import strategies as st

from chronoq.buckets import (
    average_per_bucket,
    bucket_of,
    bucket_start,
    buckets_of,
    partition_of,
    partitions_of,
)

aware = st.datetimes(
    min_value=datetime(1971, 1, 1), max_value=datetime(2200, 1, 1), timezones=st.just(UTC)
)


@given(aware, st.integers(min_value=1, max_value=3600))
def test_run_at_lies_within_its_bucket(run_at: datetime, width: int) -> None:
    b = bucket_of(run_at, width)
    assert bucket_start(b, width) <= run_at < bucket_start(b + 1, width)


@given(aware, aware)
def test_buckets_are_monotonic(a: datetime, b: datetime) -> None:
    if a <= b:
        assert bucket_of(a) <= bucket_of(b)


def test_bucket_edges() -> None:
    start = datetime(2030, 1, 1, 12, 0, tzinfo=UTC)
    assert bucket_of(start) == bucket_of(start + timedelta(seconds=59, microseconds=999_999))
    assert bucket_of(start + timedelta(seconds=60)) == bucket_of(start) + 1
    assert bucket_of(start - timedelta(microseconds=1)) == bucket_of(start) - 1


def test_naive_time_is_refused() -> None:
    with pytest.raises(ValueError, match="timezone-aware"):
        bucket_of(datetime(2030, 1, 1))


@given(st.binary(min_size=1, max_size=32), st.integers(min_value=1, max_value=4096))
def test_partition_in_range_and_stable(key: bytes, partitions: int) -> None:
    p = partition_of(key, partitions)
    assert 0 <= p < partitions
    assert partition_of(key, partitions) == p


def test_partition_hash_is_pinned() -> None:
    # Every node and every release must agree: a changed value would re-home tasks.
    assert partition_of("task-1", 256) == partition_of(b"task-1", 256)
    assert [partition_of(f"k{i}", 256) for i in range(3)] == PINNED


PINNED = [151, 32, 158]


def test_partitions_spread_evenly() -> None:
    counts = [0] * 16
    for i in range(16_000):
        counts[partition_of(f"id-{i}", 16)] += 1
    assert min(counts) > 800 and max(counts) < 1200


def test_average_per_bucket_arithmetic() -> None:
    assert average_per_bucket(10_000_000) == pytest.approx(10_000_000 / 1440)
    assert average_per_bucket(1440) == 1


@given(st.lists(aware, max_size=20), st.integers(min_value=1, max_value=3600))
def test_a_batch_gets_the_buckets_of_its_instants(run_ats: list[datetime], width: int) -> None:
    assert buckets_of(run_ats, width) == [bucket_of(r, width) for r in run_ats]


@given(st.lists(st.binary(min_size=16, max_size=16), max_size=20), st.integers(1, 4096))
def test_a_batch_gets_the_partitions_of_its_ids(keys: list[bytes], partitions: int) -> None:
    assert partitions_of(keys, partitions) == [partition_of(k, partitions) for k in keys]


def test_a_batch_refuses_what_one_refuses() -> None:
    with pytest.raises(ValueError, match="timezone-aware"):
        buckets_of([datetime(2030, 1, 1, tzinfo=UTC), datetime(2030, 1, 1)])
    with pytest.raises(ValueError, match="bucket_seconds"):
        buckets_of([], 0)
    with pytest.raises(ValueError, match="partitions"):
        partitions_of([], 0)
