import unittest

from semverlite import compare, max_version, parse


class TestParse(unittest.TestCase):
    def test_prefix(self):
        self.assertEqual(parse("v1.2.3"), parse("1.2.3"))

    def test_invalid(self):
        for bad in ["1.2", "1.2.3.4", "a.b.c", ""]:
            with self.assertRaises(ValueError):
                parse(bad)


class TestCompare(unittest.TestCase):
    def test_single_digit(self):
        self.assertEqual(compare("1.2.3", "1.2.4"), -1)
        self.assertEqual(compare("2.0.0", "1.9.9"), 1)
        self.assertEqual(compare("1.2.3", "v1.2.3"), 0)

    def test_max_single_digit(self):
        self.assertEqual(max_version(["1.0.0", "1.2.0", "1.1.9"]), "1.2.0")

    def test_max_empty(self):
        with self.assertRaises(ValueError):
            max_version([])
