"""Move records: what an online move of partitions between store shards has done so far.

Pure, no I/O. The driver (``chronoq.coordinator.moves``) writes a record to etcd
(``/chronoq/<cluster>/moves/<id>``) *before* each phase acts, so whoever reads it after a
crash knows the furthest the move may have gone:

    requested ─▶ prepare ─▶ copy ─▶ catch_up ─▶ cut_over ─commit─▶ committed ─▶ clean_up ─▶ done
        any phase before committed ──▶ rolling_back ──▶ rolled_back

``committed`` is written in the same etcd transaction as the map that moves the partitions,
so the record and the map never disagree. A record whose driver is gone (its move key
expired with its lease) is taken over by the next leader: ``recovery`` says whether it runs
it from the start (nothing acted yet), rolls it back (before the commit), or finishes it
(after). A value that does not parse is refused whole (``MoveRecordInvalid``).
"""

from __future__ import annotations

import enum
import json
import re
import secrets
from collections.abc import Sequence
from dataclasses import asdict, dataclass, replace
from typing import Any

from chronoq.errors import MoveRecordInvalid as MoveRecordInvalid
from chronoq.shardmap import Move, format_partitions, shard_number

#: Bytes of a stored record read at most (a partition list of 1024 single partitions fits).
MAX_RECORD_BYTES = 64 * 1024
#: Characters of a record's error message kept.
MAX_ERROR_CHARS = 400

_MOVE_ID = re.compile(r"m[0-9a-f]{12}")
#: A record's partition lists besides ``partitions`` (stored as ranges, empty as "").
_LISTS = ("cut", "group", "returned")


class Phase(enum.StrEnum):
    REQUESTED = "requested"
    PREPARE = "prepare"
    COPY = "copy"
    CATCH_UP = "catch_up"
    CUT_OVER = "cut_over"
    COMMITTED = "committed"
    CLEAN_UP = "clean_up"
    DONE = "done"
    ROLLING_BACK = "rolling_back"
    ROLLED_BACK = "rolled_back"


#: Phases after which nothing is left to do.
FINAL = frozenset({Phase.DONE, Phase.ROLLED_BACK})
#: Phases in which the move may have changed a shard but the map does not say so yet.
BEFORE_COMMIT = frozenset(
    {Phase.PREPARE, Phase.COPY, Phase.CATCH_UP, Phase.CUT_OVER, Phase.ROLLING_BACK}
)
#: Phases after the commit point: only forward from here.
AFTER_COMMIT = frozenset({Phase.COMMITTED, Phase.CLEAN_UP})

#: The order the driver goes through, each phase's successor.
FORWARD: dict[Phase, Phase] = {
    Phase.REQUESTED: Phase.PREPARE,
    Phase.PREPARE: Phase.COPY,
    Phase.COPY: Phase.CATCH_UP,
    Phase.CATCH_UP: Phase.CUT_OVER,
    Phase.CUT_OVER: Phase.COMMITTED,
    Phase.COMMITTED: Phase.CLEAN_UP,
    Phase.CLEAN_UP: Phase.DONE,
    Phase.ROLLING_BACK: Phase.ROLLED_BACK,
}


class Recovery(enum.Enum):
    """What a driver does with a record it takes over."""

    START = "start"  # nothing acted yet: run it
    ROLL_BACK = "roll_back"  # acted before the commit: undo
    FINISH = "finish"  # committed: clean up the source
    NOTHING = "nothing"  # final


def recovery(phase: Phase) -> Recovery:
    """What a new driver does with a record left in ``phase`` (before the commit: roll back;
    after: forward). Copy and catch-up rounds could restart from an emptied target, but a
    rollback is one path that is always safe, and the operator starts the move again."""
    if phase in FINAL:
        return Recovery.NOTHING
    if phase is Phase.REQUESTED:
        return Recovery.START
    if phase in AFTER_COMMIT:
        return Recovery.FINISH
    return Recovery.ROLL_BACK


def cut_over_groups(
    partitions: Sequence[int],
    listed: int,
    seconds: float,
    freeze_budget: float,
    *,
    listed_partitions: int | None = None,
    share: float = 0.5,
) -> list[tuple[int, ...]]:
    """The groups a move cuts over one after another, each frozen step within the budget.

    A frozen step is one listing of its group's rows plus the few changes since the last
    round, so its length is about the group's rows over the last round's rate (``listed``
    rows of ``listed_partitions`` partitions in ``seconds``). Groups aim at ``share`` of
    the budget (the changes, the fences and the make-live come on top); at least one
    partition each (a single partition larger than the budget is frozen longer).
    """
    parts = tuple(partitions)
    if not parts:
        return []
    counted = listed_partitions if listed_partitions else len(parts)
    if listed <= 0 or seconds <= 0:
        return [parts]
    per_partition = seconds / counted  # seconds of listing per partition
    size = max(1, int(share * freeze_budget / per_partition)) if per_partition > 0 else len(parts)
    return [parts[i : i + size] for i in range(0, len(parts), size)]


