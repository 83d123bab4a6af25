"""The Python client and worker SDK of chronoq: async ``Client``, blocking ``SyncClient``,
task definitions (``TaskRegistry``) and the ``Worker``."""

from chronoq.client.client import Client
from chronoq.client.context import FatalTaskError, Handler, TaskContext
from chronoq.client.registry import TaskDefinition, TaskOptions, TaskRegistry
from chronoq.client.sync import SyncClient
from chronoq.client.values import ClusterStatus, MemberStatus, NewTask, Submitted
from chronoq.client.worker import Worker, WorkerStats

__all__ = [
    "Client",
    "ClusterStatus",
    "FatalTaskError",
    "Handler",
    "MemberStatus",
    "NewTask",
    "Submitted",
    "SyncClient",
    "TaskContext",
    "TaskDefinition",
    "TaskOptions",
    "TaskRegistry",
    "Worker",
    "WorkerStats",
]
