"""The local backend: a ``LocalCluster`` whose nodes reach etcd and PostgreSQL through
blackhole proxies, so each node can be cut off alone.

Each node gets one proxy per etcd member and one to PostgreSQL (through the cluster's
``node_args`` hook); the harness itself, the observer and the workers talk to the servers
directly. A clock jump restarts the node with ``--clock-offset-ms``. Everything is stopped by
PID in ``stop()``.
"""

from __future__ import annotations

import contextlib
import os
import signal
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

from chronoq.chaos.faults import ALL_KINDS, FaultKind
from chronoq.chaos.proxy import Blackhole, ProxyHub
from chronoq.local.cluster import ClusterSpec, LocalCluster

CLOCK_FLAG = "--clock-offset-ms"


class LocalBackend:
    """Processes on loopback; supports every fault kind."""

    name = "local"
    supported: frozenset[FaultKind] = frozenset(ALL_KINDS)

    def __init__(self, workdir: Path, spec: ClusterSpec) -> None:
        self.spec = spec
        self.hub = ProxyHub()
        self.proxies: dict[str, dict[str, list[Blackhole]]] = {}
        self.cluster = LocalCluster(workdir, spec, node_args=self._node_args)

    # ------------------------------------------------------------------ lifecycle

    def start(self) -> None:
        try:
            self.cluster.start()
        except BaseException:
            self.hub.close()
            raise

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
            self.hub.close()

    @property
    def dsn(self) -> str:
        return self.cluster.dsn

    @property
    def etcd_endpoints(self) -> list[str]:
        return self.cluster.etcd_endpoints

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
        parts = urlsplit(self.cluster.dsn)
        pg = self.hub.add(f"{parts.hostname}:{parts.port}", f"{node_id}->postgres")
        self.proxies[node_id] = {"etcd": etcd, "postgres": [pg]}
        credentials = parts.netloc.rpartition("@")[0]  # user, and password if there is one
        dsn = urlunsplit(parts._replace(netloc=f"{credentials}@{pg.address}"))
        out = list(args)
        out[out.index("--dsn") + 1] = dsn
        out[out.index("--etcd") + 1] = ",".join(p.address for p in etcd)
        return out

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

    # ------------------------------------------------------------------ network

    def cut(self, node_id: str, service: str) -> None:
        for p in self.proxies[node_id][service]:
            p.cut()

    def heal(self, node_id: str, service: str) -> None:
        for p in self.proxies[node_id][service]:
            p.heal()

    def heal_all(self) -> None:
        for p in self.hub.proxies:
            p.heal()
        assert self.cluster.etcd is not None and self.cluster.postgres is not None
        for i, m in enumerate(self.cluster.etcd.members):
            if m.pid is None:
                self.cluster.etcd.start_member(i)
        if self.cluster.postgres.pid is None:
            self.cluster.postgres.start(timeout=60)
        for node_id, node in self.cluster.nodes.items():
            if node.stopped:
                self.cluster.signal(node_id, signal.SIGCONT)
            if CLOCK_FLAG in node.args:
                self.set_clock(node_id, 0)
            elif not node.alive():
                self.cluster.restart_node(node_id)
