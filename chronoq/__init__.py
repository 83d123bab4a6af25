"""chronoq: a distributed scheduler for timed tasks (PostgreSQL time buckets, etcd ownership).

Importing chronoq (or its client SDK) changes nothing global. Processes that start servers
switch gRPC's fork handlers off themselves: see ``chronoq.forking``.
"""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError, version

__all__ = ["__version__"]

try:
    #: The installed distribution's version, from the git tag it was built at (docs/release.md).
    __version__: str = version("chronoq")
except PackageNotFoundError:  # run from a source tree that was never installed
    __version__ = "0.0.0+unknown"
