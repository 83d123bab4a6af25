"""chronoq: a distributed scheduler for timed tasks (PostgreSQL time buckets, etcd ownership)."""

import os as _os

# chronoq forks servers (PostgreSQL as another user, etcd, nodes) from processes that run
# gRPC. gRPC's fork handlers then run in the child between fork and exec and can crash it
# (seen here: "ev_epoll1_linux.cc Check failed: next_worker->state == KICKED", and the
# postmaster dying by SIGSEGV before its first log line). The children exec at once and
# need no gRPC state, so the handlers are switched off before grpc is first imported.
_os.environ.setdefault("GRPC_ENABLE_FORK_SUPPORT", "false")
