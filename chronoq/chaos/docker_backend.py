"""The docker backend: the same run against the services of a docker compose deployment.

The harness, the workload and the worker processes (with their ledgers) stay on this host
and reach the services through their published ports; faults act on the containers through
the ``docker`` package: SIGKILL then start a node, pause (cgroup freezer, like SIGSTOP) and
unpause it, restart them one by one, kill and start an etcd member or PostgreSQL. Services
are found by their compose labels, so only their names are needed (the defaults match
docker-compose.yml, started with ``docker compose -p chronoq up -d``)::

    chronoq chaos --backend docker --compose-project chronoq \\
        --docker-nodes node-1,node-2,node-3 --docker-etcd etcd-1,etcd-2,etcd-3 \\
        --docker-postgres db-1,db-2,db-3 --cluster prod --partitions 256 --lease-ttl 5

Where no Docker engine answers, ``DockerUnavailable`` says so and the run is skipped.
"""

from __future__ import annotations

import os
import time
from typing import Any

from chronoq.chaos.fault_plan import FaultKind
from chronoq.chaos.shaping import LinkShape
from chronoq.coordinator.settings import EtcdSettings
from chronoq.errors import ChronoqError, ConfigError
from chronoq.etcd_users import CHRONOQ_USER

NODE_PORT = "7070/tcp"
ETCD_PORT = "2379/tcp"
PG_PORT = "5432/tcp"


class DockerUnavailable(ChronoqError):
    """No Docker engine answers here (or the docker package is missing): skipped."""


def engine() -> Any:
    """A connected docker client, or ``DockerUnavailable`` saying why not."""
    try:
        import docker  # type: ignore[import-untyped,unused-ignore]
    except ImportError as exc:
        raise DockerUnavailable(
            "the docker backend needs the docker package: pip install 'chronoq[docker]'"
        ) from exc
    try:
        client = docker.from_env(timeout=5)
        client.ping()
    except Exception as exc:  # any failure to reach the engine means "none"
        raise DockerUnavailable(f"no Docker engine reachable: {exc}") from exc
    return client


