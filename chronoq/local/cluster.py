"""A real local cluster as processes: etcd, PostgreSQL and N scheduler nodes on loopback.

Used by ``chronoq dev --nodes N``, the lab, the failover benchmark, the multi-node tests and the
chaos harness. Each node is a ``chronoq node`` process of its own, so tests can SIGKILL, SIGSTOP
or SIGTERM it like an operator (or a crash) would. Everything started here is stopped by
``stop()``, by PID.
"""

from __future__ import annotations

import functools
import signal
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from chronoq.buckets import DEFAULT_PARTITIONS
from chronoq.config import DEFAULT_TICK
from chronoq.coordinator.settings import EtcdSettings
from chronoq.coordinator.ttl import DEFAULT_LEASE_TTL
from chronoq.embedded.etcd import EmbeddedEtcd, EtcdMember
from chronoq.embedded.passfile import write_passfile
from chronoq.embedded.postgres import EmbeddedPostgres, free_port
from chronoq.embedded.supervisor import Child
from chronoq.local.child import ChildProcess, stop_all
from chronoq.redact import split_password
from chronoq.saturating import ms_of


@dataclass
class NodeProcess(ChildProcess):
    """One ``chronoq node`` process."""

    node_id: str = ""
    port: int = 0
    args: list[str] = field(default_factory=list)

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"


#: How long a node may take to hand its partitions off and exit after SIGTERM (seconds).
NODE_STOP_GRACE_S = 10.0


@dataclass
class ClusterSpec:
    """What to run."""

    nodes: int = 3
    etcd_members: int = 1
    partitions: int = DEFAULT_PARTITIONS
    lease_ttl: int = DEFAULT_LEASE_TTL
    tick_ms: int = ms_of(DEFAULT_TICK)
    cluster: str = "dev"
    virtual_clock: bool = False
    durable: bool = True
    base_port: int = 0  # node i listens on base_port + i; 0: free ports
    database: str = "chronoq"
    extra_node_args: Sequence[str] = field(default_factory=tuple)
    #: Extra PostgreSQL server settings of the embedded store (e.g. diagnostics).
    postgres_settings: Mapping[str, str] = field(default_factory=dict)


