"""gRPC's fork handlers switched off in processes that start servers.

Such a process forks servers (PostgreSQL as another user, etcd, nodes) while it runs gRPC
itself. gRPC's C core then runs its fork handlers in the child between fork and exec, and they
can crash it (seen here: "ev_epoll1_linux.cc Check failed: next_worker->state == KICKED", and the
postmaster dying by SIGSEGV before its first log line). The children exec at once and need no
gRPC state, so the handlers are better off. gRPC reads ``GRPC_ENABLE_FORK_SUPPORT`` once, when it
is loaded: a later change has no effect on the process.

This is a setting for a whole process, so only the processes that start servers make it (the
commands that run a local stack, the test session: ``chronoq.embedded`` calls it on import),
never ``import chronoq`` or the client SDK.
"""

from __future__ import annotations

import os
import sys

#: gRPC's switch for its fork handlers (read when grpc is first imported).
FORK_SUPPORT_VARIABLE = "GRPC_ENABLE_FORK_SUPPORT"


def disable_grpc_fork_handlers() -> bool:
    """Switch gRPC's fork handlers off for this process and the processes it starts.

    Call it before anything imports grpc. An explicit setting in the environment wins. Returns
    False when grpc was already loaded: the children still inherit the setting, this process
    keeps the handlers it has.
    """
    os.environ.setdefault(FORK_SUPPORT_VARIABLE, "false")
    return "grpc" not in sys.modules
