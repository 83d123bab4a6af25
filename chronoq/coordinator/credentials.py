"""etcd passwords kept in files that no other local account can read or replace.

The embedded etcd writes each generated password 0600 into a 0700 directory; ``--etcd-password
-file`` reads one back. A file that others could read (the password is theirs too) or replace
(they choose what we send), or that another account owns, is refused with the chmod that fixes
it: the password never has to appear in a command line or an environment dump.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

from chronoq.errors import ConfigError
from chronoq.private_files import check_file, write_password

__all__ = ["MAX_PASSWORD_FILE_BYTES", "private_dir", "read_password", "write_password"]

#: The largest password file read: a password, not a document.
MAX_PASSWORD_FILE_BYTES = 4096
#: Mode bits that let another account read a password file or change it.
_UNSAFE_FILE = stat.S_IRWXG | stat.S_IRWXO


def private_dir(path: Path) -> Path:
    """``path`` as a directory only its owner may enter (created 0700, tightened if wider)."""
    path.mkdir(mode=0o700, parents=True, exist_ok=True)
    st = path.lstat()
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.geteuid():
        raise ConfigError(f"{path} must be a directory of ours (uid {os.geteuid()}), not a link")
    if stat.S_IMODE(st.st_mode) != 0o700:
        path.chmod(0o700)
    return path


def read_password(path: str | Path, what: str = "etcd password file") -> str:
    """The password in ``path`` (its first line); ``ConfigError`` saying what to fix if another
    account could read or replace it, or if it is empty or too large."""
    path = Path(path)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    except OSError as exc:
        raise ConfigError(f"{what}: cannot read {path}: {exc.strerror or exc}") from exc
    with os.fdopen(fd, "rb") as file:
        st = os.fstat(file.fileno())
        _check_private(path, st, what)
        data = file.read(MAX_PASSWORD_FILE_BYTES + 1)
    if len(data) > MAX_PASSWORD_FILE_BYTES:
        raise ConfigError(f"{what}: {path} is over {MAX_PASSWORD_FILE_BYTES} bytes")
    try:
        lines = data.decode("utf-8").splitlines()
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{what}: {path} is not UTF-8 text") from exc
    password = lines[0].strip() if lines else ""
    if not password:
        raise ConfigError(f"{what}: {path} is empty")
    return password


def _check_private(path: Path, st: os.stat_result, what: str) -> None:
    """The token files' rules (``check_file``: ours or root's, nobody else may change it or
    replace it through a directory), and a password is a secret, so nobody else reads it."""
    check_file(path, st, what)
    if st.st_mode & _UNSAFE_FILE:
        raise ConfigError(
            f"{what}: {path} is open to group or others (mode {stat.filemode(st.st_mode)}): "
            f"chmod 600 {path}"
        )
