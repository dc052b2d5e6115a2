"""A small INI parser."""

from .parser import ParseError, parse

__all__ = ["parse", "ParseError"]
