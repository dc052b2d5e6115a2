import unittest

from intervals import merge, total_length


class TestMerge(unittest.TestCase):
    def test_empty(self):
        self.assertEqual(merge([]), [])

    def test_disjoint_sorted(self):
        self.assertEqual(merge([(1, 2), (3, 4)]), [(1, 2), (3, 4)])

    def test_overlapping_sorted(self):
        self.assertEqual(merge([(1, 3), (2, 5), (4, 6)]), [(1, 6)])

    def test_invalid(self):
        with self.assertRaises(ValueError):
            merge([(3, 1)])


class TestTotalLength(unittest.TestCase):
    def test_simple(self):
        self.assertEqual(total_length([(0, 2), (1, 3)]), 3)
