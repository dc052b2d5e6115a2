"""A single account holding an integer balance (in cents)."""


class InsufficientFunds(Exception):
    pass


class Account:
    def __init__(self, owner, balance=0):
        if balance < 0:
            raise ValueError("opening balance must be >= 0")
        self.owner = owner
        self.balance = balance

    def deposit(self, amount):
        if amount <= 0:
            raise ValueError("amount must be positive")
        self.balance += amount

    def withdraw(self, amount, check=True):
        """Take amount out; with check, refuse to go below zero."""
        if amount <= 0:
            raise ValueError("amount must be positive")
        if check and amount > self.balance:
            raise InsufficientFunds("%s has %d, needs %d" % (self.owner, self.balance, amount))
        self.balance -= amount
