"""A local chronoq stack for development and demos: embedded PostgreSQL plus scheduler node(s).

``async with DevStack(settings) as stack:`` starts a durable PostgreSQL server in
``<data_dir>/postgres`` (kept across runs), makes sure the database exists, starts the nodes on
it and stops everything, nodes first, on exit. ``stack.addresses`` are the gRPC addresses to
give clients and workers; ``stack.dsn`` the database.

One node runs in this process with local ownership. More than one is a real cluster: an
embedded etcd and one ``chronoq node`` process per node (``chronoq.local.cluster.LocalCluster``),
in a scratch directory under ``data_dir`` that is removed on exit.

With ``store_shards`` N > 1 the store is N shards, each its own server (shard-0 is the one
above; shard-1.. live in ``<data_dir>/store-shards``, see ``chronoq.embedded.shards``), all
started at once and each migrated; the nodes are a cluster (the shard map lives in etcd)
and get ``--store-shard`` for shard-1...

What the stack starts is supervised (``chronoq.embedded.supervisor``): a PostgreSQL, etcd
member or node process that dies is started again with backoff, unless ``restart`` is off
(fault experiments); ``dev.json`` in ``data_dir`` says what runs, with PIDs and command lines.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import shlex
import shutil
import tempfile
import uuid
from collections import Counter
from dataclasses import dataclass, field, replace
from datetime import timedelta
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Any

from chronoq.buckets import DEFAULT_BUCKET_SECONDS, DEFAULT_PARTITIONS
from chronoq.config import NodeSettings
from chronoq.embedded.etcd import EmbeddedEtcd, EmbeddedEtcdError
from chronoq.embedded.ha import PatroniCluster, PatroniError, check_members
from chronoq.embedded.ha.install import ensure_patroni
from chronoq.embedded.postgres import EmbeddedPostgres, EmbeddedPostgresError
from chronoq.embedded.shards import (
    StoreShards,
    check_store_shards,
    migrate_shards,
    run_together,
    shard_name,
)
from chronoq.embedded.supervisor import Child, Supervisor, finish_in_thread
from chronoq.errors import ChronoqError, ConfigError
from chronoq.models import TaskState
from chronoq.node import Node
from chronoq.store import Store
from chronoq.store.port import TaskStore

if TYPE_CHECKING:
    from chronoq.local.cluster import LocalCluster

log = logging.getLogger("chronoq.devstack")

DEFAULT_DATABASE = "chronoq"
#: What runs, in the data directory: see ``DevStack.state_file``.
STATE_FILE = "dev.json"


class DevStackError(ChronoqError):
    """The local stack could not be started."""


@dataclass(frozen=True, kw_only=True)
class DevStackSettings:
    """What to run. ``port`` is the first node's gRPC port (0: any free port)."""

    data_dir: Path
    host: str = "127.0.0.1"
    port: int = 7070
    pg_port: int | None = None  # None: a free port, picked at start
    partitions: int = DEFAULT_PARTITIONS
    bucket_seconds: int = DEFAULT_BUCKET_SECONDS
    tick: timedelta = timedelta(milliseconds=100)
    database: str = DEFAULT_DATABASE
    drop_database: bool = False  # drop it on exit (demo runs use a throwaway database)
    nodes: int = 1  # see ``clustered``
    etcd_members: int = 1
    lease_ttl: int = 5
    node_overrides: dict[str, Any] = field(default_factory=dict)  # one in-process node only
    restart: bool = True  # restart a crashed PostgreSQL, etcd member or node process
    pg_members: int = 1  # >1: a replicated PostgreSQL under Patroni (see chronoq.embedded.ha)
    store_shards: int = 1  # >1: that many store shards, each its own server (or Patroni)

    @property
    def clustered(self) -> bool:
        """Node processes on an embedded etcd (several nodes, an etcd asked for, or store
        shards, whose map lives in etcd)."""
        return self.nodes > 1 or self.etcd_members > 1 or self.replicated or self.sharded

    @property
    def sharded(self) -> bool:
        return self.store_shards > 1

    @property
    def replicated(self) -> bool:
        """PostgreSQL members under Patroni, whose leader lock lives in the stack's etcd."""
        return self.pg_members > 1

    def __post_init__(self) -> None:
        if self.nodes < 1 or self.etcd_members < 1:
            raise ConfigError("the dev stack needs at least one node and one etcd member")
        check_store_shards(self.store_shards, self.partitions)
        if self.replicated:
            try:
                check_members(self.pg_members)
            except ValueError as exc:
                raise ConfigError(f"--pg-members: {exc}") from None
            if self.pg_port is not None:
                raise ConfigError("--pg-port: each PostgreSQL member picks its own port")
        if self.clustered and self.node_overrides:
            raise ConfigError("node_overrides apply to a single in-process node only")
        if self.clustered and self.host != "127.0.0.1":
            raise ConfigError(
                f"--host {self.host}: a local cluster's nodes listen on 127.0.0.1 only; "
                "drop --host, or run one node (--nodes 1)"
            )


