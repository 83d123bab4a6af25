"""What the checks find: violations, duplicates, the gaps after faults, and the verdict
that gathers them."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from chronoq.chaos.history import Execution

CHECKS = (
    "none_lost", "none_early", "duplicates_explained", "failover_gaps", "fencing",
    "execution_gap",
)

US = 1_000_000


@dataclass(frozen=True)
class Violation:
    check: str
    detail: str
    task_id: str | None = None


@dataclass(frozen=True)
class Duplicate:
    task_id: str
    earlier: Execution
    extra: Execution
    explanation: str | None  # None: unexplained


@dataclass(frozen=True)
class Gap:
    fault: int  # index in history.faults
    kind: str
    target: str
    start_us: int
    gap_s: float | None  # None: no task of those partitions came due in the window
    bound_s: float
    tasks: int

    @property
    def ok(self) -> bool:
        return self.gap_s is None or self.gap_s <= self.bound_s


@dataclass(frozen=True)
class ExecGap:
    """The longest execution gap that overlaps one fault's window."""

    fault: int  # index in history.faults
    kind: str
    target: str
    start_us: int  # when the gap began (None gap: the fault's start)
    gap_s: float | None  # None: no task was due and waiting during the fault
    bound_s: float | None  # None: reported, not bounded, for this kind of fault

    @property
    def ok(self) -> bool:
        return self.gap_s is None or self.bound_s is None or self.gap_s <= self.bound_s


@dataclass
class Verdict:
    violations: list[Violation] = field(default_factory=list)
    duplicates: list[Duplicate] = field(default_factory=list)
    gaps: list[Gap] = field(default_factory=list)
    exec_gaps: list[ExecGap] = field(default_factory=list)
    figures: dict[str, Any] = field(default_factory=dict)

    @property
    def checks(self) -> dict[str, bool]:
        failed = {v.check for v in self.violations}
        return {c: c not in failed for c in CHECKS}

    @property
    def ok(self) -> bool:
        return not self.violations
