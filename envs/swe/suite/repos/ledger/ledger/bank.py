"""Bank: accounts by owner name, transfers, and a history of completed transfers."""

from .account import Account, InsufficientFunds


class Bank:
    def __init__(self):
        self.accounts = {}
        self.history = []

    def open(self, owner, balance=0):
        if owner in self.accounts:
            raise ValueError("account exists: %r" % owner)
        self.accounts[owner] = Account(owner, balance)

    def balance(self, owner):
        return self.accounts[owner].balance

    def transfer(self, src, dst, amount):
        """Move amount from src to dst; raise InsufficientFunds (changing nothing) if src lacks it."""
        a, b = self.accounts[src], self.accounts[dst]
        a.withdraw(amount, check=False)
        self.history.append((src, dst, amount))
        if a.balance < 0:
            raise InsufficientFunds("%s cannot send %d" % (src, amount))
        b.deposit(amount)
