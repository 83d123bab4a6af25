"""What the console's pages show, as JSON-ready dicts: tasks, schedules, queues, shards. Pure.

The queues page shows the counts the partition owners keep (``QueueCounts``), per queue and
state (``QueueTally``), with each queue's oldest READY task and as of when they were counted.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from chronoq.client.values import MoveStatus, ShardMapStatus
from chronoq.limits import KEPT_FINISHED_MOVES, MAX_OPEN_MOVES
from chronoq.models import QueueCounts, Schedule, Task, TaskState
from chronoq.queue_settings import QueueSettings
from chronoq.queuecounts import QueueSnapshot
from chronoq.recurrence import Cron, Every, next_fire
from chronoq.redact import mask_dsn, mask_text
from chronoq.shardmap import MAX_SHARDS

#: States whose tasks the queues page counts (final states grow forever: not counted).
COUNTED_STATES = (TaskState.SCHEDULED, TaskState.READY, TaskState.RUNNING, TaskState.DEAD)
#: States from which a task may be cancelled, or requeued.
CANCELLABLE = frozenset(
    {TaskState.SCHEDULED, TaskState.READY, TaskState.RUNNING, TaskState.DEAD}
)
REQUEUEABLE = frozenset({TaskState.DEAD})
#: Upcoming occurrences listed per schedule.
NEXT_OCCURRENCES = 5
#: Characters of a last error shown in a list (the task page shows it whole).
ERROR_PREVIEW = 200
#: Move records the shards page lists at most: as many as a cluster keeps (open and finished).
MAX_SHOWN_MOVES = MAX_OPEN_MOVES + KEPT_FINISHED_MOVES


def iso(when: datetime | None) -> str | None:
    return when.isoformat() if when is not None else None


def state_name(state: TaskState) -> str:
    return state.name.lower()


def parse_state(text: str) -> TaskState | None:
    """A state by its lower-case name; ``""`` or ``"any"`` is None (every state)."""
    name = text.strip().lower()
    if name in ("", "any"):
        return None
    try:
        return TaskState[name.upper()]
    except KeyError:
        known = ", ".join(state_name(s) for s in TaskState)
        raise ValueError(f"state: {text!r} is not one of any, {known}") from None


def task_summary(task: Task) -> dict[str, Any]:
    """A row of the task list (no payload: the task page shows it)."""
    return {
        "id": task.id,
        "namespace": task.namespace,
        "queue": task.queue,
        "state": state_name(task.state),
        "run_at": iso(task.run_at),
        "attempt": task.attempt,
        "max_attempts": task.max_attempts,
        "priority": task.priority,
        "payload_bytes": len(task.payload),
        "last_error": (task.last_error or "")[:ERROR_PREVIEW],
        "cancellable": task.state in CANCELLABLE,
        "requeueable": task.state in REQUEUEABLE,
    }


def task_detail(task: Task) -> dict[str, Any]:
    """Every field of a task, for its page (the payload is shown apart)."""
    return {
        **task_summary(task),
        "last_error": task.last_error or "",
        "idempotency_key": task.idempotency_key or "",
        "partition": task.partition,
        "bucket": task.bucket,
        "misfire_policy": task.misfire_policy.name.lower(),
        "misfire_grace_s": task.misfire_grace.total_seconds(),
        "lease_timeout_s": task.lease_timeout.total_seconds(),
        "backoff_initial_s": task.backoff_initial.total_seconds(),
        "backoff_max_s": task.backoff_max.total_seconds(),
        "worker_id": task.worker_id or "",
        "created_at": iso(task.created_at),
        "fired_at": iso(task.fired_at),
        "lease_until": iso(task.lease_until),
        "finished_at": iso(task.finished_at),
    }


def in_window(task: Task, start: datetime | None, end: datetime | None) -> bool:
    """Whether a task's ``run_at`` falls in [start, end) (either side open when None)."""
    return (start is None or task.run_at >= start) and (end is None or task.run_at < end)


def next_occurrences(schedule: Schedule, count: int = NEXT_OCCURRENCES) -> list[datetime]:
    """The schedule's next ``count`` fire times from its ``next_fire_at`` (none when paused)."""
    if schedule.paused:
        return []
    out = [schedule.next_fire_at]
    while len(out) < count:
        out.append(next_fire(schedule.spec.rule, out[-1]))
    return out


def schedule_row(schedule: Schedule) -> dict[str, Any]:
    rule = schedule.spec.rule
    if isinstance(rule, Cron):
        text = f"cron {rule.expression} ({rule.timezone})"
    else:
        text = f"every {_seconds(rule)} s"
    return {
        "name": schedule.spec.name,
        "namespace": schedule.spec.namespace,
        "queue": schedule.spec.queue,
        "rule": text,
        "paused": schedule.paused,
        "paused_reason": schedule.paused_reason or "",
        "next": [iso(t) for t in next_occurrences(schedule)],
        "last_fire_at": iso(schedule.last_fire_at),
        "created_total": schedule.created_total,
        "skipped_total": schedule.skipped_total,
    }


