"""The async Python client and worker SDK of chronoq."""

from chronoq.client.client import Client, ClusterStatus, MemberStatus, NewTask, Submitted
from chronoq.client.worker import FatalTaskError, Handler, TaskContext, Worker, WorkerStats

__all__ = [
    "Client",
    "ClusterStatus",
    "FatalTaskError",
    "Handler",
    "MemberStatus",
    "NewTask",
    "Submitted",
    "TaskContext",
    "Worker",
    "WorkerStats",
]
