import unittest

from leapcal import day_of_year, days_in_month, is_leap


class TestLeap(unittest.TestCase):
    def test_ordinary(self):
        self.assertTrue(is_leap(2024))
        self.assertFalse(is_leap(2023))

    def test_400(self):
        self.assertTrue(is_leap(2000))


class TestMonths(unittest.TestCase):
    def test_lengths(self):
        self.assertEqual(days_in_month(2023, 1), 31)
        self.assertEqual(days_in_month(2023, 2), 28)
        self.assertEqual(days_in_month(2024, 2), 29)
        self.assertEqual(days_in_month(2023, 4), 30)

    def test_bad_month(self):
        with self.assertRaises(ValueError):
            days_in_month(2023, 13)

    def test_day_of_year(self):
        self.assertEqual(day_of_year(2023, 12, 31), 365)
        self.assertEqual(day_of_year(2024, 3, 1), 61)
