import unittest

from ledger import Account, InsufficientFunds


class TestAccount(unittest.TestCase):
    def test_deposit_withdraw(self):
        a = Account("x", 10)
        a.deposit(5)
        a.withdraw(12)
        self.assertEqual(a.balance, 3)

    def test_overdraw(self):
        a = Account("x", 10)
        with self.assertRaises(InsufficientFunds):
            a.withdraw(11)
        self.assertEqual(a.balance, 10)
