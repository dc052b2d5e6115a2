import unittest

from slugkit import slugify, unique_slug


class TestSlugify(unittest.TestCase):
    def test_basic(self):
        self.assertEqual(slugify("Hello World"), "hello-world")

    def test_accents(self):
        self.assertEqual(slugify("Cr\u00e8me br\u00fbl\u00e9e"), "creme-brulee")

    def test_sep(self):
        self.assertEqual(slugify("a b c", sep="_"), "a_b_c")

    def test_unique(self):
        self.assertEqual(unique_slug("My Post", {"my-post", "my-post-2"}), "my-post-3")
