"""A replicated PostgreSQL under Patroni, for the embedded stack: ``PatroniCluster``.

``config`` is the pure part (addresses, Patroni's configuration, the DSN, reading roles),
``install`` what the machine needs (an account, a venv with Patroni, usable binaries),
``member`` one member's files and Patroni process, ``cluster`` the members and their faults.
"""

from chronoq.embedded.ha.cluster import PatroniCluster
from chronoq.embedded.ha.config import MAX_MEMBERS, MIN_MEMBERS, Topology, check_members
from chronoq.embedded.ha.install import PatroniError, PatroniUnavailable

__all__ = [
    "MAX_MEMBERS",
    "MIN_MEMBERS",
    "PatroniCluster",
    "PatroniError",
    "PatroniUnavailable",
    "Topology",
    "check_members",
]
