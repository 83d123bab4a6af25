"""The store shards of a local stack: each shard its own PostgreSQL server.

A shard is one ``EmbeddedPostgres`` (own data directory, own private socket directory, own
``chronoq`` role password kept in its data directory), or with ``pg_members`` > 1 one
``PatroniCluster`` (own scope on the stack's etcd, own ports and passwords). ``StoreShards``
runs shard-1, shard-2, ... beside the stack's own shard-0 (which each stack starts as it
always did), starting and stopping them in threads at once: N servers on 2 cores start in
about the time of one.

The nodes get each shard's DSN without its password (``--store-shard``) and a libpq password
file with every shard's (``chronoq.embedded.passfile``).
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, TypeVar

from chronoq.embedded import processes
from chronoq.embedded.ha import PatroniCluster, PatroniError
from chronoq.embedded.ha.install import ensure_patroni
from chronoq.embedded.pg_account import EmbeddedPostgresError
from chronoq.embedded.postgres import EmbeddedPostgres
from chronoq.embedded.supervisor import Child
from chronoq.errors import ConfigError
from chronoq.store import Store

#: Most store shards a local stack runs (each is a server of its own on this machine).
MAX_STORE_SHARDS = 8
#: Seconds a shard's server gets to start (crash recovery included).
START_TIMEOUT_S = 120.0


def shard_name(index: int) -> str:
    """``shard-0``, ``shard-1``, ...: the names of the shard map."""
    return f"shard-{index}"


def check_store_shards(count: int, partitions: int) -> None:
    """``ConfigError`` naming the bound when ``count`` store shards cannot be run."""
    if not 1 <= count <= MAX_STORE_SHARDS:
        raise ConfigError(
            f"--store-shards {count}: a local stack runs 1 to {MAX_STORE_SHARDS} store shards"
        )
    if count > partitions:
        raise ConfigError(
            f"--store-shards {count}: more shards than partitions ({partitions}); each shard "
            "holds at least one partition: raise --partitions or lower --store-shards"
        )


@dataclass
class ShardServer:
    """One shard's server: a single embedded PostgreSQL or a Patroni cluster."""

    name: str
    postgres: EmbeddedPostgres | None = None
    ha: PatroniCluster | None = None

    def start(self, timeout: float = START_TIMEOUT_S) -> None:
        if self.ha is not None:
            self.ha.start(timeout)
        else:
            self._single.start(timeout)

    def stop(self) -> None:
        if self.ha is not None:
            self.ha.stop()
        elif self.postgres is not None:
            self.postgres.stop()

    @property
    def _single(self) -> EmbeddedPostgres:
        assert self.postgres is not None
        return self.postgres

    def ensure_database(self, name: str) -> str:
        """Create database ``name`` if missing (owned by the nodes' role); its DSN."""
        if self.ha is not None:
            return self.ha.ensure_database(name)
        return self._single.ensure_database(name)[0]

    def database_exists(self, name: str) -> bool:
        literal = "'" + name.replace("'", "''") + "'"
        sql = f"SELECT 1 FROM pg_database WHERE datname = {literal}"
        run = self.ha.run_sql if self.ha is not None else self._single.run_sql
        return bool(run(sql).strip())

    def drop_database(self, name: str) -> None:
        quoted = '"' + name.replace('"', '""') + '"'
        if self.ha is not None:
            self.ha.run_sql(f"DROP DATABASE IF EXISTS {quoted} WITH (FORCE)")
        else:
            self._single.drop_database(name)

    def dsn_for(self, database: str) -> str:
        """DSN of ``database`` as the nodes' role, password included."""
        if self.ha is not None:
            return self.ha.dsn_for(database)
        return self._single.dsn_for(database)

    @property
    def primary_pid(self) -> int | None:
        """The postmaster taking writes (the Patroni leader's), else None."""
        if self.ha is None:
            return self._single.pid
        leader = self.ha.leader()
        return self.ha.members[leader].postmaster_pid if leader in self.ha.members else None

    def server_pids(self) -> list[int]:
        """The primary's postmaster and its children (for CPU accounting)."""
        if self.ha is None:
            return self._single.server_pids()
        leader = self.ha.leader()
        if leader not in self.ha.members:
            return []
        return processes.server_pids(self.ha.members[leader].data_dir, self.ha.bin_dir)

    def kill_primary(self) -> int:
        """SIGKILL the primary's postmaster by PID; returns the PID. A single server's
        orphaned backends go too (``EmbeddedPostgres.kill``); Patroni restarts its own."""
        pid = self.primary_pid
        if pid is None:
            raise EmbeddedPostgresError(f"{self.name}: no running postmaster to kill")
        if self.ha is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        else:
            self._single.kill()
        return pid

    def wait_writable(self, timeout: float = 90.0) -> None:
        """Until the shard takes commits again: a single server started again (crash
        recovery), a Patroni cluster with a writable leader."""
        if self.ha is not None:
            self.ha.wait_writable(timeout)
        else:
            self._single.start(timeout)

    def children(self) -> list[Child]:
        """The shard's supervised processes, named for the shard."""
        if self.ha is not None:
            return [replace(c, name=f"{self.name} {c.name}") for c in self.ha.children()]
        pg = self._single
        return [
            Child(f"PostgreSQL {self.name}", pid=lambda: pg.pid, start=lambda: pg.start(60.0))
        ]

    def state(self) -> dict[str, Any]:
        """What runs, for ``dev.json``."""
        if self.ha is not None:
            return {"name": self.name, "scope": self.ha.scope, "members": self.ha.state()}
        pg = self._single
        return {
            "name": self.name,
            "pid": pg.pid,
            "port": pg.port,
            "data_dir": str(pg.data_dir),
            "log": str(pg.log_file),
            "password_file": str(pg.app_password_file),
        }