def new_move_id() -> str:
    """A fresh move id: ``m`` and 12 hex digits."""
    return "m" + secrets.token_hex(6)


def check_move_id(move_id: str) -> str:
    if not isinstance(move_id, str) or _MOVE_ID.fullmatch(move_id) is None:
        raise MoveRecordInvalid(f"move id {str(move_id)[:40]!r} is not of the form m + 12 hex")
    return move_id


@dataclass(frozen=True)
class MoveRecord:
    """One move as etcd holds it. ``base_version``: the map version it was planned on;
    ``next_version``: the version its commit puts (0 until the cut-over fixes it)."""

    id: str
    partitions: tuple[int, ...]
    source: str
    target: str
    phase: Phase = Phase.REQUESTED
    base_version: int = 0
    next_version: int = 0
    rows_copied: int = 0
    rounds: int = 0
    driver: str = ""  # the node driving it (its move token in ``token``)
    token: int = 0
    error: str = ""  # why it was rolled back
    requested_at: float = 0.0  # unix seconds
    updated_at: float = 0.0
    committed_at: float = 0.0
    #: Partitions committed to the target so far (the cut-over goes a group at a time).
    cut: tuple[int, ...] = ()
    #: The group being cut over now (frozen on the source at most this long).
    group: tuple[int, ...] = ()
    #: Partitions rolled back to the source while the ones cut before go forward.
    returned: tuple[int, ...] = ()

    @classmethod
    def requested(cls, move: Move, base_version: int, now: float) -> MoveRecord:
        return cls(
            new_move_id(),
            tuple(move.partitions),
            move.source,
            move.target,
            base_version=base_version,
            requested_at=now,
            updated_at=now,
        )

    @property
    def move(self) -> Move:
        return Move(self.partitions, self.source, self.target)

    @property
    def remaining(self) -> tuple[int, ...]:
        """The partitions not cut over yet."""
        done = set(self.cut) | set(self.returned)
        return tuple(p for p in self.partitions if p not in done)

    @property
    def final(self) -> bool:
        return self.phase in FINAL

    def at(self, phase: Phase, now: float, **changes: Any) -> MoveRecord:
        """This record in ``phase`` (with other fields changed), stamped ``now``."""
        if "error" in changes:
            changes["error"] = str(changes["error"])[:MAX_ERROR_CHARS]
        return replace(self, phase=phase, updated_at=now, **changes)

    def to_json(self) -> str:
        doc = asdict(self)
        for name in ("partitions", *_LISTS):
            doc[name] = format_partitions(getattr(self, name))
        doc["phase"] = self.phase.value
        return json.dumps(doc, separators=(",", ":"))

    @classmethod
    def from_json(cls, data: str | bytes) -> MoveRecord:
        """A record read back from ``to_json``; ``MoveRecordInvalid`` for anything else."""
        from chronoq.shardmap import _parse  # the same lists the map reads

        if len(data) > MAX_RECORD_BYTES:
            raise MoveRecordInvalid(f"move record: {len(data)} bytes, more than allowed")
        try:
            doc = json.loads(data)
            if not isinstance(doc, dict):
                raise ValueError("not an object")
            partitions = tuple(_parse(str(doc["partitions"]), 1 << 16, MAX_RECORD_BYTES))
            for name in (doc["source"], doc["target"]):
                shard_number(name)
            ints = {
                k: int(doc.get(k, 0))
                for k in ("base_version", "next_version", "rows_copied", "rounds", "token")
            }
            lists = {
                k: tuple(_parse(str(doc[k]), 1 << 16, MAX_RECORD_BYTES)) if doc.get(k) else ()
                for k in _LISTS
            }
            floats = {
                k: float(doc.get(k, 0.0)) for k in ("requested_at", "updated_at", "committed_at")
            }
            record = cls(
                check_move_id(doc["id"]),
                partitions,
                doc["source"],
                doc["target"],
                Phase(doc["phase"]),
                driver=str(doc.get("driver", ""))[:128],
                error=str(doc.get("error", ""))[:MAX_ERROR_CHARS],
                **ints,  # type: ignore[arg-type]
                **floats,  # type: ignore[arg-type]
            )
            return replace(
                record, cut=lists["cut"], group=lists["group"], returned=lists["returned"]
            )
        except MoveRecordInvalid:
            raise
        except (ValueError, KeyError, TypeError, UnicodeDecodeError, RecursionError) as exc:
            raise MoveRecordInvalid(f"move record: {str(exc)[:120]}") from None
