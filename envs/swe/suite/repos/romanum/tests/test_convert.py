import unittest

from romanum import from_roman, to_roman


class TestToRoman(unittest.TestCase):
    def test_small(self):
        self.assertEqual(to_roman(1), "I")
        self.assertEqual(to_roman(3), "III")
        self.assertEqual(to_roman(8), "VIII")

    def test_large(self):
        self.assertEqual(to_roman(2023), "MMXXIII")
        self.assertEqual(to_roman(1666), "MDCLXVI")

    def test_out_of_range(self):
        with self.assertRaises(ValueError):
            to_roman(0)
        with self.assertRaises(ValueError):
            to_roman(4000)

    def test_type(self):
        with self.assertRaises(TypeError):
            to_roman("12")


class TestFromRoman(unittest.TestCase):
    def test_additive(self):
        self.assertEqual(from_roman("MDCLXVI"), 1666)

    def test_subtractive(self):
        self.assertEqual(from_roman("MCMXCIV"), 1994)
        self.assertEqual(from_roman("xiv"), 14)

    def test_invalid(self):
        with self.assertRaises(ValueError):
            from_roman("ABC")
