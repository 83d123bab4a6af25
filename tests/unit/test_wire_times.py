"""The wire's timestamps and durations, built from integer microseconds, equal protobuf's own
conversions (``FromDatetime``, ``ToDatetime``, ``FromTimedelta``, ``ToTimedelta``)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from google.protobuf import duration_pb2, timestamp_pb2
from hypothesis import given
from hypothesis import strategies as st

from chronoq.api import convert
from chronoq.errors import InvalidArgument

instants = st.datetimes(timezones=st.just(UTC)) | st.datetimes()  # aware or naive (UTC)
durations = st.timedeltas(min_value=timedelta(days=-10**6), max_value=timedelta(days=10**6))


@given(instants)
def test_a_timestamp_matches_from_datetime(when: datetime) -> None:
    expected = timestamp_pb2.Timestamp()
    expected.FromDatetime(when)
    assert convert.to_timestamp(when) == expected


@given(st.integers(-62_135_596_800, 253_402_300_799), st.integers(0, 999_999_999))
def test_a_timestamp_reads_as_to_datetime(seconds: int, nanos: int) -> None:
    ts = timestamp_pb2.Timestamp(seconds=seconds, nanos=nanos)
    assert convert.from_timestamp("t", ts) == ts.ToDatetime(tzinfo=UTC)


@pytest.mark.parametrize(
    ("seconds", "nanos"), [(253_402_300_800, 0), (-62_135_596_801, 0), (0, -1), (0, 10**9)]
)
def test_a_timestamp_out_of_range_is_invalid_argument(seconds: int, nanos: int) -> None:
    with pytest.raises(InvalidArgument, match="not a valid timestamp"):
        convert.from_timestamp("t", timestamp_pb2.Timestamp(seconds=seconds, nanos=nanos))


@given(durations)
def test_a_duration_matches_from_timedelta(d: timedelta) -> None:
    expected = duration_pb2.Duration()
    expected.FromTimedelta(d)
    assert convert.to_duration(d) == expected


@given(st.integers(-10**10, 10**10), st.integers(-999_999_999, 999_999_999))
def test_a_duration_reads_as_to_timedelta(seconds: int, nanos: int) -> None:
    if seconds and nanos and (seconds > 0) != (nanos > 0):
        nanos = -nanos  # a valid Duration's seconds and nanos share their sign
    d = duration_pb2.Duration(seconds=seconds, nanos=nanos)
    assert convert._delta(d) == d.ToTimedelta()
