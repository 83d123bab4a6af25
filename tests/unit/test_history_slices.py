"""The task history's time slices: made without overlap, covering the window, dropped only
once past, and bounded in number."""

from __future__ import annotations

from datetime import timedelta

import pytest
from hypothesis import given
from hypothesis import strategies as st

from chronoq.errors import ConfigError
from chronoq.history_slices import (
    MAX_SLICES,
    Slice,
    aligned,
    check_history_settings,
    slice_width,
    slices_needed,
    to_create,
    to_drop,
)

widths = st.integers(1, 5000)
instants = st.integers(0, 10**6)


@st.composite
def disjoint_slices(draw: st.DrawFn) -> list[Slice]:
    """Existing slices as nodes of several widths (or a hand) may have left them."""
    out: list[Slice] = []
    at = draw(st.integers(0, 10**5))
    for _ in range(draw(st.integers(0, 8))):
        at += draw(st.integers(0, 3000))
        width = draw(st.integers(1, 3000))
        out.append(Slice(at, at + width))
        at += width
    return out


def overlaps(a: Slice, b: Slice) -> bool:
    return a.lo < b.hi and b.lo < a.hi


@given(disjoint_slices(), instants, st.integers(0, 20_000), widths)
def test_new_slices_overlap_nothing_and_cover_the_window(
    existing: list[Slice], first: int, span: int, width: int
) -> None:
    last = first + span
    made = to_create(existing, first, last, width)
    every = existing + made
    for i, a in enumerate(every):
        for b in every[i + 1 :]:
            assert not overlaps(a, b)
    if slices_needed(timedelta(seconds=span), timedelta(seconds=width)) <= MAX_SLICES:
        for t in {first, last, (first + last) // 2}:
            assert any(s.lo <= t < s.hi for s in every), t


@given(instants, instants, widths)
def test_one_width_makes_the_same_aligned_slices_on_every_node(
    first: int, other: int, width: int
) -> None:
    a, b = aligned(first, width), aligned(other, width)
    assert a.lo <= first < a.hi and a.hi - a.lo == width and a.lo % width == 0
    assert a == b or not overlaps(a, b)
    made = to_create([], first, first, width)
    assert made == [a]
    assert to_create(made, first, first, width) == []  # made once: a second pass makes none


@given(disjoint_slices(), instants)
def test_only_slices_past_their_bound_are_dropped(existing: list[Slice], now: int) -> None:
    gone = to_drop(existing, now)
    assert all(s.hi <= now for s in gone)
    assert all(s in gone for s in existing if s.hi <= now)


@given(st.integers(1, 3650 * 86400), st.integers(1, 366 * 86400))
def test_the_window_never_needs_more_slices_than_allowed(retention_s: int, width_s: int) -> None:
    retention, width = timedelta(seconds=retention_s), timedelta(seconds=width_s)
    if slices_needed(retention, width) > MAX_SLICES:
        with pytest.raises(ConfigError, match="wider history_slice"):
            check_history_settings(retention, width)
    else:
        check_history_settings(retention, width)
    assert slices_needed(retention, slice_width(retention, None)) <= MAX_SLICES
    made = to_create([], 0, retention_s, width_s)
    assert len(made) <= MAX_SLICES


def test_bad_widths_are_refused_clearly() -> None:
    with pytest.raises(ConfigError, match="between"):
        check_history_settings(None, timedelta(0))
    with pytest.raises(ConfigError, match="whole seconds"):
        check_history_settings(None, timedelta(seconds=1.5))
    with pytest.raises(ValueError, match="ends after it starts"):
        Slice(5, 5)
