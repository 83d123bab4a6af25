"""A replicated PostgreSQL on loopback: N members, each a Patroni process that runs its own
postgres, with Patroni's leader lock in the stack's etcd.

Each member listens on an address of its own (``127.0.0.2``, ``.3``, ...), PostgreSQL and
Patroni's REST API alike, so the multi-host DSN names them all and a member's role is asked
from its REST API. Faults are what an operator or a crash does to real processes: SIGKILL of
the primary's postmaster (its Patroni restarts it), SIGKILL of a whole member (Patroni and
its postgres: killing Patroni alone leaves postgres running, so its PID is read from
``postmaster.pid``), a switchover through the REST API. ``stop`` ends everything by PID and
always runs from ``__exit__``.
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import pwd
import secrets
import shutil
import signal
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Sequence
from pathlib import Path
from types import TracebackType
from typing import Any

from chronoq.coordinator.credentials import read_password
from chronoq.embedded.ha.config import (
    APP_ROLE,
    MEMBER_HOSTS,
    RESTAPI_USER,
    SUPERUSER,
    Topology,
    member_addresses,
    member_config,
    multi_host_dsn,
    topology,
)
from chronoq.embedded.ha.install import (
    PatroniError,
    ensure_patroni,
    postgres_bin_dir,
    run_as,
)
from chronoq.embedded.ha.member import Member, free_ports, signal_pid, tail, traversable
from chronoq.embedded.pg_auth import give_database_sql, give_tables_sql, role_sql
from chronoq.embedded.pg_quote import quote_ident, quote_literal
from chronoq.embedded.supervisor import Child
from chronoq.private_files import write_private

# Loopback only: never let http_proxy and friends intercept Patroni's REST API.
_HTTP = urllib.request.build_opener(urllib.request.ProxyHandler({}))
#: Seconds for one REST call; Patroni answers in ms unless it is stuck.
API_TIMEOUT_S = 2.0
#: Seconds a member gets to stop (Patroni stops its postgres first) before SIGKILL.
STOP_TIMEOUT_S = 20.0
_POLL_S = 0.1
#: The generated secrets (mode 0600): PostgreSQL's superuser, replication and the nodes' role,
#: and Patroni's REST API.
PASSWORDS_FILE = "ha-passwords.json"
_SECRETS = ("superuser", "replication", "app", "restapi")
#: A write that proves the store takes commits (in the ``postgres`` database, never chronoq's).
PROBE_SQL = (
    "CREATE TABLE IF NOT EXISTS chronoq_ha_probe (id int PRIMARY KEY, at timestamptz);"
    "INSERT INTO chronoq_ha_probe VALUES (1, now()) ON CONFLICT (id) DO UPDATE SET at = now()"
)
PROBE_TIMEOUT_S = 5.0


class PatroniCluster:
    """Start, fault and stop N Patroni members on the stack's etcd; a context manager."""

    def __init__(
        self,
        workdir: Path,
        etcd_endpoints: Sequence[str],
        *,
        members: int = 3,
        durable: bool = False,
        scope: str | None = None,
        etcd_auth: tuple[str, Path] | None = None,
    ) -> None:
        """Describe the cluster; nothing runs until ``start``.

        Args:
            workdir: Member ``pgN`` keeps its data, config and log in ``workdir/pgN``; a
                workdir kept across runs starts from its data (restart: ~10 s).
            etcd_endpoints: ``host:port`` of the etcd Patroni keeps its leader lock in.
            members: 2..5; 3 keeps a synchronous standby through the loss of any one member.
            durable: False turns fsync off: a process crash loses nothing, a machine crash may.
            scope: Patroni's cluster name (its etcd keys); default: unique to the workdir.
            etcd_auth: etcd's user for Patroni and the file of its password (read when the
                members' configurations are written, which only their account may read).
        """
        self.workdir = Path(workdir).resolve()
        self.etcd_endpoints = list(etcd_endpoints)
        self.etcd_auth = etcd_auth
        self.durable = durable
        self.scope = scope or f"chronoq-{secrets.token_hex(4)}"
        ports = free_ports([MEMBER_HOSTS[i // 2] for i in range(2 * members)])
        self.addresses = member_addresses(members, ports)
        self.members = {
            a.name: Member(
                a,
                home=self.workdir / a.name,
                log_file=self.workdir / f"{a.name}.log",
                socket_dir=Path("/tmp") / f"cqha-{secrets.token_hex(4)}",
            )
            for a in self.addresses
        }
        self._user: pwd.struct_passwd | None = None
        self._patroni: Path | None = None
        self._bin_dir: Path | None = None
        self._passwords: dict[str, str] = {}

    def __repr__(self) -> str:
        return f"PatroniCluster(workdir={str(self.workdir)!r}, members={list(self.members)})"

    # -- addresses ---------------------------------------------------------------------------

    @property
    def password(self) -> str:
        """The superuser's password (generated on the first start, kept in the workdir)."""
        return self._load_passwords()["superuser"]

    @property
    def restapi_auth(self) -> tuple[str, str]:
        """User and password of Patroni's REST API, which its unsafe calls want."""
        return RESTAPI_USER, self._load_passwords()["restapi"]

    def dsn_for(self, database: str, *, admin: bool = False) -> str:
        """The multi-host DSN of ``database`` as the nodes' role (the superuser with
        ``admin``): it reaches whichever member is primary."""
        if admin:
            return multi_host_dsn(self.addresses, self.password, database)
        app = self._load_passwords()["app"]
        return multi_host_dsn(self.addresses, app, database, user=APP_ROLE)

    @property
    def bin_dir(self) -> Path:
        if self._bin_dir is None:
            self._bin_dir = postgres_bin_dir()
        return self._bin_dir

    # -- lifecycle ---------------------------------------------------------------------------

    def start(self, timeout: float = 120.0) -> None:
        """Install what is missing, start every member, wait for a leader and a sync standby.

        Raises:
            PatroniUnavailable: Patroni cannot be installed or run here.
            PatroniError: the members did not become ready in time (with their log tails).
        """
        self._user = run_as()
        self._patroni = ensure_patroni()
        _ = self.bin_dir
        try:
            self._prepare()
            for member in self.members.values():
                self._spawn(member)
            self.wait_ready(timeout)
            self.wait_writable(timeout)
            self.run_sql(role_sql(APP_ROLE, self._load_passwords()["app"]), hidden=True)
        except BaseException:
            self.stop()
            raise

    def stop(self, timeout: float = STOP_TIMEOUT_S) -> None:
        """Stop every member (SIGTERM to Patroni, which stops its postgres), then SIGKILL what
        is left, postgres processes included, by PID. Safe to call repeatedly."""
        for member in self.members.values():
            if (pid := member.patroni_pid) is not None:
                signal_pid(pid, signal.SIGCONT)
                signal_pid(pid, signal.SIGTERM)
        deadline = time.monotonic() + timeout
        for member in self.members.values():
            if member.process is not None:
                with contextlib.suppress(subprocess.TimeoutExpired):
                    member.process.wait(max(0.1, deadline - time.monotonic()))
        for member in self.members.values():
            member.kill(self.bin_dir)
            shutil.rmtree(member.socket_dir, ignore_errors=True)

    def __enter__(self) -> PatroniCluster:
        self.start()
        return self

    def __exit__(
        self, et: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()

    def wait_ready(self, timeout: float = 120.0) -> Topology:
        """Wait until a leader runs, every other member streams, and one is synchronous."""
        deadline = time.monotonic() + timeout
        while True:
            seen = self.topology()
            if seen is not None and seen.ready(len(self.members)):
                return seen
            if all(m.patroni_pid is None for m in self.members.values()):
                raise PatroniError(f"every Patroni member exited:\n{self.log_tails()}")
            if time.monotonic() > deadline:
                raise PatroniError(
                    f"the PostgreSQL members were not ready within {timeout:g} s "
                    f"(last seen: {seen}):\n{self.log_tails()}"
                )
            time.sleep(_POLL_S)

    def wait_writable(self, timeout: float = 60.0) -> str:
        """Wait until the primary commits a write (acknowledged by the synchronous standby);
        return its name. Roles alone are not enough: Patroni reports those of before a fault
        until its next loop, and the others name a dead leader until its key expires."""
        deadline = time.monotonic() + timeout
        while True:
            seen = self.topology()
            if seen is not None and seen.writable() and seen.leader is not None:
                if self._says_primary(seen.leader) and self._commits(seen.leader):
                    return seen.leader
            if time.monotonic() > deadline:
                raise PatroniError(f"no writable primary within {timeout:g} s (seen: {seen})")
            time.sleep(_POLL_S)

    # -- what runs ---------------------------------------------------------------------------

    def topology(self) -> Topology | None:
        """Roles as Patroni reports them (from the first member that answers), else None."""
        for member in self.members.values():
            if member.patroni_pid is None:
                continue
            with contextlib.suppress(OSError, ValueError, urllib.error.URLError):
                with _HTTP.open(f"{member.address.api_url}/cluster", timeout=API_TIMEOUT_S) as r:
                    return topology(json.loads(r.read()))
        return None

    def _commits(self, name: str) -> bool:
        """Whether member ``name`` commits a write within ``PROBE_TIMEOUT_S`` (a commit waits
        for the synchronous standby, whatever statement_timeout says: psql is cut off)."""
        try:
            self.run_sql(PROBE_SQL, on=name, timeout=PROBE_TIMEOUT_S)
        except PatroniError:
            return False
        return True

    def _says_primary(self, name: str) -> bool:
        """Whether member ``name``'s own REST API answers 200 on ``/primary``."""
        member = self.members[name]
        if member.patroni_pid is None:
            return False
        try:
            with _HTTP.open(f"{member.address.api_url}/primary", timeout=API_TIMEOUT_S) as r:
                return bool(r.status == 200)
        except (OSError, ValueError, urllib.error.URLError):
            return False

    def leader(self) -> str | None:
        seen = self.topology()
        return seen.leader if seen is not None else None

    def state(self) -> list[dict[str, Any]]:
        """Each member's addresses and PIDs (for ``dev.json``)."""
        return [
            {
                "name": m.name,
                "postgres": f"{m.address.host}:{m.address.pg_port}",
                "api": m.address.api_url,
                "patroni_pid": m.patroni_pid,
                "postmaster_pid": m.postmaster_pid,
                "log": str(m.log_file),
            }
            for m in self.members.values()
        ]

    def children(self) -> list[Child]:
        """One supervised child per member: Patroni's PID; restarted with its data."""
        return [
            Child(
                f"PostgreSQL {m.name} (Patroni)",
                pid=lambda m=m: m.patroni_pid,  # type: ignore[misc]
                start=lambda n=m.name: self.restart_member(n),  # type: ignore[misc]
            )
            for m in self.members.values()
        ]

    def log_tails(self) -> str:
        return "\n".join(f"--- {m.log_file}\n{tail(m.log_file)}" for m in self.members.values())

    # -- faults ------------------------------------------------------------------------------

    def kill_postmaster(self, name: str | None = None) -> str:
        """SIGKILL the postmaster of ``name`` (default: the leader); its Patroni is left to
        notice. Returns the member's name."""
        member = self._member(name)
        pid = member.postmaster_pid
        if pid is None:
            raise PatroniError(f"{member.name} has no running postmaster")
        signal_pid(pid, signal.SIGKILL)
        return member.name

    def kill_member(self, name: str | None = None) -> str:
        """SIGKILL Patroni and every postgres process of ``name`` (default: the leader), as a
        lost machine would; ``restart_member`` brings it back. Returns the member's name."""
        member = self._member(name)
        member.kill(self.bin_dir)
        return member.name

    def kill_standby(self) -> str:
        """Kill a synchronous standby whole (writes wait until another becomes synchronous)."""
        seen = self._topology()
        candidates = seen.sync_standbys or tuple(
            n for n in self.members if n != seen.leader and self.members[n].patroni_pid
        )
        if not candidates:
            raise PatroniError(f"no standby to kill (seen: {seen})")
        return self.kill_member(candidates[0])

    def switchover(self, candidate: str | None = None, timeout: float = 60.0) -> str:
        """Graceful switchover through the leader's REST API; returns the new leader once it
        takes writes. Waits first for a synchronous standby to switch to (Patroni refuses a
        switchover without one, e.g. right after a failover)."""
        self.wait_writable(timeout)
        seen = self._topology()
        if seen.leader is None:
            raise PatroniError("no leader to switch over from")
        body: dict[str, str] = {"leader": seen.leader}
        if candidate is not None:
            body["candidate"] = candidate
        request = urllib.request.Request(
            f"{self.members[seen.leader].address.api_url}/switchover",
            data=json.dumps(body).encode(),
            method="POST",
            headers={"Content-Type": "application/json", **self.api_headers()},
        )
        try:
            with _HTTP.open(request, timeout=timeout) as reply:
                reply.read()
        except urllib.error.HTTPError as exc:
            raise PatroniError(f"switchover refused: {exc.code} {exc.read().decode()}") from exc
        except (OSError, urllib.error.URLError) as exc:
            raise PatroniError(f"switchover failed: {exc}") from exc
        deadline = time.monotonic() + timeout
        while True:
            new = self.topology()
            if new is not None and new.writable() and new.leader != seen.leader:
                assert new.leader is not None
                return new.leader
            if time.monotonic() > deadline:
                raise PatroniError(f"no new leader within {timeout:g} s (seen: {new})")
            time.sleep(_POLL_S)

    def api_headers(self) -> dict[str, str]:
        """The ``Authorization`` header of an unsafe REST call (basic, over loopback)."""
        user, password = self.restapi_auth
        token = base64.b64encode(f"{user}:{password}".encode()).decode()
        return {"Authorization": f"Basic {token}"}

    def restart_member(self, name: str, timeout: float = 120.0) -> None:
        """Start a member that is down again, on its data; wait until its postgres runs."""
        member = self.members[name]
        if member.patroni_pid is None:
            member.kill(self.bin_dir)  # its postgres may outlive a killed Patroni
            self._spawn(member)
        deadline = time.monotonic() + timeout
        while True:
            seen = self.topology()
            if seen is not None and name in seen.running:
                return
            if member.patroni_pid is None:
                raise PatroniError(f"{name} exited while starting:\n{tail(member.log_file)}")
            if time.monotonic() > deadline:
                raise PatroniError(f"{name} did not run within {timeout:g} s (seen: {seen})")
            time.sleep(_POLL_S)

    # -- SQL ---------------------------------------------------------------------------------

    def run_sql(
        self,
        sql: str,
        database: str = "postgres",
        *,
        on: str | None = None,
        timeout: float = 60,
        hidden: bool = False,
    ) -> str:
        """Run ``sql`` as the superuser with psql on member ``on`` (default: the current
        primary); unaligned, tuples-only output. ``hidden``: ``sql`` carries a secret, so it
        goes on psql's stdin, not its command line or an error message."""
        member = self._member(on)
        shown = "a statement with a secret" if hidden else repr(sql)
        env = {k: v for k, v in os.environ.items() if not k.startswith("PG")}
        env |= {"PGPASSWORD": self.password, "PGCONNECT_TIMEOUT": "10", "LC_ALL": "C"}
        cmd = [str(self.bin_dir / "psql"), "-X", "-q", "-A", "-t", "-v", "ON_ERROR_STOP=1"]
        cmd += ["-h", member.address.host, "-p", str(member.address.pg_port), "-U", SUPERUSER]
        cmd += ["-d", database, *([] if hidden else ["-c", sql])]
        try:
            result = subprocess.run(
                cmd, capture_output=True, text=True, env=env, timeout=timeout, check=False,
                input=sql if hidden else None, stdin=None if hidden else subprocess.DEVNULL,
            )  # fmt: skip
        except subprocess.TimeoutExpired as exc:
            raise PatroniError(f"psql timed out running {shown}") from exc
        if result.returncode != 0:
            raise PatroniError(f"psql failed running {shown}: {result.stderr.strip()}")
        return result.stdout

    def ensure_database(self, name: str, *, template: str | None = None) -> str:
        """Create ``name`` on the primary if missing (the standbys replicate it), owned by the
        nodes' role; one made by an older chronoq is given to that role, tables and all.
        ``template``: a database to copy when creating (a migrated one, with no connection
        open to it: much faster than migrating each database). Returns its DSN (as that
        role)."""
        exists = f"SELECT 1 FROM pg_database WHERE datname = {quote_literal(name)}"
        if not self.run_sql(exists).strip():
            copy = f" TEMPLATE {quote_ident(template)}" if template is not None else ""
            self.run_sql(f"CREATE DATABASE {quote_ident(name)} OWNER {APP_ROLE}{copy}")
        self.run_sql(give_database_sql(name, APP_ROLE))
        self.run_sql(give_tables_sql(APP_ROLE), name)
        # A commit waits for the standby's flush, not its replay, and asyncpg tries the hosts
        # of a DSN in order: it gives up on a standby that has not replayed the database yet
        # ("does not exist") instead of moving on to the primary. So wait for every member.
        deadline = time.monotonic() + 30
        for member in self.members:
            while not self.run_sql(exists, on=member).strip():
                if time.monotonic() > deadline:
                    raise PatroniError(f"database {name!r} did not reach {member} within 30 s")
                time.sleep(_POLL_S)
        return self.dsn_for(name)

    def drop_database(self, name: str) -> None:
        """Drop ``name`` if it exists, ending its sessions first (on the primary: the standbys
        replay the drop)."""
        self.run_sql(f"DROP DATABASE IF EXISTS {quote_ident(name)} WITH (FORCE)")

    # -- internals ---------------------------------------------------------------------------

    def _member(self, name: str | None) -> Member:
        if name is None:
            name = self._topology().leader
            if name is None:
                raise PatroniError("no leader now")
        if name not in self.members:
            raise PatroniError(f"no member {name!r}; members: {', '.join(self.members)}")
        return self.members[name]

    def _topology(self) -> Topology:
        seen = self.topology()
        if seen is None:
            raise PatroniError("no Patroni member answers")
        return seen

    def _spawn(self, member: Member) -> None:
        assert self._patroni is not None  # found by ``start``
        member.spawn(self._patroni, self._user)

    def _load_passwords(self) -> dict[str, str]:
        """The secrets of ``PASSWORDS_FILE``; those missing (all on a first start, the newer
        ones in a workdir of an older chronoq) are generated and the file rewritten, 0600."""
        if self._passwords:
            return self._passwords
        path = self.workdir / PASSWORDS_FILE
        known: dict[str, str] = {}
        with contextlib.suppress(FileNotFoundError):
            known = json.loads(path.read_text())
        if any(k not in known for k in _SECRETS):
            self.workdir.mkdir(parents=True, exist_ok=True)
            known = {k: known.get(k) or secrets.token_urlsafe(24) for k in _SECRETS}
            write_private(path, json.dumps(known), replace=True)
        self._passwords = known
        return known

    def _prepare(self) -> None:
        """Member directories owned by the member's account, and each member's config."""
        self.workdir.mkdir(parents=True, exist_ok=True)
        passwords = self._load_passwords()
        user = self._user
        if user is not None:
            traversable(self.workdir)
        for member in self.members.values():
            for directory in (member.home, member.socket_dir):
                directory.mkdir(parents=True, exist_ok=True)
                directory.chmod(0o700)
                if user is not None:
                    os.chown(directory, user.pw_uid, user.pw_gid)
            config = member_config(
                scope=self.scope,
                member=member.address,
                etcd_hosts=self.etcd_endpoints,
                etcd_auth=(
                    (self.etcd_auth[0], read_password(self.etcd_auth[1]))
                    if self.etcd_auth is not None
                    else None
                ),
                data_dir=str(member.data_dir),
                bin_dir=str(self.bin_dir),
                socket_dir=str(member.socket_dir),
                pgpass=str(member.home / "pgpass"),
                superuser_password=passwords["superuser"],
                replication_password=passwords["replication"],
                restapi_password=passwords["restapi"],
                durable=self.durable,
            )
            fd = os.open(member.config_file, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            with os.fdopen(fd, "w") as out:
                json.dump(config, out, indent=2)
            if user is not None:
                os.chown(member.config_file, user.pw_uid, user.pw_gid)


def scratch_dir(prefix: str = "cqha-") -> Path:
    """A fresh directory for a throwaway cluster."""
    return Path(tempfile.mkdtemp(prefix=prefix))
