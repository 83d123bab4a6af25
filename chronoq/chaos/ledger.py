"""The independent execution ledger: what workers ran, written by the workers themselves.

The scheduler's own tables cannot prove the scheduler right, so every worker process appends
to a JSON-lines file of its own (one per process incarnation, never shared, so no locking):
a ``start`` line before the handler does any work and an ``end`` line after it, each flushed
and fsynced before the handler goes on. A worker SIGKILLed mid-task leaves a start without an
end; a frozen one finishes late. A torn last line (killed mid-write) is ignored on reading.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

from chronoq.chaos.history import Execution

SUFFIX = ".jsonl"


def now_us() -> int:
    return time.time_ns() // 1000


class LedgerWriter:
    """Appends durable records for one worker process incarnation."""

    def __init__(self, path: Path, worker: str) -> None:
        self.path = path
        self.worker = worker
        path.parent.mkdir(parents=True, exist_ok=True)
        self._fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)

    def _append(self, record: dict[str, Any]) -> None:
        line = (json.dumps(record, separators=(",", ":")) + "\n").encode()
        os.write(self._fd, line)  # one write() of a small line: O_APPEND keeps it whole
        os.fsync(self._fd)

    def start(self, task_id: str, attempt: int, run_at_us: int, key: str) -> int:
        """Record that the handler starts now; returns the start time."""
        at = now_us()
        self._append(
            {"e": "start", "task": task_id, "attempt": attempt, "worker": self.worker,
             "pid": os.getpid(), "t": at, "run_at": run_at_us, "key": key}
        )
        return at

    def end(self, task_id: str, attempt: int, outcome: str) -> None:
        self._append(
            {"e": "end", "task": task_id, "attempt": attempt, "worker": self.worker,
             "t": now_us(), "outcome": outcome}
        )

    def close(self) -> None:
        os.close(self._fd)


def read_file(path: Path) -> list[Execution]:
    """The executions of one ledger file, in start order."""
    starts: dict[tuple[str, int], dict[str, Any]] = {}
    ends: dict[tuple[str, int], dict[str, Any]] = {}
    with path.open("rb") as f:
        for raw in f:
            try:
                rec = json.loads(raw)
            except ValueError:
                continue  # a torn last line: the process died mid-write
            ident = (rec["task"], int(rec["attempt"]))
            (starts if rec["e"] == "start" else ends)[ident] = rec
    out = []
    for ident, s in starts.items():
        e = ends.get(ident)
        out.append(
            Execution(
                task_id=s["task"],
                attempt=int(s["attempt"]),
                worker=s["worker"],
                start_us=int(s["t"]),
                end_us=int(e["t"]) if e else None,
                outcome=e["outcome"] if e else None,
                run_at_us=int(s["run_at"]),
                key=s.get("key", ""),
            )
        )
    return sorted(out, key=lambda x: x.start_us)


def read_dir(directory: Path) -> list[Execution]:
    """Every execution of every ledger file in ``directory``, in start order."""
    out: list[Execution] = []
    for path in sorted(directory.glob(f"*{SUFFIX}")):
        out.extend(read_file(path))
    return sorted(out, key=lambda x: x.start_us)


def open_executions(path: Path) -> int:
    """How many handlers of this ledger have started and not ended (tasks in flight)."""
    if not path.exists():
        return 0
    return sum(1 for x in read_file(path) if x.end_us is None)