class LocalCluster:
    """Start and stop the whole cluster; signal single nodes."""

    def __init__(
        self,
        workdir: Path,
        spec: ClusterSpec | None = None,
        *,
        postgres: EmbeddedPostgres | None = None,
        etcd: EmbeddedEtcd | None = None,
        dsn: str | None = None,
        node_args: Callable[[str, list[str]], list[str]] | None = None,
        store_shards: Sequence[str] = (),
    ) -> None:
        """``node_args(node_id, args)`` may rewrite a new node's command line, e.g. to
        point it at its own proxies (the chaos harness cuts nodes off that way).
        ``store_shards``: the DSNs (passwords included) of shard-1, shard-2, ...: each node
        gets ``--store-shard`` with the DSN without its password, and a password file with
        every shard's password (``chronoq.embedded.passfile``)."""
        self.workdir = workdir
        self.spec = spec or ClusterSpec()
        # A DSN without a server: an external store (e.g. a replicated one), not ours to run.
        self._own_postgres = postgres is None and dsn is None
        self._own_etcd = etcd is None
        self.postgres = postgres
        self.etcd = etcd
        self._dsn = dsn
        self._node_args = node_args
        self.store_shards = list(store_shards)
        self.nodes: dict[str, NodeProcess] = {}
        self._next = 0

    # ------------------------------------------------------------------ lifecycle

    def start(self, timeout: float = 60.0) -> None:
        self.workdir.mkdir(parents=True, exist_ok=True)
        try:
            if self.etcd is None:
                self.etcd = EmbeddedEtcd(
                    self.workdir / "etcd", members=self.spec.etcd_members, durable=self.spec.durable
                )
            if self._own_etcd:
                self.etcd.start()
            if self.postgres is None and self._own_postgres:
                self.postgres = EmbeddedPostgres(
                    self.workdir / "postgres",
                    durable=self.spec.durable,
                    settings=self.spec.postgres_settings,
                )
            if self._own_postgres and self.postgres is not None:
                self.postgres.start()
                if self._dsn is None:
                    self._dsn = self._ensure_database(self.postgres, self.spec.database)
            for _ in range(self.spec.nodes):
                self.add_node(wait=False)
            for n in self.nodes.values():
                self.wait_serving(n, timeout)
        except BaseException:
            self.stop()
            raise

    def stop(self) -> None:
        """Stop every node (SIGTERM, then SIGKILL), then etcd and PostgreSQL if ours."""
        stop_all(self.nodes.values(), NODE_STOP_GRACE_S)
        if self._own_etcd and self.etcd is not None:
            self.etcd.stop()
        if self._own_postgres and self.postgres is not None:
            self.postgres.stop()

    def __enter__(self) -> LocalCluster:
        self.start()
        return self

    def __exit__(
        self, et: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()

    @staticmethod
    def _ensure_database(postgres: EmbeddedPostgres, name: str) -> str:
        return postgres.ensure_database(name)[0]

    @property
    def dsn(self) -> str:
        if self._dsn is not None:
            return self._dsn
        assert self.postgres is not None
        return self.postgres.dsn

    @property
    def tcp_dsn(self) -> str:
        """``dsn`` over TCP when it goes to the embedded server's socket (for proxies)."""
        if self.postgres is not None:
            return self.postgres.over_tcp(self.dsn)
        return self.dsn

    @property
    def etcd_endpoints(self) -> list[str]:
        assert self.etcd is not None
        return self.etcd.endpoints

    @property
    def etcd_node_args(self) -> list[str]:
        """The node flags that carry etcd's credentials (user and password file)."""
        assert self.etcd is not None
        return self.etcd.node_args()

    def etcd_settings(self, cluster: str | None = None) -> EtcdSettings:
        """How a tool reaches this cluster's etcd as the nodes do (credentials included)."""
        assert self.etcd is not None
        return self.etcd.client_settings(cluster or self.spec.cluster)

    @property
    def addresses(self) -> list[str]:
        return [n.address for n in self.nodes.values() if n.alive()]

    # ------------------------------------------------------------------ nodes

    def add_node(self, node_id: str | None = None, *, wait: bool = True) -> NodeProcess:
        node_id = node_id or f"node-{self._next}"
        port = self.spec.base_port + self._next if self.spec.base_port else free_port()
        self._next += 1
        s = self.spec
        args = [
            sys.executable,
            "-m",
            "chronoq.cli",
            "node",
            "--dsn",
            split_password(self.dsn)[0],  # the password goes in the environment: see _spawn
            "--port",
            str(port),
            "--node-id",
            node_id,
            "--partitions",
            str(s.partitions),
            "--tick-ms",
            str(s.tick_ms),
            "--etcd",
            ",".join(self.etcd_endpoints),
            *self.etcd_node_args,
            "--cluster",
            s.cluster,
            "--lease-ttl",
            str(s.lease_ttl),
            *(["--virtual-clock"] if s.virtual_clock else []),
            *self.shard_args,
            *s.extra_node_args,
        ]
        if self._node_args is not None:
            args = self._node_args(node_id, args)
        node = NodeProcess(self.workdir / f"{node_id}.log", node_id=node_id, port=port, args=args)
        self.nodes[node_id] = node
        self._spawn(node)
        if wait:
            self.wait_serving(node)
        return node

    @property
    def shard_args(self) -> list[str]:
        """``--store-shard DSN`` for shard-1, shard-2, ... (DSNs without passwords)."""
        return [a for dsn in self.store_shards for a in ("--store-shard", split_password(dsn)[0])]

    @property
    def passfile(self) -> Path:
        """The nodes' password file, when the store has several shards."""
        return self.workdir / "store-passwords"

    def _spawn(self, node: NodeProcess) -> None:
        password = split_password(self.dsn)[1]
        # The password goes in the environment, out of the command line that any local
        # account can read.
        if not self.store_shards:
            node.spawn(node.args, {"PGPASSWORD": password} if password is not None else None)
            return
        # One PGPASSWORD would be used for every shard: a password file names each server.
        # Its last line gives shard-0's password to any address, for a node that reaches
        # shard-0 through a proxy of its own (the chaos harness's).
        write_passfile(self.passfile, [*self.store_shards, self.dsn], fallback=self.dsn)
        node.spawn(node.args, {"PGPASSFILE": str(self.passfile)})

    def restart_node(self, node_id: str, *, wait: bool = True) -> NodeProcess:
        node = self.nodes[node_id]
        if node.alive():
            self.terminate(node_id)
        self._spawn(node)
        if wait:
            self.wait_serving(node)
        return node

    def start_dead_node(self, node_id: str, timeout: float = 60.0) -> None:
        """Start a node that exited again, with its old command line; wait until it serves."""
        node = self.nodes[node_id]
        if not node.alive():
            node.reap(1.0)
            self._spawn(node)
        self.wait_serving(node, timeout)

    def children(self) -> list[Child]:
        """The processes this cluster started (its etcd members, if its own, and the nodes),
        for a ``Supervisor`` to keep running."""
        out: list[Child] = []
        if self._own_etcd and self.etcd is not None:
            etcd = self.etcd
            for index, member in enumerate(etcd.members):
                out.append(
                    Child(
                        f"etcd member {member.name}",
                        pid=functools.partial(_member_pid, member),
                        start=functools.partial(etcd.start_member, index),
                    )
                )
        for node_id, node in self.nodes.items():
            out.append(
                Child(
                    f"node {node_id}",
                    pid=node.running_pid,
                    start=functools.partial(self.start_dead_node, node_id),
                )
            )
        return out

    def wait_serving(self, node: NodeProcess, timeout: float = 60.0) -> None:
        """Until the node's gRPC health check says SERVING (its ownership has started)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if not node.alive():
                raise RuntimeError(
                    f"{node.node_id} exited: see {node.log_file}\n{node.log_tail()}"
                )
            if health_of(node.address) == health_pb2.HealthCheckResponse.SERVING:
                return
            time.sleep(0.1)
        raise TimeoutError(f"{node.node_id} not serving after {timeout} s:\n{node.log_tail()}")

    def wait_answering(self, node: NodeProcess, timeout: float = 60.0) -> None:
        """Until the node answers health checks at all (SERVING or not): a node started with
        a wrong clock on purpose serves the API but never says SERVING."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if not node.alive():
                raise RuntimeError(
                    f"{node.node_id} exited: see {node.log_file}\n{node.log_tail()}"
                )
            if health_of(node.address) is not None:
                return
            time.sleep(0.1)
        raise TimeoutError(f"{node.node_id} not answering after {timeout} s")

    def signal(self, node_id: str, sig: signal.Signals) -> None:
        self.nodes[node_id].signal(sig)

    def kill(self, node_id: str) -> None:
        self.nodes[node_id].kill()

    def terminate(self, node_id: str, timeout: float = NODE_STOP_GRACE_S) -> float:
        """SIGTERM (graceful handoff); returns how long the process took to exit."""
        return self.nodes[node_id].terminate(timeout)


def _member_pid(member: EtcdMember) -> int | None:
    return member.pid


def health_of(address: str, timeout: float = 1.0) -> int | None:
    """The gRPC health status of a node, or None when it does not answer."""
    with grpc.insecure_channel(address) as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        try:
            reply = stub.Check(health_pb2.HealthCheckRequest(service=""), timeout=timeout)
        except grpc.RpcError:
            return None
        return int(reply.status)
