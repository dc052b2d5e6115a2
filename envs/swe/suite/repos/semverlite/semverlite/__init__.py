"""MAJOR.MINOR.PATCH versions."""

from .version import compare, max_version, parse

__all__ = ["parse", "compare", "max_version"]