class StoreShards:
    """Shards ``first``.. ``count - 1`` of a stack, started and stopped together."""

    def __init__(
        self,
        root: Path,
        count: int,
        *,
        first: int = 1,
        pg_members: int = 1,
        etcd_endpoints: Sequence[str] = (),
        etcd_auth: tuple[str, Path] | None = None,
        scope: str = "chronoq",
        durable: bool = True,
        settings: dict[str, str] | None = None,
        taken_ports: Sequence[int] = (),
    ) -> None:
        """Describe the servers; nothing runs until ``start``.

        Args:
            root: Shard ``shard-i`` keeps its data in ``root/shard-i`` (kept across runs
                when the stack's data directory is).
            count: The stack's shard count; ``first`` the first one made here (shard-0 is
                the stack's own server).
            pg_members: More than 1: each shard a Patroni cluster of this many members on
                ``etcd_endpoints``, scope ``<scope>-shard-i``.
            taken_ports: Ports already in use by the stack (shard-0's): never given twice.
        """
        self.root = Path(root)
        self.servers: list[ShardServer] = []
        taken = set(taken_ports)
        for index in range(first, count):
            name = shard_name(index)
            if pg_members > 1:
                ha = _distinct(
                    lambda name=name: PatroniCluster(  # type: ignore[misc]
                        self.root / name, etcd_endpoints, members=pg_members,
                        durable=durable, scope=f"{scope}-{name}", etcd_auth=etcd_auth,
                    ),
                    lambda c: [p for a in c.addresses for p in (a.pg_port, a.api_port)],
                    taken,
                )  # fmt: skip
                self.servers.append(ShardServer(name, ha=ha))
            else:
                pg = _distinct(
                    lambda name=name: EmbeddedPostgres(  # type: ignore[misc]
                        self.root / name / "postgres", durable=durable, settings=settings
                    ),
                    lambda p: [p.port],
                    taken,
                )
                self.servers.append(ShardServer(name, postgres=pg))
        self.replicated = pg_members > 1

    def __len__(self) -> int:
        return len(self.servers)

    def start(self, timeout: float = START_TIMEOUT_S) -> None:
        """Start every shard at once (threads); on any failure stop them all and raise the
        first error."""
        if not self.servers:
            return
        if self.replicated:
            ensure_patroni()  # one install, before the clusters start side by side
        try:
            self._each(lambda s: s.start(timeout))
        except BaseException:
            self.stop()
            raise

    def stop(self) -> None:
        """Stop every shard (at once); safe to call twice."""
        with contextlib.suppress(EmbeddedPostgresError, PatroniError, OSError):
            self._each(ShardServer.stop, first_error=False)

    def ensure_database(self, name: str) -> list[str]:
        """Create ``name`` on every shard if missing; the DSNs (with passwords), in order."""
        dsns: list[str] = []
        for server in self.servers:
            dsns.append(server.ensure_database(name))
        return dsns

    def dsns(self, database: str) -> list[str]:
        return [s.dsn_for(database) for s in self.servers]

    def children(self) -> list[Child]:
        return [c for s in self.servers for c in s.children()]

    def state(self) -> list[dict[str, Any]]:
        return [s.state() for s in self.servers]

    def _each(self, fn: Callable[[ShardServer], None], *, first_error: bool = True) -> None:
        if not self.servers:  # one shard: no pool (it refuses zero threads)
            return
        with ThreadPoolExecutor(max_workers=len(self.servers), thread_name_prefix="shard") as ex:
            futures = [ex.submit(fn, s) for s in self.servers]
        errors = [e for f in futures if (e := f.exception()) is not None]
        if errors and first_error:
            raise errors[0]


_T = TypeVar("_T")


def run_together(*jobs: Callable[[], None]) -> None:
    """Run blocking ``jobs`` in threads at once, wait for all, raise the first error."""
    with ThreadPoolExecutor(max_workers=max(1, len(jobs)), thread_name_prefix="store") as ex:
        futures = [ex.submit(job) for job in jobs]
    for future in futures:
        future.result()


async def migrate_shards(dsns: Sequence[str]) -> None:
    """Bring each shard's database to the latest migration, migrations only (a shard's
    holdings are the node's to write, from the shard map)."""
    for dsn in dsns:
        store = await Store.connect(dsn, min_size=0, max_size=1, migrate=False)
        try:
            await store.migrate()
        finally:
            await store.close()


def _distinct(
    make: Callable[[], _T], ports: Callable[[_T], list[int]], taken: set[int], tries: int = 20
) -> _T:
    """``make()`` again while its freshly picked ports clash with ones already given out
    (each server picks free ports on its own, and a port freed may be handed out again)."""
    for _ in range(tries):
        made = make()
        mine = ports(made)
        if not taken.intersection(mine) and len(set(mine)) == len(mine):
            taken.update(mine)
            return made
        time.sleep(0.01)
    raise EmbeddedPostgresError(f"no distinct free ports after {tries} tries")


__all__ = [
    "MAX_STORE_SHARDS",
    "ShardServer",
    "StoreShards",
    "check_store_shards",
    "migrate_shards",
    "run_together",
    "shard_name",
]
