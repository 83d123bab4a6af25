"""Idempotency across the history: a keyed submit answers its key's first task also after
the sweep moved that task from ``tasks`` into ``task_history`` (``chronoq.store.history``),
until the task's slice is dropped.

The unique index on (namespace, idempotency_key) is on ``tasks`` only, so the history is
checked by a read, and the read must not miss a task the sweep moves while the submit runs.
Under READ COMMITTED the order that cannot miss it is: insert first (a key whose first task
is still in ``tasks`` conflicts; one whose DELETE by a concurrent sweep is in flight makes
the insert wait for that sweep to commit), then, in a later statement of the same transaction
(a fresh snapshot, taken after that commit), look the keys this insert created up in the
history (``check_fresh``). A hit means the key's first task is there: the transaction is
rolled back whole (an insert may have had other effects: a debounce moved a task, a unique
window closed) and the submit runs again without the keys found, which are answered by their
first task (``guarded``). Two submits of the same keys whose first tasks are in the history
both insert them, and may wait for each other in crossed orders: the deadlock PostgreSQL
ends is one more round, too. The cost is one statement per keyed batch; a batch without
keys pays nothing.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from typing import Any, TypeVar

import asyncpg

from chronoq.errors import ChronoqError, StoreUnavailable
from chronoq.models import TaskSpec
from chronoq.store.sql import q

#: Rounds of one submit: each round that finds keys in the history answers them and tries
#: the rest again, and a key's task moves into the history once, so a round more than the
#: moves racing one submit is rare; past this, UNAVAILABLE (nothing written, safe to retry).
HISTORY_TRIES = 4

R = TypeVar("R")
Key = tuple[str, str]


class KeyRetired(ChronoqError):
    """Keys this submit inserted whose first task is in the history (rolled back; never
    leaves the store: ``guarded`` answers them)."""

    def __init__(self, found: dict[Key, Any]) -> None:
        super().__init__(f"{len(found)} keys found in the task history")
        self.found = found


def _deadlock(exc: BaseException) -> bool:
    return isinstance(exc, asyncpg.DeadlockDetectedError) or isinstance(
        exc.__cause__, asyncpg.DeadlockDetectedError
    )


def has_idempotency_keys(specs: Sequence[TaskSpec]) -> bool:
    return any(s.idempotency_key is not None for s in specs)


def _key(spec: TaskSpec) -> Key | None:
    return None if spec.idempotency_key is None else (spec.namespace, spec.idempotency_key)


async def check_fresh(conn: Any, specs: Sequence[TaskSpec], created: Sequence[bool]) -> None:
    """Inside the insert's transaction, after it: ``KeyRetired`` (which rolls it back) when a
    key that this insert created has its first task in the history."""
    keys: dict[str, dict[str, None]] = {}
    for s, made in zip(specs, created, strict=True):
        if made and s.idempotency_key is not None:
            keys.setdefault(s.namespace, {})[s.idempotency_key] = None
    found: dict[Key, Any] = {}
    for ns, some in keys.items():
        for r in await conn.fetch(q("retired_by_idempotency_key"), ns, list(some)):
            found[(ns, r["idempotency_key"])] = r
    if found:
        raise KeyRetired(found)


async def guarded(
    specs: Sequence[TaskSpec],
    partitions: Sequence[int] | None,
    attempt: Callable[[list[TaskSpec], list[int] | None], Awaitable[list[tuple[R, bool]]]],
    answer: Callable[[Any], R],
) -> list[tuple[R, bool]]:
    """Per spec, what ``attempt`` (one transaction ending in ``check_fresh``) made of it, or,
    for a key found in the history, that first task (``answer`` of its row; not created)."""
    answered: dict[Key, R] = {}
    for _ in range(HISTORY_TRIES):
        todo = [i for i, s in enumerate(specs) if _key(s) not in answered]
        try:
            made = (
                await attempt(
                    [specs[i] for i in todo],
                    None if partitions is None else [partitions[i] for i in todo],
                )
                if todo
                else []
            )
        except KeyRetired as exc:
            answered.update((k, answer(row)) for k, row in exc.found.items())
            continue
        except (asyncpg.DeadlockDetectedError, StoreUnavailable) as exc:
            if not _deadlock(exc):
                raise
            # Two submits of the same keys whose first tasks are in the history both insert
            # them, in different orders (a keyed batch goes in lock order): PostgreSQL ended
            # this one, rolled back whole. The next round finds the other's rows.
            continue
        out: dict[int, tuple[R, bool]] = dict(zip(todo, made, strict=True))
        for i, s in enumerate(specs):
            if i not in out:
                key = _key(s)
                assert key is not None
                out[i] = (answered[key], False)
        return [out[i] for i in range(len(specs))]
    raise StoreUnavailable(
        f"the first tasks of this batch's keys moved into the task history {HISTORY_TRIES} "
        "times during the submit; nothing of it was written; safe to retry"
    )
