"""What the lab remembers of its own actions: loads, clock advances, takeovers, executions."""

from __future__ import annotations

import dataclasses
import uuid
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any


@dataclass
class Advance:
    """One "advance the clock" and what became of the tasks it made due."""

    start: datetime
    end: datetime
    ids: list[uuid.UUID]
    fired: int = 0
    executed: int = 0
    firers: int = 0
    fired_ms: float | None = None  # real time from the jump until all of them fired

    def as_json(self) -> dict[str, Any]:
        return {
            "from": self.start.isoformat(),
            "to": self.end.isoformat(),
            "due": len(self.ids),
            "fired": self.fired,
            "executed": self.executed,
            "firers": self.firers,
            "fired_ms": self.fired_ms,
        }


@dataclass
class Load:
    total: int
    done: int = 0
    seconds: float | None = None
    error: str | None = None


@dataclass
class Takeover:
    partition: int
    victim: str
    old_token: int
    lost: int  # partitions the victim owned
    killed_at: float  # monotonic
    new_owner: str | None = None
    new_token: int | None = None
    seconds: float | None = None
    all_reowned_s: float | None = None

    def as_json(self) -> dict[str, Any]:
        return {k: v for k, v in dataclasses.asdict(self).items() if k != "killed_at"}


@dataclass
class Counters:
    """Executions seen by the lab's own workers: an independent ledger of the handler runs."""

    executed: set[str] = field(default_factory=set)
    reexecuted: int = 0
