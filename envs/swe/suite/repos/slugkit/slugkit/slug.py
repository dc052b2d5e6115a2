"""Slugs: lowercase ASCII words joined by a separator."""

import re
import unicodedata


def slugify(text, sep="-"):
    """Return a slug of text: accents removed, lowercase, runs of other characters replaced by sep."""
    text = unicodedata.normalize("NFKD", text).encode("ascii", "ignore").decode("ascii")
    text = re.sub(r"[^a-z0-9]+", sep, text.lower())
    return text


def unique_slug(text, taken, sep="-"):
    """Return a slug of text not in the set taken, adding -2, -3, ... if needed."""
    base = slugify(text, sep)
    slug, n = base, 2
    while slug in taken:
        slug = "%s%s%d" % (base, sep, n)
        n += 1
    return slug