class DevStack:
    """Embedded PostgreSQL and the scheduler node(s) on it; an async context manager."""

    def __init__(self, settings: DevStackSettings) -> None:
        self.settings = settings
        self.postgres = EmbeddedPostgres(
            settings.data_dir / "postgres", port=settings.pg_port, durable=True
        )
        self.nodes: list[Node] = []
        self.cluster: LocalCluster | None = None
        self._cluster_store: Store | None = None
        self._created_database = False
        self._postgres_started = False
        self.supervisor: Supervisor | None = None
        self.ha: PatroniCluster | None = None  # with pg_members > 1, in place of ``postgres``
        self._ha_etcd: EmbeddedEtcd | None = None
        #: shard-1.. (empty with one shard); single servers made now, Patroni ones at start.
        self.shards = self._make_shards()
        self._shard_dsns: list[str] = []
        self._shard_stores: list[Store] = []  # shard-1.., for counts

    @property
    def dsn(self) -> str:
        """DSN of the stack's database (multi-host, to the primary, when replicated)."""
        if self.ha is not None:
            return self.ha.dsn_for(self.settings.database)
        return self.postgres.dsn_for(self.settings.database)

    @property
    def shard_dsns(self) -> dict[str, str]:
        """Each store shard's DSN (passwords included), shard-0 first (shard-0 alone until
        the others have their databases)."""
        return {shard_name(0): self.dsn} | {
            server.name: dsn
            for server, dsn in zip(self.shards.servers, self._shard_dsns, strict=False)
        }

    @property
    def address(self) -> str:
        """gRPC address of the first node."""
        return self.addresses[0]

    @property
    def addresses(self) -> list[str]:
        """gRPC addresses of the running nodes."""
        found = (
            self.cluster.addresses if self.cluster is not None else [n.address for n in self.nodes]
        )
        if not found:
            raise DevStackError("the dev stack is not running")
        return found

    @property
    def store(self) -> TaskStore:
        """A store on shard-0's database (for counts in demos and tests)."""
        store = self._cluster_store or (self.nodes[0].store if self.nodes else None)
        if store is None:
            raise DevStackError("the dev stack is not running")
        return store

    async def count_by_state(self) -> dict[TaskState, int]:
        """Exact counts per state over every store shard (a full scan: demos and tests)."""
        counts: Counter[TaskState] = Counter(await self.store.count_by_state())
        for store in self._shard_stores:
            counts.update(await store.count_by_state())
        return dict(counts)

    async def start(self) -> None:
        """Start PostgreSQL, create the database if it is missing, start the node(s)."""
        try:
            await self.start_store()
            if self.settings.clustered:
                await self._start_cluster()
            else:
                await self._start_nodes()
            self._supervise()
        except BaseException:
            await self.stop()
            raise

    async def start_store(self) -> None:
        """Start the store's servers (every shard at once), create the database on each and
        migrate every shard past shard-0 (the nodes migrate shard-0). ``stop`` undoes it."""
        try:
            if self.settings.replicated:
                await finish_in_thread(self._start_ha)
            else:
                await finish_in_thread(self._start_servers)
            await self._migrate_shards()
        except EmbeddedPostgresError as exc:
            raise DevStackError(f"embedded PostgreSQL: {exc}") from exc
        except (PatroniError, EmbeddedEtcdError) as exc:
            raise DevStackError(f"replicated PostgreSQL: {exc}") from exc

    async def stop(self) -> None:
        """Stop the nodes, drop a throwaway database, stop PostgreSQL. Safe to call twice."""
        supervisor, self.supervisor = self.supervisor, None
        if supervisor is not None:
            await supervisor.stop()  # first: nothing may restart what is being stopped
        with contextlib.suppress(OSError):
            self.state_file.unlink(missing_ok=True)
        nodes, self.nodes = self.nodes, []
        for node in reversed(nodes):
            with contextlib.suppress(ChronoqError, OSError):
                await node.stop(grace=1.0)
        await self._stop_cluster()
        await asyncio.to_thread(self._stop_shards)
        await asyncio.to_thread(self._stop_ha)
        if self.settings.drop_database and self._created_database:
            self._created_database = False
            try:
                await asyncio.to_thread(self.postgres.drop_database, self.settings.database)
            except EmbeddedPostgresError as exc:
                log.warning("could not drop database %s: %s", self.settings.database, exc)
        if self._postgres_started:
            # Only ours: stop() also kills stray servers on the data directory, and a failed
            # start may mean that another chronoq's server is running there.
            self._postgres_started = False
            await asyncio.to_thread(self.postgres.stop)

    @property
    def state_file(self) -> Path:
        """``dev.json`` in the data directory: PIDs, addresses and each node's command line,
        rewritten after every restart, removed on exit (it may hold the DSN: mode 0600)."""
        return self.settings.data_dir / STATE_FILE

    def state(self) -> dict[str, Any]:
        """What runs now: for operators who stop, start or restart one part by hand."""
        pg = self.postgres
        state: dict[str, Any] = {
            "pid": os.getpid(),
            "restart": self.settings.restart,
            "postgres": {
                "pid": pg.pid,
                "port": pg.port,
                "data_dir": str(pg.data_dir),
                "log": str(pg.log_file),
            },
            "postgres_members": self.ha.state() if self.ha is not None else [],
            "store_shards": self.shards.state(),
            "etcd": [],
            "nodes": [
                {
                    "node_id": n.settings.node_id,
                    "address": n.address,
                    "pid": os.getpid(),
                    "in_process": True,
                }
                for n in self.nodes
            ],
        }
        if self.cluster is not None:
            if self.cluster.etcd is not None:
                state["etcd"] = [
                    {"name": m.name, "pid": m.pid, "endpoint": m.endpoint, "log": str(m.log_file)}
                    for m in self.cluster.etcd.members
                ]
            state["nodes"] = [
                {
                    "node_id": n.node_id,
                    "address": n.address,
                    "pid": n.running_pid(),
                    "log": str(n.log_file),
                    "command": shlex.join(n.args),
                }
                for n in self.cluster.nodes.values()
            ]
        return state

    def write_state(self) -> None:
        """(Re)write ``state_file`` atomically."""
        path = self.state_file
        scratch = path.with_name(path.name + ".tmp")
        fd = os.open(scratch, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            json.dump(self.state(), f, indent=2)
        scratch.replace(path)

    def _supervise(self) -> None:
        """Watch PostgreSQL and the cluster's processes (an in-process node needs no watcher)."""
        children = (
            self.ha.children()
            if self.ha is not None
            else [Child("PostgreSQL", pid=lambda: self.postgres.pid, start=self._restart_postgres)]
        )
        children += self.shards.children()
        if self.cluster is not None:
            children += self.cluster.children()
        self.write_state()
        self.supervisor = Supervisor(
            children,
            restart=self.settings.restart,
            on_change=self.write_state,
            observe=self._postmasters if self.settings.replicated else None,
        )
        self.supervisor.start()

    def _restart_postgres(self) -> None:
        self.postgres.start(60.0)

    def _postmasters(self) -> tuple[int | None, ...]:
        """The postmaster PIDs of every Patroni member, shard-0's first: Patroni restarts a
        crashed postmaster itself (no child of ours exits), and ``dev.json`` must follow."""
        clusters = [self.ha] if self.ha is not None else []
        clusters += [s.ha for s in self.shards.servers if s.ha is not None]
        return tuple(m.postmaster_pid for c in clusters for m in c.members.values())

    async def __aenter__(self) -> DevStack:
        await self.start()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.stop()

    def _start_postgres(self) -> None:
        self.postgres.start(60.0)
        self._postgres_started = True

    def _make_shards(self, etcd: EmbeddedEtcd | None = None) -> StoreShards:
        s = self.settings
        if s.replicated and etcd is None:
            return StoreShards(s.data_dir, 0)  # made in _start_ha, on its etcd
        return StoreShards(
            s.data_dir / ("store-shards-ha" if s.replicated else "store-shards"),
            s.store_shards,
            pg_members=s.pg_members,
            etcd_endpoints=etcd.endpoints if etcd is not None else (),
            etcd_auth=etcd.patroni_auth() if etcd is not None else None,
            scope="chronoq-dev",  # + "-shard-i": the same across runs
            taken_ports=self._shard0_ports(),
        )

    def _shard0_ports(self) -> list[int]:
        """The ports shard-0's servers will listen on: the shards' servers pick theirs after,
        each on its own, and a port just freed may be handed out twice."""
        if self.ha is None:
            return [self.postgres.port]
        return [p for a in self.ha.addresses for p in (a.pg_port, a.api_port)]

    def _start_servers(self) -> None:
        """shard-0 and the other shards at once, then their databases."""
        run_together(self._start_postgres, self.shards.start)
        self._ensure_database()
        self._ensure_shard_databases()

    def _ensure_shard_databases(self) -> None:
        name = self.settings.database
        if self.settings.drop_database and any(
            server.database_exists(name) for server in self.shards.servers
        ):
            raise DevStackError(f"database {name!r} already exists on a store shard")
        self._shard_dsns = self.shards.ensure_database(name)

    async def _migrate_shards(self) -> None:
        """Every shard past shard-0 at the latest migration before a node uses it (the nodes
        migrate shard-0 themselves)."""
        await migrate_shards(self._shard_dsns)

    def _stop_shards(self) -> None:
        if self.settings.drop_database and self._shard_dsns:
            for server in self.shards.servers:
                with contextlib.suppress(EmbeddedPostgresError, PatroniError):
                    server.drop_database(self.settings.database)
        self._shard_dsns = []
        self.shards.stop()

    def _start_ha(self) -> None:
        """etcd first (Patroni keeps its leader lock there), then the members, then the
        database; the data is kept in ``data_dir/postgres-ha`` across runs."""
        s = self.settings
        s.data_dir.mkdir(parents=True, exist_ok=True)
        self._ha_etcd = EmbeddedEtcd(
            Path(tempfile.mkdtemp(prefix="ha-etcd-", dir=s.data_dir)),
            members=s.etcd_members,
            durable=False,
        )
        self._ha_etcd.start()
        self.ha = PatroniCluster(
            s.data_dir / "postgres-ha",
            self._ha_etcd.endpoints,
            members=s.pg_members,
            durable=True,
            scope="chronoq-dev",  # the same across runs: members find their cluster again
            etcd_auth=self._ha_etcd.patroni_auth(),
        )
        self.shards = self._make_shards(self._ha_etcd)
        if len(self.shards):
            ensure_patroni()  # one install on first use, before the clusters start side by side
        run_together(self.ha.start, self.shards.start)
        self._ensure_shard_databases()
        self._created_database = not self.ha.run_sql(
            "SELECT 1 FROM pg_database WHERE datname = "
            + "'" + s.database.replace("'", "''") + "'"
        ).strip()  # fmt: skip
        if not self._created_database and s.drop_database:
            raise DevStackError(f"database {s.database!r} already exists; it would be dropped")
        self.ha.ensure_database(s.database)

    def _stop_ha(self) -> None:
        ha, self.ha = self.ha, None
        if ha is not None:
            if self.settings.drop_database and self._created_database:
                self._created_database = False
                with contextlib.suppress(PatroniError):
                    name = self.settings.database.replace('"', '""')
                    ha.run_sql(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
            ha.stop()
        etcd, self._ha_etcd = self._ha_etcd, None
        if etcd is not None:
            etcd.stop()
            shutil.rmtree(etcd.members[0].data_dir.parent, ignore_errors=True)

    def _ensure_database(self) -> None:
        """Create the database for the nodes' role, or give it one an older chronoq made."""
        name = self.settings.database
        literal = "'" + name.replace("'", "''") + "'"
        found = self.postgres.run_sql(f"SELECT 1 FROM pg_database WHERE datname = {literal}")
        if found.strip() and self.settings.drop_database:
            raise DevStackError(f"database {name!r} already exists; it would be dropped on exit")
        self._created_database = self.postgres.ensure_database(name)[1]

    def _node_settings(self, index: int) -> NodeSettings:
        s = self.settings
        base = NodeSettings(
            dsn=self.dsn,
            host=s.host,
            port=s.port + index if s.port else 0,
            node_id=f"dev-{index + 1}",
            partitions=s.partitions,
            bucket_seconds=s.bucket_seconds,
            tick=s.tick,
        )
        return replace(base, **s.node_overrides) if s.node_overrides else base

    async def _start_nodes(self) -> None:
        for index in range(self.settings.nodes):
            settings = self._node_settings(index)
            node = Node(settings)
            try:
                await node.start()
            except RuntimeError as exc:  # grpc: "Failed to bind to address ..."
                await node.stop(grace=0)
                raise DevStackError(
                    f"node could not listen on {settings.host}:{settings.port} "
                    f"(is another chronoq running? pick another --port): {exc}"
                ) from exc
            self.nodes.append(node)

    async def _start_cluster(self) -> None:
        from chronoq.local.cluster import ClusterSpec, LocalCluster  # grpc sync stubs: lazily

        s = self.settings
        workdir = Path(tempfile.mkdtemp(prefix="cluster-", dir=s.data_dir))
        spec = ClusterSpec(
            nodes=s.nodes,
            etcd_members=s.etcd_members,
            partitions=s.partitions,
            lease_ttl=s.lease_ttl,
            tick_ms=max(1, round(s.tick / timedelta(milliseconds=1))),
            cluster=f"dev-{uuid.uuid4().hex[:8]}",  # a fresh key space in etcd for each run
            durable=False,  # etcd only: it lives as long as this run; PostgreSQL is ours
            base_port=s.port,
            extra_node_args=("--bucket-seconds", str(s.bucket_seconds)),
        )
        self.cluster = LocalCluster(
            workdir,
            spec,
            postgres=None if self.ha is not None else self.postgres,
            etcd=self._ha_etcd,  # the replicated store's; None: the cluster starts its own
            dsn=self.dsn,
            store_shards=self._shard_dsns,
        )
        try:
            await finish_in_thread(self.cluster.start)
        except (OSError, RuntimeError) as exc:  # a node exited or never served (log tail in it)
            raise DevStackError(f"cluster did not start: {exc}") from exc
        self._cluster_store = await Store.connect(
            self.dsn,
            partitions=s.partitions,
            bucket_seconds=s.bucket_seconds,
            min_size=0,  # no idle floor to restore (and log about) while PostgreSQL restarts
            max_size=2,
        )
        for dsn in self._shard_dsns:
            self._shard_stores.append(
                await Store.connect(dsn, partitions=s.partitions, min_size=0, max_size=2,
                                    migrate=False)
            )  # fmt: skip

    async def _stop_cluster(self) -> None:
        stores, self._shard_stores = self._shard_stores, []
        for shard_store in stores:
            with contextlib.suppress(ChronoqError, OSError):
                await shard_store.close()
        store, self._cluster_store = self._cluster_store, None
        if store is not None:
            with contextlib.suppress(ChronoqError, OSError):
                await store.close()
        cluster, self.cluster = self.cluster, None
        if cluster is not None:
            await asyncio.to_thread(cluster.stop)
            shutil.rmtree(cluster.workdir, ignore_errors=True)
