"""A real local cluster as processes: etcd, PostgreSQL and N scheduler nodes on loopback.

Used by ``chronoq dev --nodes N``, the lab, the failover benchmark, the multi-node tests and the
chaos harness. Each node is a ``chronoq node`` process of its own, so tests can SIGKILL, SIGSTOP
or SIGTERM it like an operator (or a crash) would. Everything started here is stopped by
``stop()``, by PID.
"""

from __future__ import annotations

import contextlib
import functools
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from chronoq.embedded.etcd import EmbeddedEtcd, EtcdMember
from chronoq.embedded.postgres import EmbeddedPostgres, free_port
from chronoq.embedded.supervisor import Child
from chronoq.redact import split_password


@dataclass
class NodeProcess:
    """One ``chronoq node`` process."""

    node_id: str
    port: int
    log_file: Path
    args: list[str]
    process: subprocess.Popen[bytes] | None = None
    stopped: bool = False  # SIGSTOPped

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def pid(self) -> int | None:
        return self.process.pid if self.process is not None else None

    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def running_pid(self) -> int | None:
        """The PID while the process runs (also while SIGSTOPped); None once it exited."""
        return self.pid if self.alive() else None


@dataclass
class ClusterSpec:
    """What to run."""

    nodes: int = 3
    etcd_members: int = 1
    partitions: int = 256
    lease_ttl: int = 5
    tick_ms: int = 100
    cluster: str = "dev"
    virtual_clock: bool = False
    durable: bool = True
    base_port: int = 0  # node i listens on base_port + i; 0: free ports
    database: str = "chronoq"
    extra_node_args: Sequence[str] = field(default_factory=tuple)


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
    ) -> None:
        """``node_args(node_id, args)`` may rewrite a new node's command line, e.g. to
        point it at its own proxies (the chaos harness cuts nodes off that way)."""
        self.workdir = workdir
        self.spec = spec or ClusterSpec()
        self._own_postgres = postgres is None
        self._own_etcd = etcd is None
        self.postgres = postgres
        self.etcd = etcd
        self._dsn = dsn
        self._node_args = node_args
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
            if self.postgres is None:
                self.postgres = EmbeddedPostgres(
                    self.workdir / "postgres", durable=self.spec.durable
                )
            if self._own_postgres:
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
        for n in self.nodes.values():
            if n.alive() and n.pid is not None:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(n.pid, signal.SIGCONT)
                    os.kill(n.pid, signal.SIGTERM)
        for n in self.nodes.values():
            self._reap(n, 10.0)
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
        exists = postgres.run_sql(f"SELECT 1 FROM pg_database WHERE datname = '{name}'").strip()
        return postgres.dsn_for(name) if exists else postgres.create_database(name)

    @property
    def dsn(self) -> str:
        if self._dsn is not None:
            return self._dsn
        assert self.postgres is not None
        return self.postgres.dsn

    @property
    def etcd_endpoints(self) -> list[str]:
        assert self.etcd is not None
        return self.etcd.endpoints

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
            "--cluster",
            s.cluster,
            "--lease-ttl",
            str(s.lease_ttl),
            *(["--virtual-clock"] if s.virtual_clock else []),
            *s.extra_node_args,
        ]
        if self._node_args is not None:
            args = self._node_args(node_id, args)
        node = NodeProcess(node_id, port, self.workdir / f"{node_id}.log", args)
        self.nodes[node_id] = node
        self._spawn(node)
        if wait:
            self.wait_serving(node)
        return node

    def _spawn(self, node: NodeProcess) -> None:
        env = {**os.environ, "PYTHONUNBUFFERED": "1"}
        password = split_password(self.dsn)[1]
        if password is not None:  # out of the command line, which any local account can read
            env["PGPASSWORD"] = password
        with node.log_file.open("ab") as log:
            node.process = subprocess.Popen(
                node.args,
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env=env,
                start_new_session=True,
            )
        node.stopped = False

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
            self._reap(node, 1.0)
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
                    f"{node.node_id} exited: see {node.log_file}\n{self.log_tail(node)}"
                )
            if health_of(node.address) == health_pb2.HealthCheckResponse.SERVING:
                return
            time.sleep(0.1)
        raise TimeoutError(f"{node.node_id} not serving after {timeout} s:\n{self.log_tail(node)}")

    def wait_answering(self, node: NodeProcess, timeout: float = 60.0) -> None:
        """Until the node answers health checks at all (SERVING or not): a node started with
        a wrong clock on purpose serves the API but never says SERVING."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if not node.alive():
                raise RuntimeError(
                    f"{node.node_id} exited: see {node.log_file}\n{self.log_tail(node)}"
                )
            if health_of(node.address) is not None:
                return
            time.sleep(0.1)
        raise TimeoutError(f"{node.node_id} not answering after {timeout} s")

    def signal(self, node_id: str, sig: signal.Signals) -> None:
        node = self.nodes[node_id]
        if node.pid is None or not node.alive():
            return
        os.kill(node.pid, sig)
        if sig == signal.SIGSTOP:
            node.stopped = True
        elif sig == signal.SIGCONT:
            node.stopped = False

    def kill(self, node_id: str) -> None:
        self.signal(node_id, signal.SIGKILL)
        self._reap(self.nodes[node_id], 5.0)

    def terminate(self, node_id: str, timeout: float = 10.0) -> float:
        """SIGTERM (graceful handoff); returns how long the process took to exit."""
        node = self.nodes[node_id]
        started = time.monotonic()
        if node.stopped:
            self.signal(node_id, signal.SIGCONT)
        self.signal(node_id, signal.SIGTERM)
        self._reap(node, timeout)
        return time.monotonic() - started

    def _reap(self, node: NodeProcess, timeout: float) -> None:
        if node.process is None:
            return
        try:
            node.process.wait(timeout)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.kill(node.process.pid, signal.SIGKILL)
            node.process.wait(5)

    @staticmethod
    def log_tail(node: NodeProcess, lines: int = 30) -> str:
        try:
            return "\n".join(node.log_file.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""


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
