"""The store contract: one suite that every shape of the task store must pass.

Each test here speaks only the store's public calls (no SQL, no pool, no driver), so a new
shape of the store (more shards, a shard under Patroni) plugs in as one more entry of
``SHAPES`` and runs every contract unchanged, as every driver of River runs its driver tests.

A shape prepares its fresh migrated database(s) and opens a connected store of
``PARTITIONS`` partitions on them, closed after the test.
"""

from __future__ import annotations

import contextlib
import inspect
import uuid
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Protocol

import pytest

from chronoq.embedded.ha import PatroniCluster
from chronoq.shardmap import ShardMap
from chronoq.store import Store
from chronoq.store.port import ScheduleAdmin, ScheduleOwner, TaskStore
from chronoq.store.schedules import Schedules
from chronoq.store.sharded import ShardedSchedules, ShardedStore
from tests.conftest import create_test_database

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
    #: Marks of each contract on this shape (slow, a longer timeout for a slow first setup).
    marks: tuple[pytest.MarkDecorator, ...] = ()


@contextlib.asynccontextmanager
async def _open_single(dsn: str) -> AsyncIterator[Opened]:
    store = await Store.connect(dsn, partitions=PARTITIONS, min_size=1, max_size=4)
    try:
        yield Opened(store, Schedules(store))
    finally:
        await store.close()


