"""The postmaster as a direct child process: its environment, initdb, the start, readiness
and exit, and the end of its log for error messages.

``EmbeddedPostgres`` (``chronoq.embedded.postgres``) decides when; these do one step each and
take what they need as arguments. ``postgres`` is started itself (not through pg_ctl), so the
child is the real server and chaos tests may SIGKILL or SIGSTOP it.
"""

from __future__ import annotations

import contextlib
import os
import pwd
import signal
import stat
import subprocess
import tempfile
import time
from collections.abc import Mapping
from pathlib import Path

from chronoq.embedded import processes
from chronoq.embedded.pg_account import EmbeddedPostgresError

#: Seconds initdb may take (a loaded machine, a durable cluster's fsyncs).
INITDB_TIMEOUT = 180.0
#: Lines of the log an error message ends with.
LOG_TAIL_LINES = 40


def clean_env() -> dict[str, str]:
    """The environment without PG* variables, which would silently redirect our tools."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PG")}
    env["LC_ALL"] = "C"
    return env


def signal_pid(pid: int, sig: signal.Signals) -> None:
    """Send ``sig`` to ``pid``, ignoring a process that is already gone."""
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, sig)


def log_tail(log_file: Path) -> str:
    """The last lines of the log file, for error messages."""
    try:
        with log_file.open("rb") as log:
            log.seek(0, os.SEEK_END)
            log.seek(max(0, log.tell() - 16384))
            data = log.read().decode("utf-8", "replace")
    except OSError as exc:
        return f"<cannot read log: {exc}>"
    return "\n".join(data.splitlines()[-LOG_TAIL_LINES:])


def run_initdb(
    cmd: list[str], data_dir: Path, log_file: Path, user: pwd.struct_passwd | None
) -> None:
    """Run the initdb command ``cmd``, its output in ``log_file``; fail with the log's end."""
    try:
        with log_file.open("ab") as log:
            result = subprocess.run(
                cmd,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=clean_env(),
                cwd=data_dir,
                timeout=INITDB_TIMEOUT,
                check=False,
                user=user.pw_uid if user else None,
                group=user.pw_gid if user else None,
                extra_groups=[] if user else None,
            )
    except subprocess.TimeoutExpired as exc:
        raise EmbeddedPostgresError(
            f"initdb of {data_dir} took over {INITDB_TIMEOUT:.0f}s"
        ) from exc
    if result.returncode != 0:
        raise EmbeddedPostgresError(
            f"initdb of {data_dir} failed (exit {result.returncode}); "
            f"{log_file} ends with:\n{log_tail(log_file)}"
        )


def initdb(
    bin_dir: Path,
    data_dir: Path,
    log_file: Path,
    password: str,
    *,
    superuser: str,
    auth_method: str,
    durable: bool,
    user: pwd.struct_passwd | None,
) -> None:
    """Create the cluster: ``superuser`` with ``password`` (``auth_method`` for every
    connection), UTF8 with C collation. The password goes in a file (initdb wants one),
    mode 0600, removed after."""
    fd, pwfile = tempfile.mkstemp(prefix="cqpw-")
    with os.fdopen(fd, "w") as out:
        out.write(password + "\n")
    if user is not None:  # initdb runs as the server's account and must read it
        os.chown(pwfile, user.pw_uid, user.pw_gid)
    cmd = [
        str(bin_dir / "initdb"),
        "-D",
        str(data_dir),
        f"--auth-host={auth_method}",
        f"--auth-local={auth_method}",
        f"--pwfile={pwfile}",
        f"--username={superuser}",
        "--encoding=UTF8",
        "--locale=C",
        "--no-instructions",
    ]
    if not durable:
        cmd.append("--no-sync")
    try:
        run_initdb(cmd, data_dir, log_file, user)
    finally:
        os.unlink(pwfile)


def server_settings(
    host: str, socket_dir: Path, *, durable: bool, extra: Mapping[str, str]
) -> dict[str, str]:
    """The ``-c`` settings of the server: ours, then ``extra`` over them. Pure."""
    settings = {
        "listen_addresses": host,
        "unix_socket_directories": str(socket_dir),
        "max_connections": "200",
        "shared_buffers": "256MB",
        "max_wal_size": "4GB",
        "timezone": "UTC",
        "log_timezone": "UTC",
    }
    if not durable:
        settings |= {"fsync": "off", "synchronous_commit": "off", "full_page_writes": "off"}
    return settings | dict(extra)


def spawn_postmaster(
    bin_dir: Path,
    data_dir: Path,
    port: int,
    settings: Mapping[str, str],
    log_file: Path,
    user: pwd.struct_passwd | None,
) -> subprocess.Popen[bytes]:
    """Start ``postgres`` directly (not pg_ctl) so that the child is the postmaster."""
    cmd = [str(bin_dir / "postgres"), "-D", str(data_dir), "-p", str(port)]
    for key, value in settings.items():
        cmd += ["-c", f"{key}={value}"]
    with log_file.open("ab") as log:
        return subprocess.Popen(
            cmd,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            env=clean_env(),
            cwd=data_dir,
            user=user.pw_uid if user else None,
            group=user.pw_gid if user else None,
            extra_groups=[] if user else None,
            start_new_session=True,  # a Ctrl-C aimed at the test run must not reach it
        )


