"""The users of a chronoq etcd, by name: one spelling for the embedded stack that creates
them, the command that sets them up (``chronoq etcd init``) and the tools that log in."""

from __future__ import annotations

#: etcd's own administrator (auth is turned on as root).
ROOT_USER = "root"
#: The user nodes and tools connect as (keys under ``/chronoq/``).
CHRONOQ_USER = "chronoq"
#: Patroni's user (keys under Patroni's namespace).
PATRONI_USER = "patroni"
