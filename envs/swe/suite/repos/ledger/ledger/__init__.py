"""In-memory bank accounts."""

from .account import Account, InsufficientFunds
from .bank import Bank

__all__ = ["Account", "Bank", "InsufficientFunds"]
