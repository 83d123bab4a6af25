"""The checker: pure functions from a recorded ``History`` to a verdict.

Five checks, each a property chronoq promises, judged against records the scheduler did not
write itself (the client log, the workers' ledger, etcd's owner keys, the fault log):

``none_lost``
    Every accepted task ends SUCCEEDED (with a ledger entry of a successful run of its final
    attempt), DEAD with a reason, or CANCELLED when a cancel was asked for. An ambiguous
    submit may be absent; if present it is held to the same rule. Nothing runs or exists
    that no client submitted.
``none_early``
    No execution starts before its run_at (the original one, and a retry's backoff time),
    within ``clock_tolerance_s`` of timestamp rounding: the run is on one host, so every
    party reads one clock. Nodes hand their partitions off while their clock is off by more
    than ``max_clock_offset_ms`` (recorded in the history's meta) from the store's, so an
    early run during a clock jump is excused only up to that bound. Histories recorded
    before nodes checked their clocks (no such meta) excuse up to the jump's offset.
``duplicates_explained``
    An execution that follows one which did not fail on purpose is an extra one. Each needs
    an injected fault: a kill or pause of the worker that ran the earlier one, during it; or
    a node, PostgreSQL or clock fault overlapping the span from the earlier start to the
    extra start (a lost heartbeat or acknowledgement: a lease expiry, an ambiguous commit).
``failover_gaps``
    After a node fault, tasks of the partitions the node owned fire within the lease TTL plus
    a tick (plus ``failover_slack_s``: etcd's expiry lag, the claim and the fence write on a
    busy host). After a PostgreSQL or etcd fault, within the same bound from the heal. A
    fault stacked on such an outage (one that began before the task was late) counts, for
    the partitions the outage stopped (a shard's, or every one), from its heal: nobody can
    take them over before it.
``fencing``
    Per partition, in firing order, fencing tokens never go back; one node per token; the
    token is the one etcd issued to that node; none is above the store's final fence.
``execution_gap``
    The execution gap is the longest time during which some task was due (its run_at had
    passed) and no worker started any task. It is reported for every fault (the longest gap
    that overlaps the fault's window) and bounded (``exec_gap_bound_s``) for node kills and
    freezes: the other nodes keep firing, so workers with every node's address must keep
    starting tasks, whatever one node does.

Clock jumps: a node measures its clock against the store's and stops firing while it is off
by more than a small bound, so a jump of X costs no early run beyond that bound. A clock that
drifts crosses the bound between two measurements, so the node may fire until its next one
acts: an early run during a drift is excused up to the bound plus what the drift adds in a
measurement interval and a second (``Drift.excusable_ms``); what that node wrote as
``fired_at`` is corrected by the drift's offset at that time. Older
histories came from nodes that trusted their clock (a node X ahead ran tasks up to X early,
one X behind fired up to X late): the checker holds them to that (an early run beyond X, or
a gap beyond the bound plus X, still fails), and corrects the ``fired_at`` such a node wrote
with the tokens it held while skewed.
"""

from __future__ import annotations

from chronoq.chaos.checks.causes import (
    DUPLICATE_CAUSES,
    EXEC_GAP_BOUNDED,
    FAILOVER,
    GRACEFUL,
    INFRA,
    NODE_FREEZES,
    NOT_OWNER,
    SHARD_OUTAGE,
    SLOW_STORE_LINKS,
    STORE_FAILOVER,
    WORKER,
)
from chronoq.chaos.checks.clocks import drift_correction, real_fired_at, skewed_tokens
from chronoq.chaos.checks.duplicates import check_duplicates, explain
from chronoq.chaos.checks.early import check_none_early
from chronoq.chaos.checks.fencing import check_fencing
from chronoq.chaos.checks.figures import fault_effects, figures, fire_lateness, shard_outages
from chronoq.chaos.checks.gaps import Owners, check_execution_gaps, check_gaps, execution_gaps
from chronoq.chaos.checks.lost import TERMINAL, check_none_lost, rows_of
from chronoq.chaos.checks.verdict import (
    CHECKS,
    US,
    Duplicate,
    ExecGap,
    Gap,
    Verdict,
    Violation,
)
from chronoq.chaos.history import History

__all__ = [
    "CHECKS", "DUPLICATE_CAUSES", "EXEC_GAP_BOUNDED", "FAILOVER", "GRACEFUL", "INFRA",
    "NODE_FREEZES", "NOT_OWNER", "SHARD_OUTAGE", "SLOW_STORE_LINKS", "STORE_FAILOVER",
    "TERMINAL", "US", "WORKER", "Duplicate", "ExecGap", "Gap", "Owners", "Verdict", "Violation",
    "check", "check_duplicates", "check_execution_gaps", "check_fencing", "check_gaps",
    "check_none_early", "check_none_lost", "drift_correction", "execution_gaps", "explain",
    "fault_effects", "fire_lateness", "real_fired_at", "shard_outages", "skewed_tokens",
]


def check(history: History) -> Verdict:
    """Run every check; the verdict lists each violation and the run's figures."""
    v = Verdict()
    rows = rows_of(history)
    lost = check_none_lost(history, rows, v)
    early_ok, early_bad = check_none_early(history, rows, v)
    check_duplicates(history, v)
    check_gaps(history, v)
    check_execution_gaps(history, v)
    unverified = check_fencing(history, v)
    v.figures = figures(history, rows, v, lost, early_ok, early_bad, unverified)
    return v
