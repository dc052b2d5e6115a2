import unittest

from querystr import build_query, parse_query


class TestQuery(unittest.TestCase):
    def test_build_simple(self):
        self.assertEqual(build_query({"a": "1", "b": 2}), "a=1&b=2")

    def test_parse_simple(self):
        self.assertEqual(parse_query("?a=1&b=2"), {"a": "1", "b": "2"})

    def test_parse_encoded(self):
        self.assertEqual(parse_query("q=a%20b&x"), {"q": "a b", "x": ""})
