"""A least-recently-used cache."""

from .cache import LRUCache

__all__ = ["LRUCache"]
