"""What a Patroni-managed PostgreSQL cluster on loopback looks like: addresses, each member's
Patroni configuration, the multi-host DSN, and how to read Patroni's ``/cluster`` answer.

Pure: no processes, files or sockets, so every rule here is unit-tested on its own.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote

#: Members of one HA store: 2 is the least that replicates, 5 plenty for a laptop.
MIN_MEMBERS = 2
MAX_MEMBERS = 5
#: Loopback addresses of the members, one each. ``patroni --validate-config`` refuses
#: 127.0.0.1 as a connect address; the rest of 127.0.0.0/8 is loopback on Linux too.
MEMBER_HOSTS = ("127.0.0.2", "127.0.0.3", "127.0.0.4", "127.0.0.5", "127.0.0.6")
#: Patroni's leader key TTL in etcd. 20 s is the least Patroni accepts: it bounds the time to
#: replace a member lost whole (Patroni and postgres); a crashed postmaster alone is restarted
#: by its own Patroni much sooner.
TTL_S = 20
#: Seconds between two runs of Patroni's HA loop: how soon it notices a dead postmaster.
LOOP_WAIT_S = 1
#: Seconds Patroni retries etcd and PostgreSQL before it gives up on them for a loop.
RETRY_TIMEOUT_S = 5
#: How long Patroni waits for a crashed primary to come back before it fails over.
PRIMARY_START_TIMEOUT_S = 30
#: Connections each member accepts.
MAX_CONNECTIONS = 300
#: Role names (PostgreSQL logins): the superuser (setup only), replication, and the role the
#: nodes log in as, which owns chronoq's database and nothing more.
SUPERUSER = "postgres"
REPLICATION_USER = "replicator"
APP_ROLE = "chronoq"
#: The user of Patroni's REST API: every unsafe call (switchover, restart, reinitialise, a
#: configuration change) wants its password; without it, any local account could run a
#: command as the PostgreSQL account (``archive_command`` through ``PATCH /config``).
RESTAPI_USER = "chronoq"
#: The sub-path of etcd under which Patroni keeps its keys (``<namespace>/<scope>/...``).
NAMESPACE = "/chronoq-patroni/"


@dataclass(frozen=True)
class MemberAddress:
    """Where one member listens: PostgreSQL and Patroni's REST API, on its own address."""

    name: str
    host: str
    pg_port: int
    api_port: int

    @property
    def api_url(self) -> str:
        return f"http://{self.host}:{self.api_port}"


def member_addresses(members: int, ports: Sequence[int]) -> list[MemberAddress]:
    """Name and place ``members`` members; ``ports`` holds two per member (PostgreSQL, API)."""
    check_members(members)
    if len(ports) < 2 * members:
        raise ValueError(f"{members} members need {2 * members} ports, got {len(ports)}")
    return [
        MemberAddress(f"pg{i}", MEMBER_HOSTS[i], ports[2 * i], ports[2 * i + 1])
        for i in range(members)
    ]


def check_members(members: int) -> None:
    """Refuse a member count outside ``MIN_MEMBERS..MAX_MEMBERS``, saying what is allowed."""
    if not MIN_MEMBERS <= members <= MAX_MEMBERS:
        raise ValueError(
            f"PostgreSQL members must be {MIN_MEMBERS}..{MAX_MEMBERS} for a replicated store "
            f"(or 1 for a single server), got {members}"
        )


def multi_host_dsn(
    members: Sequence[MemberAddress], password: str, database: str, *, user: str = SUPERUSER
) -> str:
    """One DSN naming every member; ``target_session_attrs=read-write`` makes the driver skip
    standbys, so a pool reconnects to whichever member is the primary now."""
    hosts = ",".join(f"{m.host}:{m.pg_port}" for m in members)
    credentials = f"{quote(user, safe='')}:{quote(password, safe='')}"
    return (
        f"postgresql://{credentials}@{hosts}/{quote(database, safe='')}"
        "?target_session_attrs=read-write"
    )


