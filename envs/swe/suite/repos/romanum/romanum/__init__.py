"""Roman numerals."""

from .convert import from_roman, to_roman

__all__ = ["to_roman", "from_roman"]
