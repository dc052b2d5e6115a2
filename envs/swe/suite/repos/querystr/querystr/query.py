"""build_query and parse_query for flat {str: str} mappings."""

from urllib.parse import quote, unquote


def build_query(params):
    """Return 'k1=v1&k2=v2' for the mapping params, in its order."""
    return "&".join("%s=%s" % (key, value) for key, value in params.items())


def parse_query(text):
    """Parse 'k1=v1&k2=v2' into a dict of strings; a key without '=' gets ''."""
    result = {}
    if text.startswith("?"):
        text = text[1:]
    for part in text.split("&"):
        if not part:
            continue
        key, _, value = part.partition("=")
        result[unquote(key)] = unquote(value)
    return result
