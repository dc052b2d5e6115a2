"""Matrices as lists of rows."""

from .ops import add, identity, matmul, shape, transpose

__all__ = ["add", "identity", "matmul", "shape", "transpose"]
