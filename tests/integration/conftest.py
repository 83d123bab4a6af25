"""Integration fixtures: real nodes on the session's PostgreSQL, clients and a settable clock."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import pytest

from chronoq.chaos.proxy import Blackhole
from chronoq.client import Client
from chronoq.clock import Clock, ManualClock
from chronoq.config import NodeSettings
from chronoq.embedded.postgres import EmbeddedPostgres
from chronoq.node import Node
from chronoq.store import Store
from tests.conftest import create_test_database

NodeFactory = Callable[..., Awaitable[Node]]


@pytest.fixture
def clock() -> ManualClock:
    """A settable clock at a fixed instant 10 s into a bucket (tests move it by hand)."""
    return ManualClock(datetime(2030, 1, 1, 12, 0, 10, tzinfo=UTC))


@pytest.fixture
async def store(dsn: str) -> AsyncIterator[Store]:
    s = await Store.connect(dsn, partitions=16, min_size=1, max_size=4)
    try:
        yield s
    finally:
        await s.close()


@pytest.fixture
async def make_node(dsn: str) -> AsyncIterator[NodeFactory]:
    """Start nodes on the test's database; all are stopped at the end, even on failure."""
    nodes: list[Node] = []

    async def make(clock: Clock | None = None, **overrides: Any) -> Node:
        fields: dict[str, Any] = {
            "dsn": dsn,
            "port": 0,
            "partitions": 16,
            "tick": timedelta(milliseconds=50),
            "reap_interval": timedelta(milliseconds=200),
            "claim_poll": timedelta(milliseconds=100),
        }
        fields.update(overrides)
        node = Node(NodeSettings(**fields), clock=clock)
        await node.start()
        nodes.append(node)
        return node

    try:
        yield make
    finally:
        for node in nodes:
            try:
                await asyncio.wait_for(node.stop(grace=0.5), 20)
            except TimeoutError:
                # Say where it hung instead of failing the whole session on a timeout.
                for task in asyncio.all_tasks():
                    task.print_stack(limit=8)
                raise


@pytest.fixture
async def live(make_node: NodeFactory) -> AsyncIterator[tuple[Node, Client]]:
    """A node on the system clock (tasks come due by themselves) and a client of it."""
    node = await make_node()
    client = Client(node.address)
    try:
        yield node, client
    finally:
        await client.close()


@pytest.fixture
async def node(make_node: NodeFactory, clock: ManualClock) -> Node:
    return await make_node(clock=clock)


@pytest.fixture
async def client(node: Node) -> AsyncIterator[Client]:
    c = Client(node.address, timeout=10)
    try:
        yield c
    finally:
        await c.close()


@pytest.fixture
def pg(tmp_path: Path) -> Iterator[EmbeddedPostgres]:
    """A PostgreSQL server of the test's own, for tests that stop, kill or crash it (the
    session's server in tests/conftest.py is shared by every test)."""
    server = EmbeddedPostgres(tmp_path / "pg", durable=False)
    try:
        server.start()
        yield server
    finally:
        server.stop()


@pytest.fixture
def empty_db(postgres: EmbeddedPostgres) -> Iterator[str]:
    """A fresh database with no migration applied: what an operator gives add-shard."""
    name = f"s_{uuid.uuid4().hex[:12]}"
    url = postgres.create_database(name)
    try:
        yield url
    finally:
        postgres.drop_database(name)


@pytest.fixture
def target_dsn(postgres: EmbeddedPostgres, template_db: str) -> Iterator[str]:
    """A second migrated database, empty: the target shard of a move."""
    name = f"t_{uuid.uuid4().hex[:12]}"
    url = create_test_database(postgres, name, template_db)
    try:
        yield url
    finally:
        postgres.drop_database(name)


@pytest.fixture
def two_dsns(dsn: str, postgres: object, template_db: str) -> Iterator[tuple[str, str]]:
    """The test's database and a second fresh copy of the migrated template (dropped after)."""
    name = f"t_{uuid.uuid4().hex[:12]}"
    second = create_test_database(postgres, name, template_db)  # type: ignore[arg-type]
    try:
        yield dsn, second
    finally:
        postgres.drop_database(name)  # type: ignore[attr-defined]


def through(tcp_dsn: str, link: Blackhole) -> str:
    """``tcp_dsn`` going to the proxy ``link`` instead of the server."""
    parts = urlsplit(tcp_dsn)
    return urlunsplit(parts._replace(netloc=f"{parts.netloc.rpartition('@')[0]}@{link.address}"))