def member_config(
    *,
    scope: str,
    member: MemberAddress,
    etcd_hosts: Sequence[str],
    data_dir: str,
    bin_dir: str,
    socket_dir: str,
    pgpass: str,
    superuser_password: str,
    replication_password: str,
    restapi_password: str,
    durable: bool = True,
    parameters: Mapping[str, str] | None = None,
    etcd_auth: tuple[str, str] | None = None,
) -> dict[str, Any]:
    """Patroni's configuration of one member (written as JSON, which is valid YAML).

    Synchronous replication, strict: a commit is acknowledged only once a standby has it, so
    a failover to that standby loses no acknowledged commit; with no standby left, writes wait
    instead of going unreplicated. ``failsafe_mode`` keeps the primary writable through an
    etcd outage while every member still answers it.
    """
    server: dict[str, str] = {
        "shared_buffers": "128MB",
        "wal_level": "replica",
        "hot_standby": "on",
        "wal_log_hints": "on",  # pg_rewind of a former primary
        "max_wal_senders": "10",
        "max_replication_slots": "10",
        "wal_keep_size": "256MB",
        "timezone": "UTC",
        "log_timezone": "UTC",
        "unix_socket_directories": socket_dir,
        "logging_collector": "off",
    }
    if not durable:
        # A process crash keeps the OS cache, so only a machine crash loses data; commits
        # still wait for the synchronous standby. full_page_writes stays on: pg_rewind needs it.
        server["fsync"] = "off"
    server.update(parameters or {})
    network = "127.0.0.0/8"
    return {
        "scope": scope,
        "namespace": NAMESPACE,
        "name": member.name,
        "log": {"level": "INFO"},
        "restapi": {
            "listen": f"{member.host}:{member.api_port}",
            "connect_address": f"{member.host}:{member.api_port}",
            "authentication": {"username": RESTAPI_USER, "password": restapi_password},
        },
        "etcd3": {
            "hosts": list(etcd_hosts),
            "protocol": "http",
            # etcd's user for Patroni (its own namespace only): user name and password.
            **({"username": etcd_auth[0], "password": etcd_auth[1]} if etcd_auth else {}),
        },
        "bootstrap": {
            "dcs": {
                "ttl": TTL_S,
                "loop_wait": LOOP_WAIT_S,
                "retry_timeout": RETRY_TIMEOUT_S,
                "primary_start_timeout": PRIMARY_START_TIMEOUT_S,
                "maximum_lag_on_failover": 1048576,
                "synchronous_mode": True,
                "synchronous_mode_strict": True,
                "failsafe_mode": True,
                "postgresql": {
                    "use_pg_rewind": True,
                    "use_slots": True,
                    # Patroni takes these from etcd only (equal on every member): 3 nodes'
                    # pools and the benchmarks' exceed the default 100.
                    "parameters": {"max_connections": MAX_CONNECTIONS},
                },
            },
            "initdb": [{"encoding": "UTF8"}, {"locale": "C"}],
        },
        "postgresql": {
            "listen": f"{member.host}:{member.pg_port}",
            "connect_address": f"{member.host}:{member.pg_port}",
            "data_dir": data_dir,
            "bin_dir": bin_dir,
            "pgpass": pgpass,
            "authentication": {
                "superuser": {"username": SUPERUSER, "password": superuser_password},
                "replication": {"username": REPLICATION_USER, "password": replication_password},
            },
            "pg_hba": [
                "local all all scram-sha-256",
                f"host all all {network} scram-sha-256",
                f"host replication {REPLICATION_USER} {network} scram-sha-256",
            ],
            "parameters": server,
        },
        "tags": {"nofailover": False, "noloadbalance": False, "clonefrom": False},
    }


@dataclass(frozen=True)
class Topology:
    """Who is what, from Patroni's ``GET /cluster``."""

    leader: str | None
    sync_standbys: tuple[str, ...]
    streaming: tuple[str, ...]  # replicas (sync or not) receiving WAL now
    running: tuple[str, ...]  # members whose postgres runs, leader included

    def ready(self, members: int) -> bool:
        """A leader that runs, every other member streaming, and a synchronous standby."""
        if self.leader is None or self.leader not in self.running:
            return False
        return len(self.streaming) == members - 1 and bool(self.sync_standbys)

    def writable(self) -> bool:
        """A running leader with a synchronous standby: a commit can be acknowledged."""
        return self.leader is not None and self.leader in self.running and bool(self.sync_standbys)


def topology(cluster: Mapping[str, Any]) -> Topology:
    """Read the JSON of ``GET /cluster`` (Patroni 3 and 4 role and state names)."""
    leader = None
    sync: list[str] = []
    streaming: list[str] = []
    running: list[str] = []
    for m in cluster.get("members", []):
        name, role, state = str(m.get("name")), m.get("role"), m.get("state")
        if role in ("leader", "master", "primary"):
            leader = name
            if state == "running":
                running.append(name)
            continue
        if role == "sync_standby":
            sync.append(name)
        if state == "streaming":
            streaming.append(name)
            running.append(name)
        elif state == "running":
            running.append(name)
    return Topology(leader, tuple(sync), tuple(streaming), tuple(running))