#: The two-shards shape's map: shard-0 holds the first half of the partitions, shard-1 the rest.
TWO_SHARDS = ShardMap(
    1,
    ("shard-0", "shard-1"),
    ("shard-0",) * (PARTITIONS // 2) + ("shard-1",) * (PARTITIONS - PARTITIONS // 2),
)


def _prepare_two(request: pytest.FixtureRequest) -> tuple[str, str]:
    """Two fresh copies of the migrated template (the second dropped after the test)."""
    postgres = request.getfixturevalue("postgres")
    template = request.getfixturevalue("template_db")
    name = f"t_{uuid.uuid4().hex[:12]}"
    second = create_test_database(postgres, name, template)
    request.addfinalizer(lambda: postgres.drop_database(name))
    return request.getfixturevalue("dsn"), second


async def connect_shard(dsn: str, holds: Sequence[int]) -> Store:
    """A shard's store holding ``holds`` (on a store that records what each shard holds)."""
    extra: dict[str, Any] = {}
    if "holds" in inspect.signature(Store.connect).parameters:
        extra["holds"] = tuple(holds)
    return await Store.connect(dsn, partitions=PARTITIONS, min_size=1, max_size=4, **extra)


@contextlib.asynccontextmanager
async def open_two(dsns: tuple[str, str]) -> AsyncIterator[ShardedStore]:
    """A store of two shards on two databases, split by ``TWO_SHARDS``."""
    shard_map = TWO_SHARDS
    stores: dict[str, Store] = {}
    try:
        for name, dsn in zip(shard_map.shards, dsns, strict=True):
            stores[name] = await connect_shard(dsn, shard_map.held_by(name))
        sharded = ShardedStore(stores, lambda: shard_map)
        sharded.set_map(shard_map)
        yield sharded
    finally:
        for store in stores.values():
            await store.close()


@contextlib.asynccontextmanager
async def _open_two(dsns: tuple[str, str]) -> AsyncIterator[Opened]:
    async with open_two(dsns) as sharded:
        yield Opened(sharded, ShardedSchedules(sharded))


def _prepare_patroni(request: pytest.FixtureRequest) -> str:
    """A fresh copy of the migrated template on the session's Patroni cluster, created on
    the primary (the standbys replay it); its DSN is the one nodes are given: every member,
    ``target_session_attrs=read-write``, and the store's check that it reached the primary."""
    cluster: PatroniCluster = request.getfixturevalue("ha")
    template: str = request.getfixturevalue("ha_template")
    name = f"t_{uuid.uuid4().hex[:12]}"
    dsn = cluster.ensure_database(name, template=template)
    request.addfinalizer(lambda: cluster.drop_database(name))
    return dsn


#: Every shape of the store the contracts run against, each built on real servers (no
#: fakes).
SHAPES: dict[str, Shape] = {
    # Today's store: one fresh copy of the migrated template on the session PostgreSQL.
    "single": Shape(prepare=lambda request: request.getfixturevalue("dsn"), open=_open_single),
    # Two fresh databases of the session PostgreSQL as shard-0 and shard-1 behind one port,
    # the partitions split evenly between them by a shard map.
    "two-shards": Shape(prepare=_prepare_two, open=_open_two),
    # One shard whose database is a 3-member Patroni cluster on the session's etcd (the
    # tests/conftest.py ``ha`` fixture, started once, on the first test of this shape).
    # Slow (40-90 s for the shape: a cold start of 11-25 s, then ~0.6-1 s to copy and drop each
    # test's database on a replicated server), so it runs with --runslow: .ci/run runs it
    # after the default run. Its first test pays the cold start, hence the longer timeout.
    "patroni": Shape(
        prepare=_prepare_patroni,
        open=_open_single,
        marks=(pytest.mark.slow, pytest.mark.timeout(240)),
    ),
}


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    """Every contract runs once per shape (read at collection, so a shape registered by
    any module imported before it counts); ``-k single`` picks one."""
    if "shape" in metafunc.fixturenames:
        shapes = [pytest.param(name, marks=SHAPES[name].marks) for name in sorted(SHAPES)]
        metafunc.parametrize("shape", shapes, indirect=True)


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


class Holder:
    """One store shard holding some partitions, and the map's steps on it (what a partition
    move does), for the contracts of the store-side fencing of the map: they call the port
    on ``store`` and set up what the shard holds through this, never through SQL."""

    def __init__(self, store: Store, schedules: ScheduleStore) -> None:
        self._store = store
        self.store: TaskStore = store
        self.schedules = schedules

    async def freeze(self, partitions: Sequence[int], move_id: str = "m1", token: int = 7) -> None:
        from chronoq.store import holdings

        await holdings.freeze(self._store, partitions, move_id, token)

    async def unfreeze(
        self, partitions: Sequence[int], move_id: str = "m1", token: int = 7
    ) -> None:
        from chronoq.store import holdings

        await holdings.unfreeze(self._store, partitions, move_id, token)

    async def move_in(
        self, partitions: Sequence[int], since_version: int, move_id: str = "m1", token: int = 7
    ) -> None:
        """Incoming, then live since ``since_version`` (a target before the map's commit)."""
        from chronoq.store import holdings

        await holdings.mark_incoming(self._store, partitions, move_id, token)
        await holdings.make_live(self._store, partitions, since_version, move_id, token)

    async def mark_incoming(
        self, partitions: Sequence[int], move_id: str = "m1", token: int = 7
    ) -> None:
        from chronoq.store import holdings

        await holdings.mark_incoming(self._store, partitions, move_id, token)

    def routes_by(self, map_version: int) -> None:
        """The map version the caller routes by (a store of shards sets it)."""
        self._store.map_version = map_version

    def task_id_in(self, partition: int) -> str:
        """A task id of ``partition`` that no task has."""
        from chronoq.routing import new_task_ids

        return str(new_task_ids([partition], 1_900_000_000_000)[0])

    def schedule_name_in(self, partitions: Sequence[int]) -> str:
        """A schedule name of the default namespace placed in one of ``partitions``."""
        from chronoq.routing import key_partition

        return next(
            f"s{i}"
            for i in range(10_000)
            if key_partition("default", f"s{i}", PARTITIONS) in partitions
        )


def shard_holder(sharded: ShardedStore, shard: str) -> Holder:
    """One shard of a store of shards, with the map's steps on it (a move's freeze)."""
    store = sharded.stores[shard]
    return Holder(store, Schedules(store))


@contextlib.asynccontextmanager
async def holding(dsn: str, holds: Sequence[int]) -> AsyncIterator[Holder]:
    """A single store shard on ``dsn`` that holds ``holds`` from its first connect."""
    store = await Store.connect(dsn, partitions=PARTITIONS, min_size=1, max_size=4, holds=holds)
    try:
        yield Holder(store, Schedules(store))
    finally:
        await store.close()
