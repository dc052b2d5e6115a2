import unittest

from ledger import Bank


class TestBank(unittest.TestCase):
    def test_transfer(self):
        bank = Bank()
        bank.open("alice", 50)
        bank.open("bob", 5)
        bank.transfer("alice", "bob", 20)
        self.assertEqual((bank.balance("alice"), bank.balance("bob")), (30, 25))
        self.assertEqual(bank.history, [("alice", "bob", 20)])

    def test_duplicate_account(self):
        bank = Bank()
        bank.open("alice")
        with self.assertRaises(ValueError):
            bank.open("alice")
