import unittest

from lrucache import LRUCache


class TestLRUCache(unittest.TestCase):
    def test_get_put(self):
        c = LRUCache(2)
        c.put("a", 1)
        self.assertEqual(c.get("a"), 1)
        self.assertIsNone(c.get("zz"))
        self.assertEqual(c.get("zz", 5), 5)

    def test_evicts_oldest_insert(self):
        c = LRUCache(2)
        c.put("a", 1)
        c.put("b", 2)
        c.put("c", 3)
        self.assertNotIn("a", c)
        self.assertEqual(len(c), 2)

    def test_stats(self):
        c = LRUCache(1)
        c.put("a", 1)
        c.get("a")
        c.get("b")
        self.assertEqual((c.hits, c.misses), (1, 1))

    def test_capacity(self):
        with self.assertRaises(ValueError):
            LRUCache(0)