def pid_file_ready(data_dir: Path, pid: int) -> bool:
    """Whether postmaster.pid belongs to ``pid`` and says it accepts connections.

    Checked before probing the port, which may belong to someone else while we start.
    """
    try:
        lines = (data_dir / "postmaster.pid").read_text().splitlines()
    except OSError:
        return False
    return len(lines) >= 8 and lines[0].strip() == str(pid) and lines[7].strip() == "ready"


def accepting(bin_dir: Path, host: str, port: int, user: str) -> bool:
    """Whether the server accepts TCP connections now (pg_isready exit code 0)."""
    cmd = [
        str(bin_dir / "pg_isready"),
        "-q",
        "-h",
        host,
        "-p",
        str(port),
        "-U",
        user,
        "-d",
        "postgres",
        "-t",
        "1",
    ]
    try:
        result = subprocess.run(
            cmd,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            env=clean_env(),
            timeout=10,
            check=False,
        )
    except subprocess.TimeoutExpired:
        return False
    return result.returncode == 0


def wait_exit(proc: subprocess.Popen[bytes] | None, pid: int, timeout: float) -> bool:
    """Wait up to ``timeout`` for ``pid`` to exit (reaping it if it is the child ``proc``)."""
    if proc is not None and proc.pid == pid:
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            return False
        return True
    deadline = time.monotonic() + timeout
    while processes.alive(pid):
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.05)
    return True


def postmaster_file(data_dir: Path) -> tuple[int, int | None, Path | None] | None:
    """(PID, port, socket directory) from ``postmaster.pid``; None without a readable one."""
    try:
        lines = (data_dir / "postmaster.pid").read_text().splitlines()
        pid = abs(int(lines[0]))
        port = int(lines[3]) if len(lines) > 3 and lines[3].strip() else None
        socket_dir = Path(lines[4].strip()) if len(lines) > 4 and lines[4].strip() else None
    except (OSError, ValueError, IndexError):
        return None
    return pid, port, socket_dir


def kill_orphans(data_dir: Path, bin_dir: Path, keep: int | None, timeout: float) -> None:
    """SIGKILL the postgres processes on ``data_dir`` but ``keep``; wait until they are gone."""
    deadline = time.monotonic() + timeout
    while pids := [p for p in processes.server_pids(data_dir, bin_dir) if p != keep]:
        for p in pids:
            signal_pid(p, signal.SIGKILL)
        if time.monotonic() >= deadline:
            raise EmbeddedPostgresError(f"postgres processes {pids} on {data_dir} survived SIGKILL")
        time.sleep(0.02)


def private_dir(path: Path, user: pwd.struct_passwd | None) -> Path:
    """``path`` as a directory of the server's account (``user``; None: this one), mode 0700.

    Created so; one found in its place must be exactly that (another account may have made
    it in /tmp first, to listen there itself).
    """
    uid, gid = (user.pw_uid, user.pw_gid) if user is not None else (os.geteuid(), -1)
    try:
        path.mkdir(mode=0o700)
        os.chown(path, uid, gid)
    except FileExistsError:
        pass
    found = path.lstat()
    if not stat.S_ISDIR(found.st_mode) or found.st_uid != uid or found.st_mode & 0o077:
        raise EmbeddedPostgresError(
            f"{path} exists but is not a private directory of uid {uid} (mode 0700); "
            "another account may have made it: remove it, or run again (a new name)"
        )
    return path


def run_psql(
    bin_dir: Path, dsn: str, password: str, sql: str, *, hidden: bool
) -> subprocess.CompletedProcess[str]:
    """psql's unaligned, tuples-only run of ``sql`` on ``dsn`` (whose password is passed in
    the environment, not in argv, which every local account can read). ``hidden``: ``sql``
    goes on stdin, out of the command line, for statements carrying a secret."""
    cmd = [
        str(bin_dir / "psql"),
        "-X",
        "-q",
        "-A",
        "-t",
        "-v",
        "ON_ERROR_STOP=1",
        "-d",
        dsn,
        *([] if hidden else ["-c", sql]),
    ]
    env = clean_env()
    env["PGCONNECT_TIMEOUT"] = "10"
    env["PGPASSWORD"] = password
    shown = "a statement with a secret" if hidden else repr(sql)
    try:
        return subprocess.run(
            cmd,
            input=sql if hidden else None,
            stdin=None if hidden else subprocess.DEVNULL,
            capture_output=True,
            text=True,
            env=env,
            timeout=120,
            check=False,
        )
    except subprocess.TimeoutExpired as exc:
        raise EmbeddedPostgresError(f"psql timed out running {shown}") from exc
