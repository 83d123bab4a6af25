"""Chaos: a real local cluster as processes, faults, an independent ledger and a checker."""
