import unittest

from statsmini import mean, median, mode, variance


class TestDescribe(unittest.TestCase):
    def test_mean(self):
        self.assertEqual(mean([1, 2, 3, 4]), 2.5)

    def test_median_odd(self):
        self.assertEqual(median([3, 1, 2]), 2)

    def test_mode(self):
        self.assertEqual(mode([1, 2, 2, 3, 3]), 2)

    def test_variance(self):
        self.assertEqual(variance([1, 2, 3, 4]), 5 / 3)
        self.assertEqual(variance([1, 2, 3, 4], sample=False), 1.25)

    def test_empty(self):
        for fn in (mean, median, mode):
            with self.assertRaises(ValueError):
                fn([])
