from __future__ import annotations

from datetime import UTC, datetime, timedelta, timezone

import pytest
from hypothesis import given
from hypothesis import strategies as st

from chronoq.durations import format_duration, parse_duration, parse_instant
from chronoq.errors import InvalidArgument


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("250ms", timedelta(milliseconds=250)),
        ("30s", timedelta(seconds=30)),
        ("5m", timedelta(minutes=5)),
        ("1h", timedelta(hours=1)),
        ("2d", timedelta(days=2)),
        ("0s", timedelta(0)),
        ("1h30m", timedelta(hours=1, minutes=30)),
        ("1m 30s", timedelta(minutes=1, seconds=30)),
        ("1.5s", timedelta(milliseconds=1500)),
        (" 10S ", timedelta(seconds=10)),
        ("0.25ms", timedelta(microseconds=250)),
    ],
)
def test_parse_duration(text: str, expected: timedelta) -> None:
    assert parse_duration(text) == expected


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("", "is empty"),
        ("   ", "is empty"),
        ("30", "has no unit; write e.g. 30s"),
        ("-5s", "negative"),
        ("5x", "not a duration"),
        ("s", "not a duration"),
        ("5s5", "not a duration"),
        ("1 fortnight", "not a duration"),
        ("1e3s", "not a duration"),
        ("nan", "not a duration"),
        ("1.5", "has no unit; write e.g. 1.5s"),
        ("40000d", "too long"),
    ],
)
def test_parse_duration_rejects(text: str, message: str) -> None:
    with pytest.raises(InvalidArgument, match=message) as info:
        parse_duration(text, field="--in")
    assert info.value.field == "--in"
    assert info.value.message.startswith("--in: ")


def test_zero_can_be_refused() -> None:
    with pytest.raises(InvalidArgument, match="zero"):
        parse_duration("0ms", allow_zero=False)


@pytest.mark.parametrize(
    ("d", "text"),
    [
        (timedelta(0), "0s"),
        (timedelta(milliseconds=250), "250ms"),
        (timedelta(seconds=90), "1m30s"),
        (timedelta(days=2, hours=1), "2d1h"),
        (timedelta(seconds=-5), "-5s"),
    ],
)
def test_format_duration(d: timedelta, text: str) -> None:
    assert format_duration(d) == text


@given(st.integers(min_value=0, max_value=10**12))
def test_format_then_parse_round_trips(ms: int) -> None:
    d = timedelta(milliseconds=ms)
    assert parse_duration(format_duration(d)) == d


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("2030-01-01T12:00:00Z", datetime(2030, 1, 1, 12, tzinfo=UTC)),
        ("2030-01-01T12:00:00+00:00", datetime(2030, 1, 1, 12, tzinfo=UTC)),
        ("2030-01-01T14:00:00+02:00", datetime(2030, 1, 1, 12, tzinfo=UTC)),
        ("2030-01-01 12:00:00.250Z", datetime(2030, 1, 1, 12, 0, 0, 250_000, tzinfo=UTC)),
        ("20300101T120000Z", datetime(2030, 1, 1, 12, tzinfo=UTC)),
    ],
)
def test_parse_instant(text: str, expected: datetime) -> None:
    parsed = parse_instant(text)
    assert parsed == expected
    assert parsed.tzinfo is not None


def test_parse_instant_keeps_the_offset() -> None:
    parsed = parse_instant("2030-01-01T14:00:00+02:00")
    assert parsed.utcoffset() == timedelta(hours=2)
    assert parsed.tzinfo == timezone(timedelta(hours=2))


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("2030-01-01T12:00:00", "has no time zone; add one .* or Z for UTC"),
        ("2030-01-01", "no time of day and no zone"),
        ("tomorrow", "not an ISO 8601 time"),
        ("", "not an ISO 8601 time"),
        ("2030-13-01T00:00:00Z", "not an ISO 8601 time"),
    ],
)
def test_parse_instant_rejects(text: str, message: str) -> None:
    with pytest.raises(InvalidArgument, match=message) as info:
        parse_instant(text, field="--at")
    assert info.value.field == "--at"
