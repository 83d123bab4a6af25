"""Coordination through etcd: membership, ring assignment, partition ownership, virtual clock."""
