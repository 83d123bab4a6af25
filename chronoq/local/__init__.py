"""The local stack: a whole chronoq cluster as processes on this machine (nodes, etcd, PostgreSQL).

Used by ``chronoq dev``, the lab, the benchmarks, the chaos harness and the multi-node tests.
"""
