"""The pure side of the kept queue counts: shards' answers merged, the answer's bounds."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from chronoq.models import TaskState as S
from chronoq.queuecounts import REST, KeptCounts, StateCounts, label_tallies, merged, snapshot

NOW = datetime(2026, 1, 1, tzinfo=UTC)


def test_shards_answers_sum_keep_the_oldest_count_and_the_earliest_ready() -> None:
    a = KeptCounts(
        rows={("mail", S.READY): 2},
        totals={S.READY: 2},
        as_of=NOW,
        counted=3,
        oldest_ready={"mail": NOW - timedelta(seconds=5)},
    )
    b = KeptCounts(
        rows={("mail", S.READY): 3, ("mail", S.DEAD): 1},
        totals={S.READY: 3, S.DEAD: 1},
        as_of=NOW - timedelta(seconds=2),
        counted=5,
        oldest_ready={"mail": NOW - timedelta(seconds=9)},
    )
    m = merged([a, b])
    assert m.rows == {("mail", S.READY): 5, ("mail", S.DEAD): 1}
    assert m.as_of == NOW - timedelta(seconds=2) and m.counted == 8
    snap = snapshot(m, now=NOW, partitions=10, max_queues=100)
    assert snap.queue("mail") is not None
    assert snap.queue("mail").counts == StateCounts(ready=5, dead=1)  # type: ignore[union-attr]
    assert snap.oldest_ready_age("mail") == timedelta(seconds=9)
    assert snap.uncounted_partitions == 2 and snap.staleness == timedelta(seconds=2)


def test_queues_past_the_bound_are_summed_and_totals_stay_exact() -> None:
    kept = KeptCounts(
        rows={("a", S.READY): 1, ("b", S.READY): 2, ("c", S.READY): 3, (REST, S.READY): 4},
        totals={S.READY: 10},
        as_of=NOW,
        counted=1,
    )
    snap = snapshot(kept, now=NOW, partitions=1, max_queues=2)
    assert [t.queue for t in snap.queues] == ["a", "b"]
    assert snap.other == StateCounts(ready=7) and snap.totals == StateCounts(ready=10)
    assert snap.truncated


def test_named_queues_are_answered_even_at_zero() -> None:
    kept = KeptCounts(rows={("a", S.SCHEDULED): 1}, totals={S.SCHEDULED: 1}, counted=1)
    snap = snapshot(kept, now=NOW, partitions=1, max_queues=100, queues=["b", "a"])
    assert [(t.queue, t.counts) for t in snap.queues] == [
        ("a", StateCounts(scheduled=1)),
        ("b", StateCounts()),
    ]
    assert snap.totals == StateCounts(scheduled=1) and snap.as_of is None
    assert snap.staleness is None


def test_label_tallies_sum_over_shards_within_their_bound() -> None:
    rows = [
        ("q", "x", S.READY, 1),
        ("q", "x", S.READY, 2),
        ("q", "", S.DEAD, 1),
        ("r", "y", S.READY, 1),
    ]
    tallies, cut = label_tallies(rows, max_rows=2)
    assert [(t.queue, t.value, t.counts) for t in tallies] == [
        ("q", "", StateCounts(dead=1)),
        ("q", "x", StateCounts(ready=3)),
    ]
    assert cut
