"""The idempotency keys a client gives tasks submitted without one: unique, UUID text,
time-ordered like task ids (so a batch's key index entries land side by side)."""

from __future__ import annotations

import time
import uuid

from hypothesis import given
from hypothesis import strategies as st

from chronoq.client import NewTask
from chronoq.client.values import new_keys


@given(st.integers(min_value=0, max_value=500))
def test_keys_are_distinct_version_7_uuids(count: int) -> None:
    keys = new_keys(count)
    assert len(keys) == count and len(set(keys)) == count
    for key in keys:
        parsed = uuid.UUID(key)
        assert str(parsed) == key and parsed.version == 7


def test_keys_carry_the_time_they_were_made() -> None:
    before = time.time_ns() // 1_000_000
    (key,) = new_keys(1)
    after = time.time_ns() // 1_000_000
    assert before <= uuid.UUID(key).int >> 80 <= after


def test_a_given_key_wins_over_the_generated_one() -> None:
    mine = NewTask(queue="q", idempotency_key="order-17").to_pb("default", idempotency_key="x")
    theirs = NewTask(queue="q").to_pb("default", idempotency_key="generated")
    assert mine.idempotency_key == "order-17" and theirs.idempotency_key == "generated"