class DockerBackend:
    """Compose services as the cluster; a subset of the faults (no clock jumps, no cuts)."""

    name = "docker"
    supported = frozenset({
        FaultKind.KILL_NODE, FaultKind.FREEZE_NODE, FaultKind.FREEZE_NODE_PAST_TTL,
        FaultKind.KILL_WORKER, FaultKind.PAUSE_WORKER, FaultKind.KILL_ETCD_MEMBER,
        FaultKind.RESTART_POSTGRES, FaultKind.ROLLING_RESTART,
    })

    def __init__(
        self, *, project: str = "chronoq", nodes: tuple[str, ...] = ("node-1", "node-2", "node-3"),
        etcd: tuple[str, ...] = ("etcd-1", "etcd-2", "etcd-3"), postgres: str = "db-1,db-2,db-3",
        dsn: str | None = None,
    ) -> None:
        self.client = engine()
        self.project = project
        self.node_services = list(nodes)
        self.etcd_services = list(etcd)
        # Comma-separated: the members of a replicated store (restart-postgres takes the first).
        self.postgres_services = postgres.split(",")
        self.postgres_service = self.postgres_services[0]
        self._dsn = dsn

    def _container(self, service: str) -> Any:
        found = self.client.containers.list(all=True, filters={"label": [
            f"com.docker.compose.project={self.project}",
            f"com.docker.compose.service={service}"]})
        if not found:
            raise DockerUnavailable(f"no container of service {service!r} in project "
                                    f"{self.project!r}: is the compose deployment up?")
        return found[0]

    def _published(self, service: str, port: str) -> str:
        c = self._container(service)
        c.reload()
        bindings = (c.ports or {}).get(port) or []
        if not bindings:
            raise DockerUnavailable(f"service {service!r} publishes no {port} port")
        return f"127.0.0.1:{bindings[0]['HostPort']}"

    # ------------------------------------------------------------------ what the harness reads

    def start(self) -> None:
        for s in [self.postgres_service, *self.etcd_services, *self.node_services]:
            c = self._container(s)
            if c.status != "running":
                c.start()

    def stop(self) -> None:
        """Leave the deployment running as found, but never paused."""
        for s in self.node_services:
            c = self._container(s)
            c.reload()
            if c.status == "paused":
                c.unpause()

    @property
    def addresses(self) -> list[str]:
        return [self._published(s, NODE_PORT) for s in self.node_services]

    @property
    def dsn(self) -> str:
        if self._dsn:
            return self._dsn
        password = os.environ.get("CHRONOQ_DB_PASSWORD")  # as docker-compose.yml: no default
        if not password:
            raise ConfigError(
                "set CHRONOQ_DB_PASSWORD to the password docker-compose.yml was started with "
                "(or pass the store's DSN)"
            )
        hosts = ",".join(self._published(s, PG_PORT) for s in self.postgres_services)
        query = "?target_session_attrs=read-write" if len(self.postgres_services) > 1 else ""
        return f"postgresql://chronoq:{password}@{hosts}/chronoq{query}"

    @property
    def etcd_endpoints(self) -> list[str]:
        return [self._published(s, ETCD_PORT) for s in self.etcd_services]

    def etcd_settings(self, cluster: str) -> EtcdSettings:
        """The published members, as etcd's user chronoq with the password docker-compose.yml
        was started with (``CHRONOQ_ETCD_PASSWORD``, as for compose: no default)."""
        password = os.environ.get("CHRONOQ_ETCD_PASSWORD")
        if not password:
            raise ConfigError(
                "set CHRONOQ_ETCD_PASSWORD to the etcd password docker-compose.yml was started "
                "with (its etcd requires a login)"
            )
        return EtcdSettings(
            endpoints=self.etcd_endpoints, cluster=cluster, username=CHRONOQ_USER, password=password
        )

    @property
    def node_ids(self) -> list[str]:
        return list(self.node_services)

    # ------------------------------------------------------------------ faults

    def node_alive(self, node_id: str) -> bool:
        c = self._container(node_id)
        c.reload()
        return c.status in ("running", "paused")

    def kill_node(self, node_id: str) -> None:
        self._container(node_id).kill(signal="SIGKILL")

    def restart_node(self, node_id: str) -> None:
        c = self._container(node_id)
        c.reload()
        if c.status == "running":
            c.restart(timeout=10)
        else:
            c.start()
        time.sleep(2.0)  # the node serves within a second or two of starting

    def pause_node(self, node_id: str) -> None:
        self._container(node_id).pause()

    def resume_node(self, node_id: str) -> None:
        self._container(node_id).unpause()

    def set_clock(self, node_id: str, offset_ms: int) -> None:
        raise NotImplementedError("clock jumps need the local backend")

    def etcd_size(self) -> int:
        return len(self.etcd_services)

    def etcd_leader(self) -> int | None:
        return None  # unknown from outside: kill-etcd-member picks any member

    def kill_etcd_member(self, index: int) -> None:
        self._container(self.etcd_services[index]).kill(signal="SIGKILL")

    def start_etcd_member(self, index: int) -> None:
        self._container(self.etcd_services[index]).start()

    def stop_postgres(self, *, crash: bool) -> None:
        c = self._container(self.postgres_service)
        if crash:
            c.kill(signal="SIGKILL")
        else:
            c.stop(timeout=15)

    def start_postgres(self) -> None:
        self._container(self.postgres_service).start()
        time.sleep(3.0)

    def cut(self, node_id: str, service: str) -> None:
        raise NotImplementedError("network cuts need the local backend")

    def heal(self, node_id: str, service: str) -> None:
        raise NotImplementedError("network cuts need the local backend")

    def shape_links(self, service: str, shape: LinkShape, seed: int) -> None:
        raise NotImplementedError("slow links need the local backend's proxies")

    def unshape_links(self, service: str) -> int:
        raise NotImplementedError("slow links need the local backend's proxies")

    def drift_clock(self, node_id: str, offset_ms: int) -> None:
        raise NotImplementedError("clock drifts need the local backend")

    def fill_disk(self) -> int:
        raise NotImplementedError("disk-full needs the local backend's capped filesystem")

    def free_disk(self) -> bool:
        raise NotImplementedError("disk-full needs the local backend's capped filesystem")

    def heal_all(self) -> None:
        for s in [self.postgres_service, *self.etcd_services, *self.node_services]:
            c = self._container(s)
            c.reload()
            if c.status == "paused":
                c.unpause()
            elif c.status != "running":
                c.start()
