"""Version parsing and ordering."""

import functools


def parse(version):
    """Parse 'MAJOR.MINOR.PATCH' (an optional leading 'v' is allowed) into a tuple of its three parts."""
    text = version.strip()
    if text.startswith("v"):
        text = text[1:]
    parts = text.split(".")
    if len(parts) != 3 or not all(p.isdigit() for p in parts):
        raise ValueError("not a MAJOR.MINOR.PATCH version: %r" % version)
    return tuple(parts)


def compare(a, b):
    """Return -1, 0 or 1 as version a is lower than, equal to or higher than version b."""
    pa, pb = parse(a), parse(b)
    return (pa > pb) - (pa < pb)


def max_version(versions):
    """Return the highest of the given versions (as given)."""
    if not versions:
        raise ValueError("no versions given")
    return max(versions, key=functools.cmp_to_key(compare))
