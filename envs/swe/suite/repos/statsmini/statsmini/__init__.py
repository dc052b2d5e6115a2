"""Descriptive statistics."""

from .describe import mean, median, mode, variance

__all__ = ["mean", "median", "mode", "variance"]
