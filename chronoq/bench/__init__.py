"""Benchmarks: chronoq's own figures measured beside raw-SQL ceilings on the same server.

``chronoq.bench.throughput.main`` runs them (``chronoq bench throughput``); ``chronoq.bench.raw``
holds what talks to PostgreSQL directly (fresh databases, COPY loads, the ceilings). Nothing is
imported here, so ``python -m chronoq.bench.throughput`` (the benchmark's child processes) runs
the module once.
"""

from __future__ import annotations
