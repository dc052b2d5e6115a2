"""parse(text) -> {section: {key: value}}."""


class ParseError(ValueError):
    """Raised with the 1-based line number of the bad line."""

    def __init__(self, lineno, message):
        super().__init__("line %d: %s" % (lineno, message))
        self.lineno = lineno


def parse(text):
    """Parse INI text. Keys before any section go to the section named ''."""
    result = {}
    section = ""
    for lineno, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not line or line[0] in ";#":
            continue
        if line.startswith("["):
            if not line.endswith("]"):
                raise ParseError(lineno, "unclosed section header")
            section = line[1:-1].strip()
            result.setdefault(section, {})
            continue
        if "=" not in line:
            raise ParseError(lineno, "expected 'key = value'")
        key, value = line.split("=")
        key = key.strip()
        if not key:
            raise ParseError(lineno, "empty key")
        result.setdefault(section, {})[key] = value.strip()
    return result
