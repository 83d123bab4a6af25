"""What a unique or a debounce key makes of a submit, as pure decisions (no I/O).

A spec with a ``unique_key`` or a ``debounce_key`` is *keyed*: the store submits it through
``chronoq.store.keyed`` (one decision per spec, by the unique partial indexes of migration
0019) instead of the plain batch insert. The rules (``docs/unique-and-debounce.md``):

- ``unique_key`` alone: no second *pending* task of the key (SCHEDULED, READY or RUNNING); a
  repeated submit answers the pending task, ``created`` false. RUNNING counts because a
  running task returns to SCHEDULED or READY on a retry, a release or an expired lease.
- ``unique_key`` + ``unique_for``: besides, a window from the submit until the first task's
  ``run_at + unique_for`` (its ``unique_until``), whatever that task's state meanwhile.
- ``debounce_key`` + ``debounce``: a repeated submit while the key's task has not started
  (SCHEDULED, attempt 0) moves it to ``min(now + debounce, debounce_until)`` with the new
  payload; otherwise a new task at ``now + debounce``.
- ``idempotency_key`` is checked first, forever: a repeated request answers its first task
  and changes nothing.
"""

from __future__ import annotations

import dataclasses
from datetime import datetime

from chronoq.models import TaskSpec
from chronoq.saturating import shifted

#: How often one keyed spec is tried again when the key's holder changed between the insert
#: that collided and the read of the holder (it finished, or a concurrent submit moved it).
KEYED_TRIES = 8


def keyed(spec: TaskSpec) -> bool:
    """Whether ``spec`` has a unique or a debounce key (it takes the keyed submit)."""
    return bool(spec.unique_key or spec.debounce_key)


def debounced(spec: TaskSpec, now: datetime) -> TaskSpec:
    """``spec`` as its debounce places it: due at ``now + debounce`` (its own ``run_at`` is
    replaced: the debounce decides when a burst's task runs)."""
    if spec.debounce_key is None or spec.debounce is None:
        return spec
    return dataclasses.replace(spec, run_at=shifted(now, spec.debounce))


def lock_order(spec: TaskSpec, partition: int) -> tuple[str, int, str, str]:
    """The order in which a batch's keyed specs take their keys: the same in every batch, so
    two batches that share keys wait on each other in one order and never deadlock. Specs of
    one key keep their order in the batch (the sort is stable): the second answers the
    first's task."""
    return (spec.namespace, partition, spec.debounce_key or "", spec.unique_key or "")
