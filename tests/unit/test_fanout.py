"""The merge of shards' answers (``chronoq.store.fanout``): pages cut where a shard's page
ended, counts added, per-item answers back in order."""

from __future__ import annotations

from collections import Counter
from datetime import UTC, datetime, timedelta
from types import SimpleNamespace
from typing import Any

import pytest

from chronoq.models import Page, QueueCount, QueueCounts, TaskState
from chronoq.store import fanout
from chronoq.store.rows import FireResult

T0 = datetime(2030, 1, 1, tzinfo=UTC)


def tasks(*ids: int) -> list[Any]:
    return [SimpleNamespace(id=f"{i:04d}") for i in ids]


def ids(page: Page) -> list[str]:
    return [t.id for t in page.tasks]


def test_a_merged_page_ends_where_a_shard_with_more_ended() -> None:
    a = Page(tasks(1, 3, 5), next_token="0005")  # shard a has more after 5
    b = Page(tasks(2, 4, 6, 8))  # shard b has nothing after 8
    merged = fanout.page([a, b], 10, 1 << 20, lambda t: 1)
    # 6 and 8 are left for the next page: a may hold 6 < id < 8 after its 5.
    assert ids(merged) == ["0001", "0002", "0003", "0004", "0005"]
    assert merged.next_token == "0005"


def test_a_merged_page_keeps_page_size_and_bytes() -> None:
    a, b = Page(tasks(1, 4)), Page(tasks(2, 3))
    full = fanout.page([a, b], 3, 1 << 20, lambda t: 1)
    assert ids(full) == ["0001", "0002", "0003"] and full.next_token == "0003"
    small = fanout.page([a, b], 10, 25, lambda t: 10)  # two fit in 25 bytes
    assert ids(small) == ["0001", "0002"] and small.next_token == "0002"
    one = fanout.page([a, b], 10, 1, lambda t: 10)  # always one, even past the bytes
    assert ids(one) == ["0001"]
    last = fanout.page([a, b], 10, 1 << 20, lambda t: 1)
    assert ids(last) == ["0001", "0002", "0003", "0004"] and last.next_token == ""
    assert fanout.page([Page(), Page()], 10, 100, lambda t: 1) == Page([], "")


def test_answers_go_back_in_the_callers_order() -> None:
    groups = fanout.grouped([5, 1, 6, 2], lambda p: "s0" if p < 4 else "s1")
    assert groups == {"s1": [0, 2], "s0": [1, 3]}
    answers = [(groups["s0"], ["b", "d"]), (groups["s1"], ["a", "c"])]
    assert fanout.in_order(4, answers) == ["a", "b", "c", "d"]
    with pytest.raises(AssertionError):
        fanout.in_order(5, answers)


def test_fires_and_counts_add_up() -> None:
    one = FireResult(fired=2, ready_by_queue=Counter({("n", "q"): 2}), unfinished={1})
    two = FireResult(fired=1, skipped=1, ready_by_queue=Counter({("n", "q"): 1}), lateness=[0.5])
    both = fanout.fire_results([one, two])
    assert (both.fired, both.skipped, both.unfinished, both.lateness) == (3, 1, {1}, [0.5])
    assert both.effects.ready == Counter({("n", "q"): 3})
    assert fanout.summed([{"a": 1}, {"a": 2, "b": 1}]) == {"a": 3, "b": 1}
    assert fanout.capped_sums([{"a": 3}, {"a": 4}], {"a": 5}) == {"a": 5}


def test_queue_counts_merge_with_their_bounds() -> None:
    r, s = TaskState.READY, TaskState.SCHEDULED
    a = QueueCounts([QueueCount("x", r, 2, T0), QueueCount("y", r, 1, T0)], frozenset({r}))
    b = QueueCounts([QueueCount("x", r, 3, T0 - timedelta(1)), QueueCount("z", s, 1, None)])
    merged = fanout.queue_counts([a, b], max_queues=1)
    assert merged.counts == [QueueCount("z", s, 1), QueueCount("x", r, 5, T0 - timedelta(1))]
    assert merged.capped == {r} and merged.truncated == {r}  # y left out


def test_due_soon_keeps_the_earliest() -> None:
    e = [("b", 1, T0 + timedelta(seconds=2), "n", "q"), ("a", 2, T0, "n", "q")]
    assert [x[0] for x in fanout.earliest([e[:1], e[1:]], 1)] == ["a"]


def test_claim_shares_take_the_best_heads_of_every_shard_within_the_bytes() -> None:
    t0 = datetime(2030, 1, 1, tzinfo=UTC)
    at = [t0 + timedelta(seconds=i) for i in range(6)]
    heads = {
        "shard-0": [(9, at[1], 100), (5, at[0], 100), (0, at[0], 100)],
        "shard-1": [(9, at[0], 100), (5, at[2], 100)],
    }
    # The best four: both 9s, then the 5s by run_at; each shard claims its part.
    assert fanout.claim_shares(heads, 4, 10_000) == {"shard-1": (2, 200), "shard-0": (2, 200)}
    assert fanout.claim_shares(heads, 1, 10_000) == {"shard-1": (1, 100)}
    # Bytes: the best always comes (alone), the others only while they fit.
    assert fanout.claim_shares(heads, 4, 250) == {"shard-1": (1, 100), "shard-0": (1, 100)}
    assert fanout.claim_shares(heads, 4, 10) == {"shard-1": (1, 100)}
    # An answer already holding tasks: not even the first past the bytes left.
    assert fanout.claim_shares(heads, 4, 10, started=True) == {}
    assert fanout.claim_shares({"shard-0": [], "shard-1": []}, 4, 10_000) == {}
