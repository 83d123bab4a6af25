"""The PostgreSQL task store."""

from chronoq.store.rows import Fence, FireResult
from chronoq.store.store import Store

__all__ = ["Fence", "FireResult", "Store"]
