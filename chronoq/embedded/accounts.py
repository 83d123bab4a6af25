"""The OS accounts the embedded servers run as when chronoq runs as root, made once.

Two processes that both find an account missing both run ``useradd``, and on this kind of
machine both can succeed: each writes ``/etc/passwd`` from what it read, the last one wins,
and the other process goes on with a uid that no longer exists (initdb then stops with
"could not look up effective user ID"). A fresh machine starting two servers at once (two
store shards, Patroni members) did exactly that. So the look-up and the creation of an
account happen under one exclusive file lock that every chronoq process takes, and the
account is read again under it.
"""

from __future__ import annotations

import os
import pwd
from collections.abc import Callable
from pathlib import Path

from chronoq.embedded.file_lock import locked

#: The lock every chronoq process takes to create an account (root's: only root creates).
LOCK_FILE = Path("/var/lib/chronoq/accounts.lock")


def system_account(name: str, create: Callable[[str], object]) -> pwd.struct_passwd | None:
    """The account ``name`` (made with ``create(name)`` when missing) as root, else None.

    ``create`` may fail (a tool missing, a refusal): the account is then still looked up,
    and ``KeyError`` says it is not there."""
    if os.geteuid() != 0:
        return None
    try:
        return pwd.getpwnam(name)
    except KeyError:
        pass
    with locked(LOCK_FILE):
        try:  # made by the process that held the lock before us
            return pwd.getpwnam(name)
        except KeyError:
            create(name)
        return pwd.getpwnam(name)