def _seconds(rule: Every) -> str:
    return f"{rule.interval.total_seconds():g}"


@dataclass
class QueueRow:
    queue: str
    counts: dict[str, int] = field(default_factory=dict)
    oldest_ready: datetime | None = None
    rate: float = 0.0
    burst: float = 0.0


@dataclass
class QueueTally:
    """Per-queue counts of a namespace, state by state, as the node counted them."""

    rows: dict[str, QueueRow] = field(default_factory=dict)
    cut_states: set[TaskState] = field(default_factory=set)  # counted only in part
    kept: QueueSnapshot | None = None  # the owners' counts, when taken from QueueCounts

    def take(self, snap: QueueSnapshot) -> None:
        """Take the counts the owners keep (every queue's, exact as of ``snap.as_of``)."""
        self.kept = snap
        for t in snap.queues:
            row = self.rows.setdefault(t.queue, QueueRow(t.queue))
            c = t.counts
            row.counts = {"scheduled": c.scheduled, "ready": c.ready, "running": c.running,
                          "dead": c.dead}
            row.oldest_ready = t.oldest_ready_at

    def add(self, counts: QueueCounts) -> None:
        """Take the node's counts; a queue's ready age is that of its earliest ``run_at``
        among the ready tasks (when the oldest became due)."""
        for c in counts.counts:
            row = self.rows.setdefault(c.queue, QueueRow(c.queue))
            name = state_name(c.state)
            row.counts[name] = row.counts.get(name, 0) + c.count
            if c.state is TaskState.READY and c.oldest_run_at is not None:
                if row.oldest_ready is None or c.oldest_run_at < row.oldest_ready:
                    row.oldest_ready = c.oldest_run_at
        self.cut_states |= counts.capped | counts.truncated

    def as_json(self, limits: Mapping[str, tuple[float, float]], now: datetime) -> dict[str, Any]:
        for queue, (rate, burst) in limits.items():
            row = self.rows.setdefault(queue, QueueRow(queue))
            row.rate, row.burst = rate, burst
        kept = self.kept
        return {
            "states": [state_name(s) for s in COUNTED_STATES],
            "cut_states": sorted(state_name(s) for s in self.cut_states),
            "as_of": kept.as_of.isoformat() if kept and kept.as_of else None,
            "staleness_s": (
                kept.staleness.total_seconds()
                if kept is not None and kept.staleness is not None
                else None
            ),
            "uncounted_partitions": kept.uncounted_partitions if kept else 0,
            "truncated": kept.truncated if kept else False,
            "queues": [
                {
                    "queue": row.queue,
                    "counts": {state_name(s): row.counts.get(state_name(s), 0)
                               for s in COUNTED_STATES},
                    "ready_age_s": (now - row.oldest_ready).total_seconds()
                    if row.oldest_ready is not None else None,
                    "rate": row.rate,
                    "burst": row.burst,
                }
                for row in sorted(self.rows.values(), key=lambda r: r.queue)
            ],
        }


def shard_map_view(shard_map: ShardMapStatus | None, node_id: str) -> dict[str, Any]:
    """The shards page: each shard (DSN masked again here, so that a node that sent one
    unmasked still shows no password) and the moves, cut to the cluster's own caps."""
    if shard_map is None:
        return {"ok": False, "error": f"node {node_id} answered no shard map: upgrade it"}
    return {
        "ok": True,
        "answered_by": node_id,
        "version": shard_map.version,
        "error": _preview(shard_map.error),
        "shards": [
            {
                "name": s.name,
                "dsn": mask_dsn(s.dsn),
                "health": s.health,
                "partitions": s.partitions,
                "partition_count": s.partition_count,
                "pending": s.pending,
            }
            for s in shard_map.shards[:MAX_SHARDS]
        ],
        "shards_cut": len(shard_map.shards) > MAX_SHARDS,
        "moves_in_progress": shard_map.moves_in_progress,
        "moves_error": _preview(shard_map.moves_error),
        "moves": [move_row(m) for m in shard_map.moves[:MAX_SHOWN_MOVES]],
        "moves_cut": len(shard_map.moves) > MAX_SHOWN_MOVES,
    }


def _preview(error: str) -> str:
    """An error's first characters, its DSN passwords masked first (a cut through a DSN
    would leave a password without the ``@`` that shows where it ends)."""
    return mask_text(error)[:ERROR_PREVIEW]


def move_row(move: MoveStatus) -> dict[str, Any]:
    return {
        "id": move.id,
        "partitions": move.partitions,
        "source": move.source,
        "target": move.target,
        "phase": move.phase,
        "rows_copied": move.rows_copied,
        "rounds": move.rounds,
        "driver": move.driver,
        "error": _preview(move.error),
    }


def queue_settings_row(s: QueueSettings) -> dict[str, Any]:
    """A queue's settings for the Queues page."""
    return {
        "queue": s.queue,
        "paused": s.paused,
        "paused_at": s.paused_at.isoformat() if s.paused_at is not None else None,
        "max_running_per_key": s.max_running_per_key,
        "max_starts_per_key": s.max_starts_per_key,
    }
