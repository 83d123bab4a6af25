"""The store contract: one suite that every shape of the task store must pass.

Each test here speaks only the store's public calls (no SQL, no pool, no driver), so a new
shape of the store (more shards, a shard under Patroni) plugs in as one more entry of
``SHAPES`` and runs every contract unchanged, as every driver of River runs its driver tests.

A shape prepares its fresh migrated database(s) and opens a connected store of
``PARTITIONS`` partitions on them, closed after the test.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Protocol

import pytest

from chronoq.store import Store
from chronoq.store.port import ScheduleAdmin, ScheduleOwner, TaskStore
from chronoq.store.schedules import Schedules

#: Few partitions, so that "the other partitions" exist and stay cheap to fence.
PARTITIONS = 8
#: The fixed instant the contracts start at: 10 s into a 60 s bucket (they move it by hand).
START = datetime(2030, 1, 1, 12, 0, 10, tzinfo=UTC)


class ScheduleStore(ScheduleAdmin, ScheduleOwner, Protocol):
    """The schedule calls of the port, both halves."""


@dataclass(frozen=True)
class Opened:
    """A connected store of one shape, as the port names it."""

    store: TaskStore
    schedules: ScheduleStore


@dataclass(frozen=True)
class Shape:
    """How one shape of the store is made for a test.

    ``prepare`` runs outside the event loop and takes the servers and databases it needs
    from fixtures (``request.getfixturevalue``); ``open`` connects a store on them.
    """

    prepare: Callable[[pytest.FixtureRequest], Any]
    open: Callable[[Any], AbstractAsyncContextManager[Opened]]


@contextlib.asynccontextmanager
async def _open_single(dsn: str) -> AsyncIterator[Opened]:
    store = await Store.connect(dsn, partitions=PARTITIONS, min_size=1, max_size=4)
    try:
        yield Opened(store, Schedules(store))
    finally:
        await store.close()


#: Every shape of the store the contracts run against. Shapes that join later, each built
#: on real servers (no fakes):
#:   "two-shards": two fresh databases of the session PostgreSQL as shard-0 and shard-1
#:                 behind one port, the partitions split between them by a shard map;
#:   "patroni":    one shard whose database is a Patroni cluster (the tests/ha fixtures).
SHAPES: dict[str, Shape] = {
    # Today's store: one fresh copy of the migrated template on the session PostgreSQL.
    "single": Shape(prepare=lambda request: request.getfixturevalue("dsn"), open=_open_single),
}


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    """Every contract runs once per shape (read at collection, so a shape registered by
    any module imported before it counts); ``-k single`` picks one."""
    if "shape" in metafunc.fixturenames:
        metafunc.parametrize("shape", sorted(SHAPES), indirect=True)


@pytest.fixture
def shape(request: pytest.FixtureRequest) -> tuple[Shape, Any]:
    """The shape and what it prepared (outside the event loop: databases are made there)."""
    chosen = SHAPES[request.param]
    return chosen, chosen.prepare(request)


@pytest.fixture
async def opened(shape: tuple[Shape, Any]) -> AsyncIterator[Opened]:
    chosen, prepared = shape
    async with chosen.open(prepared) as store:
        yield store


@pytest.fixture
def store_shape(opened: Opened) -> TaskStore:
    """A connected, empty, migrated store of each shape, typed as the port: the contracts
    call nothing else (mypy checks it)."""
    return opened.store


@pytest.fixture
def schedules(opened: Opened) -> ScheduleStore:
    """The schedule calls of the shape's store."""
    return opened.schedules


@pytest.fixture
def now() -> datetime:
    return START
