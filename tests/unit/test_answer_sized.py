"""A batch cut so each full SubmitBatch answer fits the answer budget (pure): in order, every
spec once, each part under the node's own check."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from chronoq.api.v1 import tasks_pb2
from chronoq.client.client import answer_sized
from chronoq.limits import MAX_ANSWER_BYTES, full_answer_bytes


@given(st.lists(st.integers(min_value=0, max_value=256 * 1024), max_size=60))
def test_parts_keep_order_and_each_answer_fits(sizes: list[int]) -> None:
    keyed = [(tasks_pb2.TaskSpec(queue="q", payload=b"x" * n), i) for i, n in enumerate(sizes)]
    parts = answer_sized(keyed)
    assert [k for part in parts for _spec, k in part] == list(range(len(sizes)))
    for part in parts:
        assert part or not keyed
        request = tasks_pb2.SubmitBatchRequest(tasks=[spec for spec, _ in part])
        assert len(part) == 1 or full_answer_bytes(request.ByteSize(), len(part)) <= (
            MAX_ANSWER_BYTES
        )


def test_ten_thousand_keyed_specs_take_several_requests() -> None:
    keyed = [
        (tasks_pb2.TaskSpec(queue="q", idempotency_key=f"{i:0300d}"), i) for i in range(10_000)
    ]
    assert len(answer_sized(keyed)) == 2
