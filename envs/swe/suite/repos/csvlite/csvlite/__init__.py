"""Parse and format single CSV lines."""

from .line import format_line, parse_line

__all__ = ["parse_line", "format_line"]
