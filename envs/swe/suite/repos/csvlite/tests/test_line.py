import unittest

from csvlite import format_line, parse_line


class TestParse(unittest.TestCase):
    def test_plain(self):
        self.assertEqual(parse_line("a,b,c"), ["a", "b", "c"])

    def test_empty_fields(self):
        self.assertEqual(parse_line(",x,"), ["", "x", ""])

    def test_quoted_separator(self):
        self.assertEqual(parse_line('"a,b",c'), ["a,b", "c"])

    def test_other_separator(self):
        self.assertEqual(parse_line("a;b", sep=";"), ["a", "b"])

    def test_unterminated(self):
        with self.assertRaises(ValueError):
            parse_line('"abc')


class TestFormat(unittest.TestCase):
    def test_plain(self):
        self.assertEqual(format_line(["a", 1, "b"]), "a,1,b")

    def test_quotes_separator(self):
        self.assertEqual(format_line(["a,b"]), '"a,b"')

    def test_escapes_quote(self):
        self.assertEqual(format_line(['say "hi"']), '"say ""hi"""')
