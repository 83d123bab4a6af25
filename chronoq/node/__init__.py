"""The scheduler node."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from chronoq.node.node import Node

__all__ = ["Node"]


def __getattr__(name: str) -> Any:
    # Lazy, so that chronoq.coordinator can use chronoq.node.ownership without a cycle.
    if name == "Node":
        from chronoq.node.node import Node

        return Node
    raise AttributeError(name)
