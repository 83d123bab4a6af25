"""``fencing``: per partition, fencing tokens never go back, one node per token, each the
one etcd issued, none above the store's final fence."""

from __future__ import annotations

from chronoq.chaos.checks.causes import NOT_OWNER
from chronoq.chaos.checks.clocks import drifts_of, real_fired_at, skewed_tokens
from chronoq.chaos.checks.verdict import Verdict, Violation
from chronoq.chaos.history import History, TaskRow


def check_fencing(history: History, v: Verdict) -> int:
    """Returns how many (partition, token) pairs etcd's record could not confirm."""
    skew = skewed_tokens(history)
    drifts = drifts_of(history)
    issued: dict[tuple[int, int], str] = {
        (e.partition, e.token): e.owner
        for e in history.owners if e.owner is not None and e.token is not None
    }
    fires = sorted(
        ((r.partition, real_fired_at(r, skew, drifts) or 0, r) for r in history.tasks
         if r.fire_token is not None and r.fired_by not in NOT_OWNER),
        key=lambda t: (t[0], t[1]),
    )
    last: dict[int, TaskRow] = {}
    node_of: dict[tuple[int, int], str] = {}
    unverified: set[tuple[int, int]] = set()
    for part, _at, r in fires:
        token = r.fire_token
        assert token is not None
        prev = last.get(part)
        if prev is not None and prev.fire_token is not None and token < prev.fire_token:
            v.violations.append(Violation(
                "fencing", f"partition {part}: {r.fired_by} fired with token {token} after "
                f"{prev.fired_by} fired with token {prev.fire_token}", r.id))
        last[part] = r
        holder = node_of.setdefault((part, token), r.fired_by or "")
        if holder != r.fired_by:
            v.violations.append(Violation(
                "fencing", f"partition {part}: token {token} fired by {holder} and "
                f"{r.fired_by}", r.id))
        grantee = issued.get((part, token))
        if grantee is None:
            unverified.add((part, token))
        elif grantee != r.fired_by:
            v.violations.append(Violation(
                "fencing", f"partition {part}: etcd issued token {token} to {grantee}, "
                f"but {r.fired_by} fired with it", r.id))
        fence = history.fences.get(part)
        if fence is not None and token > fence:
            v.violations.append(Violation(
                "fencing", f"partition {part}: fired with token {token} above the store's "
                f"fence {fence}", r.id))
    return len(unverified)
