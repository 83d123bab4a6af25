from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from hypothesis import given
from hypothesis import strategies as st

from chronoq.errors import InvalidArgument
from chronoq.recurrence import CatchUp, Cron, Every, check, due, next_fire

T0 = datetime(2030, 1, 1, 12, 0, tzinfo=UTC)
aware = st.datetimes(
    min_value=datetime(2000, 1, 1), max_value=datetime(2100, 1, 1), timezones=st.just(UTC)
)


@given(aware, st.integers(min_value=1, max_value=10**7))
def test_every_is_strictly_after_and_on_the_grid(after: datetime, seconds: int) -> None:
    rule = Every(timedelta(seconds=seconds), T0)
    nxt = next_fire(rule, after)
    assert nxt > after or (after < T0 and nxt == T0)
    assert ((nxt - T0) / rule.interval).is_integer()
    assert nxt - rule.interval <= after or nxt == T0


@given(aware, st.sampled_from(["*/5 * * * *", "0 * * * *", "30 2 * * 1-5", "0 0 1 * *"]))
def test_cron_next_is_after_and_matches(after: datetime, expr: str) -> None:
    nxt = next_fire(Cron(expr), after)
    assert nxt > after and nxt.second == 0
    assert next_fire(Cron(expr), nxt - timedelta(seconds=1)) == nxt


def test_cron_in_a_time_zone_follows_dst() -> None:
    rule = Cron("30 9 * * *", "Europe/Paris")
    winter = next_fire(rule, datetime(2030, 3, 1, tzinfo=UTC))
    summer = next_fire(rule, datetime(2030, 4, 1, tzinfo=UTC))
    assert (winter.hour, summer.hour) == (8, 7)  # 09:30 local is 08:30Z in winter, 07:30Z in summer


def test_bad_rules_say_what_to_fix() -> None:
    with pytest.raises(InvalidArgument, match="not a 5-field cron"):
        check(Cron("61 * * * *"))
    with pytest.raises(InvalidArgument, match="not a 5-field cron"):
        check(Cron("* * * * * *"))
    with pytest.raises(InvalidArgument, match="IANA time zone"):
        check(Cron("* * * * *", "Mars/Olympus"))
    with pytest.raises(InvalidArgument, match="at least"):
        check(Every(timedelta(milliseconds=10), T0))


def minutely() -> Every:
    return Every(timedelta(minutes=1), T0)


def test_due_creates_ahead_within_the_lookahead() -> None:
    plan = due(
        minutely(), T0, T0 - timedelta(seconds=30), CatchUp.ALL, lookahead=timedelta(minutes=2)
    )
    assert plan.create == [T0, T0 + timedelta(minutes=1)]
    assert plan.next_fire_at == T0 + timedelta(minutes=2) and plan.skipped == 0


@pytest.mark.parametrize(
    ("policy", "created", "skipped"),
    [(CatchUp.ALL, 12, 0), (CatchUp.LATEST, 2, 10), (CatchUp.NONE, 1, 11)],  # 12:00..12:10 missed
)
def test_catch_up_policies_after_ten_minutes_down(
    policy: CatchUp, created: int, skipped: int
) -> None:
    now = T0 + timedelta(minutes=10, seconds=30)
    plan = due(minutely(), T0, now, policy, lookahead=timedelta(seconds=40))
    assert len(plan.create) == created and plan.skipped == skipped
    assert plan.create[-1] == T0 + timedelta(minutes=11)  # the next one, created ahead
    assert plan.next_fire_at == T0 + timedelta(minutes=12)


def test_catch_up_all_is_bounded_and_resumes() -> None:
    now = T0 + timedelta(days=10)
    first = due(minutely(), T0, now, CatchUp.ALL, limit=1000)
    assert len(first.create) == 1000 and first.next_fire_at == T0 + timedelta(minutes=1000)
    second = due(minutely(), first.next_fire_at, now, CatchUp.ALL, limit=1000)
    assert second.create[0] == T0 + timedelta(minutes=1000)


def test_catch_up_latest_skips_past_a_long_outage_in_one_call() -> None:
    now = T0 + timedelta(days=10)
    plan = due(minutely(), T0, now, CatchUp.LATEST, limit=100, lookahead=timedelta(0))
    assert plan.next_fire_at > now - timedelta(minutes=1)
    assert plan.skipped > 14_000


@given(st.integers(min_value=0, max_value=5000), st.sampled_from(list(CatchUp)))
def test_due_never_repeats_or_goes_back(offset: int, policy: CatchUp) -> None:
    now = T0 + timedelta(seconds=offset * 7)
    plan = due(minutely(), T0, now, policy)
    assert plan.create == sorted(set(plan.create))
    assert all(t < plan.next_fire_at for t in plan.create)
    assert all(t >= now for t in plan.create) or policy is not CatchUp.NONE
