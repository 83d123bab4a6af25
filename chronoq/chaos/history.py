"""What a chaos run recorded, as plain data: the input of the checker and the report.

Four independent sources, each written by a different party, so that none can vouch for
itself:

- the *client log*: what each submit and cancel call was told (accepted, rejected, ambiguous);
- the *ledger*: executions as the worker processes recorded them, durably, outside the store;
- the *store*: the final rows of the task table and the partition fences;
- the *observer* and the *fault log*: owner keys seen in etcd, and every fault injected, when.

All instants are integer epoch microseconds (``*_us``) of the one machine's wall clock: the
run happens on one host, so every party reads the same clock (a node whose clock was jumped
on purpose is the exception the checker corrects for). Pure: no I/O beyond JSON.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field, fields
from datetime import datetime
from pathlib import Path
from typing import Any, TypeVar

T = TypeVar("T")


def to_us(when: datetime) -> int:
    """An aware datetime as integer epoch microseconds."""
    if when.tzinfo is None:
        raise ValueError("naive datetime: chaos history times must carry a zone")
    return round(when.timestamp() * 1_000_000)


# Submit outcomes, as the client saw them.
ACCEPTED = "accepted"  # a node answered with the task: durably committed
REJECTED = "rejected"  # a definite refusal (INVALID_ARGUMENT, ...): never stored
AMBIGUOUS = "ambiguous"  # every try ended UNAVAILABLE/timeout: may or may not be stored

# Cancel outcomes.
CANCELLED = "cancelled"  # the node answered CANCELLED
REFUSED = "refused"  # FAILED_PRECONDITION: already finished

# Ledger execution outcomes (None: no end record, the worker died or froze mid-task).
OK = "ok"
ERROR = "error"  # the handler failed on purpose: a planned retry
FATAL = "fatal"
STOPPED = "cancelled"  # the SDK cancelled the handler (lease lost, task cancelled, shutdown)


@dataclass(frozen=True)
class SubmitRecord:
    """One planned task and what the client was told about it."""

    key: str  # idempotency key, unique per task of the run
    kind: str  # plain, long, retry, exhaust, fatal, cancel, immediate
    run_at_us: int  # the run_at the client asked for
    expect: str  # succeeded, dead or cancelled (informative: faults may change it)
    outcome: str  # ACCEPTED, REJECTED or AMBIGUOUS
    task_id: str | None
    sent_us: int
    answered_us: int
    calls: int  # gRPC calls made, retries with the same key included
    error: str = ""


@dataclass(frozen=True)
class CancelRecord:
    key: str
    task_id: str
    sent_us: int
    answered_us: int
    outcome: str  # CANCELLED, REFUSED or AMBIGUOUS
    error: str = ""


@dataclass(frozen=True)
class Execution:
    """One run of a handler, from the ledger of the worker process that ran it."""

    task_id: str
    attempt: int
    worker: str  # the worker process incarnation, e.g. "w1.2"
    start_us: int
    end_us: int | None  # None: the worker died or was frozen before it could record an end
    outcome: str | None
    run_at_us: int  # the task's run_at as the claim delivered it (a retry's backoff time)
    key: str = ""


@dataclass(frozen=True)
class TaskRow:
    """A task as the store holds it at the end of the run."""

    id: str
    key: str | None
    partition: int
    state: str  # TaskState name
    attempt: int
    run_at_us: int
    fired_at_us: int | None
    fired_by: str | None  # a node id, or submit / retry / requeue
    fire_token: int | None
    last_error: str | None


@dataclass(frozen=True)
class OwnerEvent:
    """An owner key changed in etcd: ``owner`` None means the key was deleted."""

    at_us: int
    partition: int
    owner: str | None
    token: int | None  # the key's create revision: the fencing token


@dataclass(frozen=True)
class FaultRecord:
    """One injected fault: what, on whom, from when to when (the window it acted in)."""

    kind: str
    target: str  # node id, worker incarnation, etcd member, "postgres", "cluster"
    start_us: int
    end_us: int
    detail: dict[str, Any] = field(default_factory=dict)  # e.g. {"offset_ms": 3000}
    error: str = ""  # the injection failed part-way (still recorded, still shaded)


@dataclass(frozen=True)
class Params:
    """The constants the checks are judged by."""

    lease_ttl_s: float
    tick_s: float
    lease_timeout_s: float
    partitions: int
    clock_tolerance_s: float = 0.010  # rounding of µs timestamps between parties
    failover_slack_s: float = 1.0  # etcd expiry lag + claim + fence write, on a busy host
    explain_slack_s: float = 1.0  # timing noise when matching a duplicate to a fault
    # Longest execution gap allowed around a node kill or freeze: a frozen node is noticed
    # and avoided by clients within about a second; plus a tick and a claim on a busy host.
    exec_gap_bound_s: float = 2.0


@dataclass
class History:
    params: Params
    started_us: int
    ended_us: int
    submits: list[SubmitRecord] = field(default_factory=list)
    cancels: list[CancelRecord] = field(default_factory=list)
    executions: list[Execution] = field(default_factory=list)
    tasks: list[TaskRow] = field(default_factory=list)
    owners: list[OwnerEvent] = field(default_factory=list)
    faults: list[FaultRecord] = field(default_factory=list)
    fences: dict[int, int] = field(default_factory=dict)  # partition → final token
    meta: dict[str, Any] = field(default_factory=dict)  # seed, command, sizes

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> History:
        return cls(
            params=Params(**data["params"]),
            started_us=data["started_us"],
            ended_us=data["ended_us"],
            submits=_list(SubmitRecord, data.get("submits", [])),
            cancels=_list(CancelRecord, data.get("cancels", [])),
            executions=_list(Execution, data.get("executions", [])),
            tasks=_list(TaskRow, data.get("tasks", [])),
            owners=_list(OwnerEvent, data.get("owners", [])),
            faults=_list(FaultRecord, data.get("faults", [])),
            fences={int(p): int(t) for p, t in data.get("fences", {}).items()},
            meta=dict(data.get("meta", {})),
        )

    def save(self, path: Path) -> None:
        path.write_text(json.dumps(self.to_json()))

    @classmethod
    def load(cls, path: Path) -> History:
        return cls.from_json(json.loads(path.read_text()))


def _list(cls: type[T], items: list[dict[str, Any]]) -> list[T]:
    names = {f.name for f in fields(cls)}  # type: ignore[arg-type]
    return [cls(**{k: v for k, v in item.items() if k in names}) for item in items]
