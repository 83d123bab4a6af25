"""chronoq: a distributed scheduler for timed tasks (PostgreSQL time buckets, etcd ownership).

Importing chronoq (or its client SDK) changes nothing global. Processes that start servers
switch gRPC's fork handlers off themselves: see ``chronoq.forking``.
"""
