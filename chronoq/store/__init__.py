"""The PostgreSQL task store."""

from chronoq.store.store import FireResult, Store

__all__ = ["FireResult", "Store"]
