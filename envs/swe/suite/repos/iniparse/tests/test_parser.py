import unittest

from iniparse import ParseError, parse


class TestParse(unittest.TestCase):
    def test_sections(self):
        text = "[a]\nx = 1\n[b]\ny=2\n"
        self.assertEqual(parse(text), {"a": {"x": "1"}, "b": {"y": "2"}})

    def test_comments_and_blank(self):
        text = "; comment\n\n# another\n[s]\nk = v\n"
        self.assertEqual(parse(text), {"s": {"k": "v"}})

    def test_global_keys(self):
        self.assertEqual(parse("k = v"), {"": {"k": "v"}})

    def test_errors(self):
        with self.assertRaises(ParseError) as ctx:
            parse("[s]\nnot a pair\n")
        self.assertEqual(ctx.exception.lineno, 2)
        with self.assertRaises(ParseError):
            parse("[s\n")
