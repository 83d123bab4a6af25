"""The console's pure parts: the request guard, payload display, samples, page rows."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta

import pytest
from hypothesis import given
from hypothesis import strategies as st

from chronoq import errors
from chronoq.console.guard import (
    CSRF_HEADER,
    JSON_CONTENT_TYPE,
    LOGIN_PATH,
    ConsoleGuard,
    Request,
    url_host,
)
from chronoq.console.payload import (
    HEX_LINE_BYTES,
    MAX_SHOWN_BYTES,
    PayloadView,
    hex_dump,
    show_payload,
)
from chronoq.console.samples import NodeSample, Sample, SampleRing, cluster_rate, fired_rate
from chronoq.console.server import ConsoleSettings, http_status
from chronoq.console.views import (
    COUNTED_STATES,
    ERROR_PREVIEW,
    MAX_SHOWN_MOVES,
    QueueTally,
    in_window,
    next_occurrences,
    parse_state,
    shard_map_view,
    task_summary,
)
from chronoq.models import QueueCount, QueueCounts, Schedule, ScheduleSpec, Task, TaskState
from chronoq.queuecounts import QueueSnapshot, StateCounts
from chronoq.queuecounts import QueueTally as KeptTally
from chronoq.recurrence import Every

NOW = datetime(2030, 1, 1, 12, 0, tzinfo=UTC)
GUARD = ConsoleGuard(session_key="s" * 32, csrf_token="c" * 32, bound_host="127.0.0.1", port=8090)


def post(**overrides: object) -> Request:
    fields: dict[str, object] = {
        "method": "POST",
        "path": "/api/tasks/cancel",
        "host": "127.0.0.1:8090",
        "origin": "http://127.0.0.1:8090",
        "fetch_site": "same-origin",
        "content_type": JSON_CONTENT_TYPE,
        "session": "s" * 32,
        "csrf": "c" * 32,
    }
    fields.update(overrides)
    return Request(**fields)  # type: ignore[arg-type]


# ---------------------------------------------------------------------- guard


def test_the_console_own_post_passes() -> None:
    assert GUARD.refusal(post()) is None
    assert GUARD.refusal(post(host="localhost:8090", origin="http://localhost:8090")) is None


@pytest.mark.parametrize(
    ("change", "status", "reason"),
    [
        ({"origin": "http://evil.example"}, 403, "cross-origin"),
        ({"origin": "http://127.0.0.1:9999"}, 403, "cross-origin"),  # another local page
        ({"host": "evil.example:8090", "origin": None}, 403, "Host"),  # DNS rebinding
        ({"fetch_site": "cross-site", "origin": None}, 403, "cross-site"),
        ({"csrf": None}, 403, CSRF_HEADER),
        ({"csrf": "c" * 31 + "d"}, 403, CSRF_HEADER),
        ({"content_type": "text/plain"}, 415, JSON_CONTENT_TYPE),  # an HTML form's POST
        ({"content_type": None}, 415, JSON_CONTENT_TYPE),
        ({"session": None}, 401, "session"),
        ({"session": "x" * 32}, 401, "session"),
    ],
)
def test_forged_or_incomplete_posts_are_refused(
    change: dict[str, object], status: int, reason: str
) -> None:
    refusal = GUARD.refusal(post(**change))
    assert refusal is not None and refusal.status == status and reason in refusal.reason


def test_reads_need_the_session_but_no_csrf_token() -> None:
    read = post(method="GET", path="/api/overview", csrf=None, content_type=None, origin=None)
    assert GUARD.refusal(read) is None
    refusal = GUARD.refusal(post(method="GET", path="/tasks", session=None))
    assert refusal is not None and refusal.status == 401


def test_login_and_static_files_need_no_session_but_the_right_host() -> None:
    assert GUARD.refusal(post(method="GET", path=LOGIN_PATH, session=None)) is None
    assert GUARD.refusal(post(method="GET", path="/static/console.js", session=None)) is None
    refusal = GUARD.refusal(post(method="GET", path=LOGIN_PATH, host="evil.example:8090"))
    assert refusal is not None and refusal.status == 403
    assert GUARD.key_matches("s" * 32) and not GUARD.key_matches("") and not GUARD.key_matches(None)


def test_hosts_of_a_wildcard_bind() -> None:
    wide = ConsoleGuard(session_key="s", csrf_token="c", bound_host="0.0.0.0", port=80)
    assert wide.host_allowed("10.1.2.3") and wide.host_allowed("localhost:80")
    assert not wide.host_allowed("console.example") and not wide.host_allowed("10.1.2.3:81")
    assert url_host("0.0.0.0") == "127.0.0.1" and url_host("::") == "[::1]"
    assert url_host("::1") == "[::1]" and url_host("console.local") == "console.local"


@given(st.text(max_size=80))
def test_no_host_header_crashes_the_guard(host: str) -> None:
    GUARD.refusal(post(host=host, origin=host))


# ---------------------------------------------------------------------- payloads


def test_json_payload_is_pretty_printed() -> None:
    shown = show_payload(b'{"to":"a@example.com","n":[1,2]}')
    assert shown.view is PayloadView.JSON and not shown.cut
    assert json.loads(shown.text) == {"to": "a@example.com", "n": [1, 2]}
    assert "\n  " in shown.text


def test_text_binary_and_cut_payloads() -> None:
    assert show_payload(b"hello world").view is PayloadView.TEXT
    binary = show_payload(bytes(range(256)))
    assert binary.view is PayloadView.HEX and binary.text.startswith("00000000  00 01 02")
    big = show_payload(b"a" * 10_000, limit=100)
    assert big.cut and big.size == 10_000 and big.text == "a" * 100
    asked = show_payload(b"not json", PayloadView.JSON)
    assert asked.view is PayloadView.TEXT and asked.note == "not valid JSON"
    cut_json = show_payload(b'{"a": "' + b"x" * 200 + b'"}', PayloadView.JSON, limit=50)
    assert cut_json.cut and "too large" in cut_json.note


@given(st.binary(max_size=2048), st.sampled_from(list(PayloadView)), st.integers(-5, 10**7))
def test_any_payload_is_shown_within_the_limit(data: bytes, view: PayloadView, limit: int) -> None:
    shown = show_payload(data, view, limit)
    bounded = max(1, min(limit, MAX_SHOWN_BYTES))
    assert shown.size == len(data)
    assert shown.cut == (len(data) > bounded)
    if shown.view is PayloadView.HEX:
        assert len(shown.text.splitlines()) == -(-min(len(data), bounded) // HEX_LINE_BYTES)


@given(st.binary(max_size=200))
def test_hex_dump_holds_every_byte(data: bytes) -> None:
    lines = hex_dump(data).splitlines()
    read = bytes.fromhex("".join(line[10:10 + HEX_LINE_BYTES * 3] for line in lines))
    assert read == data


# ---------------------------------------------------------------------- samples


def sample(at: float, *nodes: tuple[str, int]) -> Sample:
    return Sample(at, 0, tuple(NodeSample(n, fired, 1.0, 2.0) for n, fired in nodes))


def test_rates_per_node_and_for_the_cluster() -> None:
    ring = SampleRing(10)
    ring.add(sample(100.0, ("a", 10), ("b", 0)))
    ring.add(sample(102.0, ("a", 30), ("b", 4), ("c", 7)))
    assert ring.node_rates() == {"a": 10.0, "b": 2.0, "c": None}
    assert ring.series().fired_per_s == [None, 12.0]
    assert fired_rate(NodeSample("a", 50, 0, 0), NodeSample("a", 3, 0, 0), 1.0) is None  # restart
    assert cluster_rate(sample(1.0, ("a", 5)), sample(2.0, ("b", 5))) is None


@given(st.lists(st.floats(0, 1e6, allow_nan=False), max_size=50), st.integers(-3, 20))
def test_the_ring_is_bounded_and_ordered(times: list[float], size: int) -> None:
    ring = SampleRing(size)
    for at in times:
        ring.add(sample(at, ("a", int(at))))
    kept = [s.at for s in ring.samples]
    assert len(kept) <= max(2, size) and kept == sorted(set(kept))
    assert len(ring.series().fired_per_s) == len(kept)


# ---------------------------------------------------------------------- page rows


def task(state: TaskState, queue: str = "q", run_at: datetime = NOW, **fields: object) -> Task:
    return Task(id=f"id-{state.name}", namespace="default", queue=queue, state=state,
                run_at=run_at, partition=0, bucket=0, **fields)  # type: ignore[arg-type]


def test_actions_follow_the_state() -> None:
    assert task_summary(task(TaskState.SCHEDULED))["cancellable"]
    assert not task_summary(task(TaskState.SCHEDULED))["requeueable"]
    assert task_summary(task(TaskState.DEAD))["requeueable"]
    assert task_summary(task(TaskState.DEAD))["cancellable"]  # a dead letter is discarded
    assert not task_summary(task(TaskState.SUCCEEDED))["cancellable"]


def test_states_parse_by_name() -> None:
    assert parse_state("") is None and parse_state("any") is None
    assert parse_state("Dead") is TaskState.DEAD
    with pytest.raises(ValueError, match="not one of"):
        parse_state("lost")


def test_time_window_is_half_open() -> None:
    t = task(TaskState.SCHEDULED)
    assert in_window(t, None, None) and in_window(t, NOW, None)
    assert not in_window(t, None, NOW) and in_window(t, None, NOW + timedelta(seconds=1))


def test_queue_tally_counts_states_ready_age_and_limits() -> None:
    tally = QueueTally()
    tally.add(QueueCounts(
        [QueueCount("a", TaskState.READY, 2, NOW - timedelta(seconds=30)),
         QueueCount("b", TaskState.DEAD, 1, NOW)],
        capped=frozenset({TaskState.READY}),
    ))
    out = tally.as_json({"c": (5.0, 1.0)}, NOW)
    rows = {r["queue"]: r for r in out["queues"]}
    assert rows["a"]["counts"] == {"scheduled": 0, "ready": 2, "running": 0, "dead": 0}
    assert rows["a"]["ready_age_s"] == 30.0 and rows["b"]["ready_age_s"] is None
    assert rows["c"]["rate"] == 5.0 and out["cut_states"] == ["ready"]
    assert out["states"] == [s.name.lower() for s in COUNTED_STATES]


def test_queue_tally_takes_the_counts_the_owners_keep() -> None:
    snap = QueueSnapshot(
        queues=(
            KeptTally("a", StateCounts(ready=2, dead=1), NOW - timedelta(seconds=30)),
            KeptTally("b", StateCounts(scheduled=4)),
        ),
        other=StateCounts(),
        totals=StateCounts(scheduled=4, ready=2, dead=1),
        truncated=False,
        as_of=NOW - timedelta(seconds=3),
        now=NOW,
    )
    tally = QueueTally()
    tally.take(snap)
    out = tally.as_json({}, NOW)
    rows = {r["queue"]: r for r in out["queues"]}
    assert rows["a"]["counts"] == {"scheduled": 0, "ready": 2, "running": 0, "dead": 1}
    assert rows["a"]["ready_age_s"] == 30.0 and rows["b"]["ready_age_s"] is None
    assert out["staleness_s"] == 3.0 and out["as_of"] == (NOW - timedelta(seconds=3)).isoformat()
    assert out["uncounted_partitions"] == 0 and not out["truncated"]


def test_next_occurrences_of_an_interval_schedule() -> None:
    spec = ScheduleSpec(name="s", queue="q", rule=Every(timedelta(minutes=5), NOW))
    active = Schedule(id="1", spec=spec, partition=0, paused=False, next_fire_at=NOW)
    assert next_occurrences(active, 3) == [NOW, NOW + timedelta(minutes=5),
                                           NOW + timedelta(minutes=10)]
    paused = Schedule(id="1", spec=spec, partition=0, paused=True, next_fire_at=NOW)
    assert next_occurrences(paused) == []


# ---------------------------------------------------------------------- server edges


def test_remote_errors_map_to_http_statuses() -> None:
    assert http_status(errors.AccessDenied("no", "PERMISSION_DENIED")) == 403
    assert http_status(errors.Unavailable("down")) == 503
    assert http_status(errors.NotFound("gone")) == 404
    assert http_status(errors.InvalidArgument("queue", "bad")) == 400
    assert http_status(errors.RemoteError("odd")) == 502


def test_settings_are_bounded() -> None:
    with pytest.raises(errors.ConfigError):
        ConsoleSettings(refresh=0.1)
    with pytest.raises(errors.ConfigError):
        ConsoleSettings(namespaces=())
    with pytest.raises(errors.InvalidArgument):
        ConsoleSettings(namespaces=("bad name",))


def test_the_shards_page_masks_a_dsn_quoted_anywhere_in_an_error() -> None:
    """Errors quote DSNs inside brackets and quotes, or after a tab or a newline: none of
    their passwords reaches the page (splitting the text on spaces missed these)."""
    from chronoq.client.values import MoveStatus, ShardMapStatus

    error = (
        'store shard-1 ("postgresql://app:s3cret@db1/x"): could not connect to\n'
        "postgresql://app:s3cret@db1/x:\trefused; dsn=host=db1 password='s3 cret'"
    )
    moves = [MoveStatus("m1", "8-15", "shard-0", "shard-1", "copy", error=error)]
    view = shard_map_view(
        ShardMapStatus(3, [], moves=moves, error=error, moves_error=error), "n1"
    )
    assert "s3cret" not in json.dumps(view) and "s3 cret" not in json.dumps(view)
    assert view["moves"][0]["error"].startswith('store shard-1 ("postgresql://app:***@db1/x")')
    # A DSN across the preview's end: masked before the cut.
    long = "x" * (ERROR_PREVIEW - 20) + " postgresql://app:" + "s3cret" * 10 + "@db1/x"
    cut = shard_map_view(ShardMapStatus(3, [], error=long), "n1")["error"]
    assert "s3cret" not in cut and len(cut) == ERROR_PREVIEW


def test_the_shards_page_masks_every_dsn_and_is_cut_to_the_cluster_caps() -> None:
    """A node that sent a password (an older or a broken one) still shows none; shards past
    the cluster's cap and moves past what a cluster keeps are not listed, and the page says so."""
    from chronoq.client.values import MoveStatus, ShardMapStatus, ShardStatus
    from chronoq.shardmap import MAX_SHARDS

    shards = [ShardStatus("shard-0", "postgresql://app:s3cret@db0/x", "ok", "0-7", 8, 5),
              ShardStatus("shard-1", "host=db1 user=app password=s3cret", "down", "8-15", 8, 0)]
    moves = [MoveStatus(f"m{i}", "8-15", "shard-0", "shard-1", "copy", rows_copied=i,
                        error="cannot reach postgresql://app:s3cret@db1/x")
             for i in range(MAX_SHOWN_MOVES + 5)]
    view = shard_map_view(ShardMapStatus(3, shards, moves_in_progress=1, moves=moves), "n1")
    assert "s3cret" not in json.dumps(view)
    assert [(s["name"], s["health"], s["partitions"], s["pending"]) for s in view["shards"]] == [
        ("shard-0", "ok", "0-7", 5), ("shard-1", "down", "8-15", 0)]
    assert view["shards"][0]["dsn"] == "postgresql://app:***@db0/x"
    assert len(view["moves"]) == MAX_SHOWN_MOVES and view["moves_cut"] is True
    assert view["moves"][1] == {"id": "m1", "partitions": "8-15", "source": "shard-0",
                                "target": "shard-1", "phase": "copy", "rows_copied": 1,
                                "rounds": 0, "driver": "", "error": view["moves"][1]["error"]}
    many = [ShardStatus(f"shard-{i}", "", "ok", "", 0, 0) for i in range(MAX_SHARDS + 1)]
    cut = shard_map_view(ShardMapStatus(1, many), "n1")
    assert len(cut["shards"]) == MAX_SHARDS and cut["shards_cut"] is True
    assert shard_map_view(None, "n1") == {
        "ok": False, "error": "node n1 answered no shard map: upgrade it"}
