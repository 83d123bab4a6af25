"""The pure decisions of unique and debounce keys (chronoq.submit_keys) and what a debounced
submit tells the wheel (chronoq.effects.of_submits)."""

from __future__ import annotations

import itertools
from datetime import UTC, datetime, timedelta

from hypothesis import given
from hypothesis import strategies as st

from chronoq.effects import of_submits
from chronoq.models import SubmitOutcome, Task, TaskSpec, TaskState
from chronoq.submit_keys import debounced, keyed, lock_order

NOW = datetime(2030, 1, 1, 12, 0, tzinfo=UTC)


def test_only_a_unique_or_debounce_key_makes_a_spec_keyed() -> None:
    assert not keyed(TaskSpec(queue="q", run_at=NOW))
    assert not keyed(TaskSpec(queue="q", run_at=NOW, idempotency_key="i", concurrency_key="c"))
    assert keyed(TaskSpec(queue="q", run_at=NOW, unique_key="u"))
    assert keyed(
        TaskSpec(queue="q", run_at=NOW, debounce_key="d", debounce=timedelta(seconds=1))
    )


def test_a_debounce_replaces_the_run_at() -> None:
    spec = TaskSpec(
        queue="q", run_at=NOW + timedelta(days=3), debounce_key="d", debounce=timedelta(seconds=5)
    )
    assert debounced(spec, NOW).run_at == NOW + timedelta(seconds=5)
    plain = TaskSpec(queue="q", run_at=NOW + timedelta(days=3), unique_key="u")
    assert debounced(plain, NOW) is plain


@given(st.lists(st.tuples(st.sampled_from("ab"), st.integers(0, 3), st.sampled_from("xyz"))))
def test_the_lock_order_is_total_and_keeps_a_keys_specs_in_batch_order(
    rows: list[tuple[str, int, str]],
) -> None:
    specs = [TaskSpec(queue="q", run_at=NOW, namespace=ns, unique_key=k) for ns, _p, k in rows]
    order = sorted(range(len(specs)), key=lambda i: lock_order(specs[i], rows[i][1]))
    for a, b in itertools.pairwise(order):
        ka, kb = lock_order(specs[a], rows[a][1]), lock_order(specs[b], rows[b][1])
        assert ka <= kb
        if ka == kb:
            assert a < b  # stable: one key's specs keep their batch order


def _task(state: TaskState, debounce_key: str | None) -> Task:
    return Task(
        id="00000000-0000-8100-8000-000000000001",
        namespace="n",
        queue="q",
        state=state,
        run_at=NOW,
        partition=0,
        bucket=0,
        debounce_key=debounce_key,
    )


def test_a_moved_debounced_task_is_offered_to_the_wheel_a_unique_answer_is_not() -> None:
    moved = SubmitOutcome(_task(TaskState.SCHEDULED, "d"), False)
    answered = SubmitOutcome(_task(TaskState.SCHEDULED, None), False)
    started = SubmitOutcome(_task(TaskState.RUNNING, "d"), False)
    effects = of_submits([moved, answered, started])
    assert [s[0] for s in effects.scheduled] == [moved.task.id]
    assert not effects.ready
