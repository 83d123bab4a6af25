"""Task filters and the walk of bulk operations: checks, the states each action changes, how
shard batches merge, the walk's bounds, and the per-namespace bound of bulk calls."""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from datetime import UTC, datetime

import pytest

from chronoq.errors import InvalidArgument, TooManyBulkCalls
from chronoq.models import Page, Task, TaskState
from chronoq.node.edge.bulk import BulkSlots
from chronoq.store import fanout
from chronoq.store.bulk import Batch, merged, walk
from chronoq.taskfilter import BulkAction, TaskFilter, checked_filter, parse_label

AT = datetime(2030, 1, 1, tzinfo=UTC)


def _check(**kwargs: object) -> TaskFilter:
    base: dict[str, object] = {
        "queue": None,
        "labels": (),
        "state": None,
        "run_at_from": None,
        "run_at_to": None,
    }
    base.update(kwargs)
    return checked_filter(**base)  # type: ignore[arg-type]


def test_a_filter_is_checked_and_names_the_field() -> None:
    where = _check(queue="q", labels=[("b", "2"), ("a", "1")], field="filter.")
    assert where.labels == (("a", "1"), ("b", "2")) and where.labels_json() == '{"a":"1","b":"2"}'
    with pytest.raises(InvalidArgument, match=r"filter\.labels.*limit is 16"):
        _check(labels=[(f"k{i}", "v") for i in range(17)], field="filter.")
    with pytest.raises(InvalidArgument, match=r"labels.*key 'bad key'"):
        _check(labels=[("bad key", "v")])
    with pytest.raises(InvalidArgument, match="twice"):
        _check(labels=[("a", "1"), ("a", "2")])
    with pytest.raises(InvalidArgument, match="NUL"):
        _check(labels=[("a", "x\x00")])
    with pytest.raises(InvalidArgument, match="queue"):
        _check(queue="has space")
    with pytest.raises(InvalidArgument, match="run_at_to"):
        _check(run_at_from=AT, run_at_to=AT)
    assert parse_label("a=b=c") == ("a", "b=c")
    with pytest.raises(InvalidArgument):
        parse_label("nokey")


def test_each_action_changes_its_states_only() -> None:
    assert TaskFilter().states_for(BulkAction.CANCEL) == [
        TaskState.SCHEDULED,
        TaskState.READY,
        TaskState.RUNNING,
        TaskState.DEAD,
    ]
    assert TaskFilter().states_for(BulkAction.REQUEUE) == [TaskState.DEAD]
    assert TaskFilter(state=TaskState.READY).states_for(BulkAction.RUN_NOW) == []
    assert TaskFilter(state=TaskState.SUCCEEDED).states_for(BulkAction.CANCEL) == []


def _id(n: int) -> uuid.UUID:
    return uuid.UUID(int=n)


def test_a_round_goes_on_from_the_lowest_position_and_a_dry_run_counts_up_to_it() -> None:
    a = Batch(3, _id(30), ids=(_id(10), _id(20), _id(30)), queues=("q", "q", "r"))
    b = Batch(2, _id(15), ids=(_id(5), _id(15)), queues=("q", "q"))
    done = Batch(1, None, ids=(_id(40),), queues=("r",))
    count, upto, queues = merged([a, b, done], dry_run=True)
    assert (count, upto) == (3, _id(15))  # 5, 10, 15: the rest are counted when walked again
    count, upto, queues = merged([a, b, done], dry_run=False)
    assert (count, upto) == (6, _id(15)) and queues == {"q": 4, "r": 2}  # writes count once
    assert merged([done], dry_run=True)[:2] == (1, None)


async def test_the_walk_stops_at_its_bound_and_answers_where() -> None:
    calls: list[tuple[uuid.UUID, int]] = []

    async def rounds(after: uuid.UUID, batch: int) -> Sequence[Batch]:
        calls.append((after, batch))
        start = after.int
        return [Batch(batch, _id(start + batch), ids=tuple(_id(start + i + 1) for i in range(batch)))]

    done = await walk(
        rounds, shards=1, namespace="n", action=BulkAction.CANCEL, dry_run=False,
        page_token="", max_tasks=2500, deadline_s=60,
    )  # fmt: skip
    assert done.outcome.count == 2500 and done.outcome.more
    assert done.outcome.next_token == str(_id(2500))
    assert [b for _a, b in calls] == [1000, 1000, 500]
    done = await walk(
        rounds, shards=1, namespace="n", action=BulkAction.CANCEL, dry_run=False,
        page_token="", max_tasks=10**9, deadline_s=0,
    )  # fmt: skip
    assert done.outcome.count == 1000 and done.outcome.more  # the deadline: one round


async def test_the_queues_a_walk_answers_wake_claims_and_a_dry_run_wakes_none() -> None:
    async def rounds(after: uuid.UUID, batch: int) -> Sequence[Batch]:
        return [Batch(2, None, ids=(_id(1), _id(2)), queues=("q", "q"))]

    kwargs = {"shards": 1, "namespace": "n", "page_token": "", "max_tasks": 10, "deadline_s": 9}
    ran = await walk(rounds, action=BulkAction.RUN_NOW, dry_run=False, **kwargs)  # type: ignore[arg-type]
    assert ran.effects.ready == {("n", "q"): 2} and not ran.outcome.more
    dry = await walk(rounds, action=BulkAction.RUN_NOW, dry_run=True, **kwargs)  # type: ignore[arg-type]
    assert not dry.effects
    # a cancel answers the queues of keyed tasks only (a key's slot may be free)
    cancel = await walk(rounds, action=BulkAction.CANCEL, dry_run=False, **kwargs)  # type: ignore[arg-type]
    assert cancel.effects.ready == {("n", "q"): 2}


def _task(n: int) -> Task:
    return Task(id=str(_id(n)), namespace="n", queue="q", partition=0, bucket=0, run_at=AT,
                state=TaskState.SCHEDULED)  # fmt: skip


def test_a_shard_page_with_no_match_but_a_token_bounds_the_merged_page() -> None:
    empty_but_more = Page([], str(_id(50)))
    rest = Page([_task(10), _task(60), _task(70)], "")
    page = fanout.page([empty_but_more, rest], 10, 1 << 20, lambda t: 1)
    assert [t.id for t in page.tasks] == [str(_id(10))]
    assert page.next_token == str(_id(50))  # ids 51..59 of the first shard come next


def test_a_namespace_holds_a_bounded_number_of_bulk_calls() -> None:
    slots = BulkSlots(per_namespace=2)
    with slots.slot("a"), slots.slot("a"):
        with pytest.raises(TooManyBulkCalls, match="'a'"):
            with slots.slot("a"):
                pass
        with slots.slot("b"):
            assert slots.running("b") == 1
    assert slots.running("a") == 0 and slots._running == {}
