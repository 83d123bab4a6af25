"""Files that grant power (token files, passwords) must be changeable by this account only.

Whoever can change such a file, or replace it, grants themselves what it grants. So the file
must be a regular file owned by this account (or root), not writable by group or others, and
every directory above it, up to ``/``, owned by this account or root and not writable by
group or others unless sticky (``/tmp``: others may add files there, not replace ours). Each
refusal says what to fix (the chmod or chown). The checks are pure (``os.stat`` only); the
writers below are the one way chronoq writes such a file (0600 from its first byte).
"""

from __future__ import annotations

import contextlib
import os
import stat
from pathlib import Path

from chronoq.errors import ConfigError

#: Mode bits that let other accounts rewrite a file (or, on a directory, replace its files).
OTHERS_WRITE = stat.S_IWGRP | stat.S_IWOTH


def write_private(path: Path, text: str, *, replace: bool = False) -> None:
    """Write ``text`` to ``path``, mode 0600 from its first byte and never through a link: a
    new file (``FileExistsError`` if there is one), or with ``replace`` atomically in place of
    the file there (written whole beside it first, so a reader never sees half of it)."""
    target = path.with_name(path.name + ".partial") if replace else path
    if replace:
        with contextlib.suppress(FileNotFoundError):
            target.unlink()  # a write that was cut short
    fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as out:
        out.write(text)
    if replace:
        os.replace(target, path)


def write_password(path: Path, password: str, *, replace: bool = False) -> None:
    """Write ``password`` (one line) to ``path`` as ``write_private`` does."""
    write_private(path, password + "\n", replace=replace)


def trusted_owner(uid: int) -> bool:
    """Whether an owner ``uid`` is one we trust with our files: this account or root."""
    return uid in (os.geteuid(), 0)


def check_file(path: Path, st: os.stat_result, what: str) -> None:
    """``ConfigError`` unless the file ``path`` (``st``: its ``fstat``, so what was checked
    is what is read) and every directory above it can be changed by this account or root
    only."""
    me = os.geteuid()
    if not stat.S_ISREG(st.st_mode):
        raise ConfigError(f"{what}: {path} is not a regular file")
    if not trusted_owner(st.st_uid):
        raise ConfigError(
            f"{what}: {path} belongs to uid {st.st_uid}, not to this account (uid {me}) or "
            f"root, so that account could rewrite it: check its contents, then chown {me} {path}"
        )
    if st.st_mode & OTHERS_WRITE:
        raise ConfigError(
            f"{what}: {path} is writable by group or others (mode {stat.filemode(st.st_mode)}), "
            f"so they could rewrite it: chmod 600 {path}"
        )
    check_directories(path, what)


def check_directories(path: Path, what: str) -> None:
    """``ConfigError`` unless no other account can replace ``path`` through a directory
    above it: those of the path as given and of where its links lead, up to ``/``."""
    absolute = Path(os.path.abspath(path))
    chain = list(absolute.parents)
    chain += [d for d in Path(os.path.realpath(path)).parents if d not in chain]
    for directory in chain:
        try:
            st = os.stat(directory)
        except OSError as exc:
            raise ConfigError(f"{what}: cannot look at {directory}: {exc.strerror or exc}") from exc
        if not trusted_owner(st.st_uid):
            raise ConfigError(
                f"{what}: {path} lies in {directory}, which belongs to uid {st.st_uid}: that "
                f"account could replace the file. Move it to a directory of this account (uid "
                f"{os.geteuid()}), or chown {os.geteuid()} {directory}"
            )
        if st.st_mode & OTHERS_WRITE and not st.st_mode & stat.S_ISVTX:
            raise ConfigError(
                f"{what}: {path} lies in {directory}, which group or others may write (mode "
                f"{stat.filemode(st.st_mode)}), so they could replace the file: "
                f"chmod go-w {directory} (or chmod +t {directory}), or move the file"
            )
