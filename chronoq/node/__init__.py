"""The scheduler node."""

from chronoq.node.node import Node

__all__ = ["Node"]
