"""The local backend: a ``LocalCluster`` whose nodes reach etcd and PostgreSQL through
blackhole proxies, so each node can be cut off alone.

Each node gets one proxy per etcd member and one to PostgreSQL (through the cluster's
``node_args`` hook); the harness itself, the observer and the workers talk to the servers
directly. A clock jump restarts the node with ``--clock-offset-ms``; a clock drift rewrites the
offset file each node follows (``--clock-offset-file``), without a restart. For the disk-full
fault, PostgreSQL's data directory is a size-capped filesystem (``disk.py``). Everything is
stopped by PID in ``stop()``.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

from chronoq.chaos.disk import CappedDisk
from chronoq.chaos.fault_plan import (
    ALL_KINDS,
    SHARD_KINDS,
    SINGLE_STORE_KINDS,
    STORE_HA_KINDS,
    FaultKind,
)
from chronoq.chaos.proxy import Blackhole, ProxyHub
from chronoq.chaos.shaping import LinkShape
from chronoq.coordinator.settings import EtcdSettings
from chronoq.embedded.etcd import EmbeddedEtcd
from chronoq.embedded.ha import PatroniCluster
from chronoq.embedded.ha.install import ensure_patroni
from chronoq.embedded.shards import ShardServer, StoreShards, migrate_shards, run_together
from chronoq.local.cluster import ClusterSpec, LocalCluster

CLOCK_FLAG = "--clock-offset-ms"
CLOCK_FILE_FLAG = "--clock-offset-file"


class LocalBackend:
    """Processes on loopback; supports every fault kind."""

    name = "local"
    supported: frozenset[FaultKind] = frozenset(ALL_KINDS)

    def __init__(
        self, workdir: Path, spec: ClusterSpec, *, pg_members: int = 1, capped_disk_mb: int = 0,
        store_shards: int = 1,
    ) -> None:
        """``pg_members`` > 1: PostgreSQL members under Patroni on the cluster's etcd (the
        store faults replace restart-postgres and disk-full). ``capped_disk_mb``: the single
        PostgreSQL's data directory on a filesystem of that size (the disk-full fault).
        ``store_shards`` > 1: shard-1.. each its own server (or Patroni cluster), reached
        by the nodes directly (no proxy: the shard faults kill the server itself)."""
        self.spec = spec
        self.workdir = workdir
        self.hub = ProxyHub()
        self.proxies: dict[str, dict[str, list[Blackhole]]] = {}
        self.ha: PatroniCluster | None = None
        self._etcd: EmbeddedEtcd | None = None
        #: Fault kinds this run cannot inject after all, with the reason (found at start).
        self.skipped: dict[FaultKind, str] = {}
        self.disk: CappedDisk | None = None
        if capped_disk_mb and pg_members <= 1:
            self.disk = CappedDisk(workdir / "postgres", capped_disk_mb)
        self._resets_before: dict[str, int] = {}
        self._etcd = (
            EmbeddedEtcd(workdir / "etcd", members=spec.etcd_members, durable=spec.durable)
            if pg_members > 1 or store_shards > 1
            else None
        )
        if pg_members > 1:
            assert self._etcd is not None
            self.ha = PatroniCluster(
                workdir / "pg", self._etcd.endpoints, members=pg_members,
                etcd_auth=self._etcd.patroni_auth(),
            )  # fmt: skip
        self.shards = StoreShards(
            workdir / "store-shards", store_shards, pg_members=pg_members,
            etcd_endpoints=self._etcd.endpoints if self._etcd is not None else (),
            etcd_auth=self._etcd.patroni_auth() if self._etcd and pg_members > 1 else None,
            scope=f"chronoq-{spec.cluster}",
            # shard-0's members picked their ports first: never handed out twice
            taken_ports=[p for a in self.ha.addresses for p in (a.pg_port, a.api_port)]
            if self.ha is not None
            else (),
        )  # fmt: skip
        self._shard_dsns: list[str] = []
        if len(self.shards):
            self.supported = self.supported | frozenset(SHARD_KINDS)
        if self.ha is not None:
            self.supported = frozenset(
                {*self.supported, *STORE_HA_KINDS} - set(SINGLE_STORE_KINDS)
            )
            self.cluster = LocalCluster(
                workdir, spec, etcd=self._etcd, dsn=self.ha.dsn_for(spec.database),
                node_args=self._node_args,
            )  # fmt: skip
        else:
            self.cluster = LocalCluster(
                workdir, spec, etcd=self._etcd, node_args=self._node_args
            )  # fmt: skip

    # ------------------------------------------------------------------ lifecycle

    def start(self) -> None:
        try:
            if self._etcd is not None:
                self._etcd.start()
            if self.ha is not None:
                ensure_patroni()  # one install, before the clusters start side by side
                ha = self.ha
                run_together(lambda: ha.start(timeout=180), self.shards.start)
                self.ha.ensure_database(self.spec.database)
            else:
                self.shards.start()
            self._shard_dsns = self.shards.ensure_database(self.spec.database)
            self.cluster.store_shards = self._shard_dsns
            asyncio.run(migrate_shards(self._shard_dsns))
            if self.disk is not None:
                why = self.disk.mount()
                if why is not None:
                    self.skipped[FaultKind.DISK_FULL] = why
                    self.supported = self.supported - {FaultKind.DISK_FULL}
                    self.disk = None
            self.cluster.start()
        except BaseException:
            self._stop_store()
            self.hub.close()
            raise

    def _stop_store(self) -> None:
        self.shards.stop()
        if self.ha is not None:
            self.ha.stop()
        if self._etcd is not None:
            self._etcd.stop()
        if self.disk is not None:
            if self.cluster.postgres is not None:
                self.cluster.postgres.stop()  # it must let go of the filesystem first
            self.disk.unmount()

    def stop(self) -> None:
        try:
            for node_id in self.cluster.nodes:
                with contextlib.suppress(ProcessLookupError):
                    pid = self.cluster.nodes[node_id].pid
                    if pid is not None:
                        os.kill(pid, signal.SIGCONT)
            for p in self.hub.proxies:
                p.heal()
            self.cluster.stop()
        finally:
            self._stop_store()
            self.hub.close()

    @property
    def dsn(self) -> str:
        return self.cluster.dsn

    @property
    def store_dsns(self) -> list[str]:
        """Every store shard's DSN, shard-0 first (the harness reads the tasks of each)."""
        return [self.cluster.dsn, *self._shard_dsns]

    # ------------------------------------------------------------------ store shards

    def shard_names(self) -> list[str]:
        return [s.name for s in self.shards.servers]

    def _shard(self, name: str) -> ShardServer:
        return next(s for s in self.shards.servers if s.name == name)

    def kill_shard_primary(self, name: str) -> int:
        return self._shard(name).kill_primary()

    def wait_shard_writable(self, name: str, timeout: float) -> None:
        """A single server is started again here (the harness is its supervisor); a Patroni
        cluster restarts its postmaster itself."""
        self._shard(name).wait_writable(timeout)

    @property
    def etcd_endpoints(self) -> list[str]:
        return self.cluster.etcd_endpoints

    def etcd_settings(self, cluster: str) -> EtcdSettings:
        """How the harness reads etcd: as the nodes do, with their credentials."""
        return self.cluster.etcd_settings(cluster)

    @property
    def addresses(self) -> list[str]:
        return [n.address for n in self.cluster.nodes.values()]

    @property
    def node_ids(self) -> list[str]:
        return list(self.cluster.nodes)

    def _node_args(self, node_id: str, args: list[str]) -> list[str]:
        """Point the node at its own proxies instead of the servers."""
        etcd = [self.hub.add(e, f"{node_id}->etcd{i}")
                for i, e in enumerate(self.cluster.etcd_endpoints)]
        parts = urlsplit(self.cluster.tcp_dsn)
        credentials, _, hosts = parts.netloc.rpartition("@")
        # The user only: the password travels in the node's environment, never on its command
        # line (see LocalCluster._spawn).
        credentials = credentials.partition(":")[0]
        # One proxy per PostgreSQL server (several in a replicated store's multi-host DSN).
        pgs = [
            self.hub.add(host, f"{node_id}->postgres{i or ''}")
            for i, host in enumerate(hosts.split(","))
        ]
        self.proxies[node_id] = {"etcd": etcd, "postgres": pgs}
        proxied = ",".join(p.address for p in pgs)
        dsn = urlunsplit(parts._replace(netloc=f"{credentials}@{proxied}"))
        out = list(args)
        out[out.index("--dsn") + 1] = dsn
        out[out.index("--etcd") + 1] = ",".join(p.address for p in etcd)
        return [*out, CLOCK_FILE_FLAG, str(self._clock_file(node_id))]

    def _clock_file(self, node_id: str) -> Path:
        return self.workdir / f"{node_id}.clock-offset"

    # ------------------------------------------------------------------ nodes

    def node_alive(self, node_id: str) -> bool:
        return self.cluster.nodes[node_id].alive()

    def kill_node(self, node_id: str) -> None:
        self.cluster.kill(node_id)

    def restart_node(self, node_id: str) -> None:
        self.cluster.restart_node(node_id)

    def pause_node(self, node_id: str) -> None:
        self.cluster.signal(node_id, signal.SIGSTOP)

    def resume_node(self, node_id: str) -> None:
        self.cluster.signal(node_id, signal.SIGCONT)

    def set_clock(self, node_id: str, offset_ms: int) -> None:
        node = self.cluster.nodes[node_id]
        args = list(node.args)
        if CLOCK_FLAG in args:
            i = args.index(CLOCK_FLAG)
            del args[i : i + 2]
        if offset_ms:
            args += [CLOCK_FLAG, str(offset_ms)]
        node.args = args
        # A node whose clock is off stays NOT_SERVING by design: wait until it answers.
        self.cluster.restart_node(node_id, wait=not offset_ms)
        if offset_ms:
            self.cluster.wait_answering(node)

    def drift_clock(self, node_id: str, offset_ms: int) -> None:
        """Set the offset the node's clock follows (it rereads the file within 100 ms)."""
        path = self._clock_file(node_id)
        tmp = path.with_suffix(".tmp")
        tmp.write_text(f"{offset_ms}\n")
        os.replace(tmp, path)  # the node never reads half a number

    # ------------------------------------------------------------------ etcd and PostgreSQL

    def etcd_size(self) -> int:
        assert self.cluster.etcd is not None
        return len(self.cluster.etcd.members)

    def etcd_leader(self) -> int | None:
        assert self.cluster.etcd is not None
        return self.cluster.etcd.leader_index()

    def kill_etcd_member(self, index: int) -> None:
        assert self.cluster.etcd is not None
        self.cluster.etcd.kill_member(index)

    def start_etcd_member(self, index: int) -> None:
        assert self.cluster.etcd is not None
        self.cluster.etcd.start_member(index)

    def stop_postgres(self, *, crash: bool) -> None:
        assert self.cluster.postgres is not None
        if crash:
            self.cluster.postgres.kill()
        else:
            self.cluster.postgres.stop()

    def start_postgres(self) -> None:
        assert self.cluster.postgres is not None
        self.cluster.postgres.start(timeout=60)

    def fill_disk(self) -> int:
        if self.disk is None:
            raise RuntimeError("PostgreSQL's data directory is not on a capped filesystem")
        return self.disk.fill()

    def free_disk(self) -> bool:
        """Remove the ballast; start PostgreSQL again if the full disk took it down."""
        if self.disk is None:
            return False
        self.disk.free()
        pg = self.cluster.postgres
        if pg is not None and pg.pid is None:
            pg.start(timeout=60)
            return True
        return False

    # ------------------------------------------------------------------ network

    def cut(self, node_id: str, service: str) -> None:
        for p in self.proxies[node_id][service]:
            p.cut()

    def heal(self, node_id: str, service: str) -> None:
        for p in self.proxies[node_id][service]:
            p.heal()

    def shape_links(self, service: str, shape: LinkShape, seed: int) -> None:
        """Make every node's links to ``service`` slow and lossy."""
        links = [p for ps in self.proxies.values() for p in ps[service]]
        self._resets_before[service] = sum(p.resets for p in links)
        for p in links:
            p.shape(shape, seed)

    def unshape_links(self, service: str) -> int:
        links = [p for ps in self.proxies.values() for p in ps[service]]
        for p in links:
            p.unshape()
        return sum(p.resets for p in links) - self._resets_before.pop(service, 0)

    def _undo_degradations(self) -> None:
        """Links clean again, the disk's space back, every clock file at 0."""
        for p in self.hub.proxies:
            p.heal()
            p.unshape()
        if self.disk is not None:
            self.disk.free()
        for node_id in self.cluster.nodes:
            self.drift_clock(node_id, 0)

    def _heal_store(self) -> None:
        """Start again every PostgreSQL server (or Patroni member) that is down."""
        if self.ha is not None:
            for name, member in self.ha.members.items():
                if member.patroni_pid is None:
                    self.ha.restart_member(name)
        elif self.cluster.postgres is not None and self.cluster.postgres.pid is None:
            self.cluster.postgres.start(timeout=60)
        for server in self.shards.servers:
            if server.ha is None and server.primary_pid is None:
                server.wait_writable(60)

    def heal_all(self) -> None:
        self._undo_degradations()
        assert self.cluster.etcd is not None
        for i, m in enumerate(self.cluster.etcd.members):
            if m.pid is None:
                self.cluster.etcd.start_member(i)
        self._heal_store()
        for node_id, node in self.cluster.nodes.items():
            if node.stopped:
                self.cluster.signal(node_id, signal.SIGCONT)
            if CLOCK_FLAG in node.args:
                self.set_clock(node_id, 0)
            elif not node.alive():
                self.cluster.restart_node(node_id)
