"""``chronoq bench throughput``: what chronoq does on this machine, beside the raw-SQL ceiling.

Phases, each on a fresh database (see ``benchmarks/README.md``), one module each:

1. raw (``ceilings``): chronoq's own statements through asyncpg in tight loops
   (``chronoq.bench.raw``);
2. submit: ``Client.submit_ids`` (bulk, answered with ids) in batches through a node's gRPC API
   (node in a child process);
3. fire: a node on a ``ManualClock``; the clock jumps and its firing loop moves the tasks to READY;
4. e2e: tasks due at once, ``workers`` workers with a no-op handler, first fire to last completion,
   with the workers in this process and in one process each;
5. lateness: tasks due at ``due_rate`` per second, node on the system clock, workers running;
6. rss: the memory of a node process with each of ``pending_sizes`` tasks pending;
7. backlog (on request): e2e and lateness again on top of ``backlog_sizes`` tasks due tomorrow,
   beside the same runs on an empty table;
8. shards (on request, ``store_shards``): a local stack per store shard count, each shard its
   own server: submit, fire and end-to-end rates, each server's share and CPU per task.

``results`` holds the figures and options, ``run`` the entry point, ``table`` the printed table,
``measure`` the store and process probes, ``workers``/``handler`` the benchmark's workers, and
``children`` its child processes: ``python -m chronoq.bench.throughput node|worker ...``, each
printing ``READY <info>`` once it serves and one JSON line of its statistics when it stops.
"""

from __future__ import annotations

from chronoq.bench.raw import BenchError
from chronoq.bench.throughput.results import Report
from chronoq.bench.throughput.run import main
from chronoq.bench.throughput.table import render

__all__ = ["BenchError", "Report", "main", "render"]
