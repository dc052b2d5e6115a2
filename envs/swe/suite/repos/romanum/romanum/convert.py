"""Conversion between integers and Roman numerals."""

_VALUES = [
    (1000, "M"),
    (500, "D"),
    (100, "C"),
    (50, "L"),
    (10, "X"),
    (5, "V"),
    (1, "I"),
]


def to_roman(n):
    """Return the Roman numeral of ``n`` (1 <= n <= 3999)."""
    if not isinstance(n, int) or isinstance(n, bool):
        raise TypeError("expected an int, got %r" % (n,))
    if not 1 <= n <= 3999:
        raise ValueError("out of range (1..3999): %d" % n)
    out = []
    for value, symbol in _VALUES:
        while n >= value:
            out.append(symbol)
            n -= value
    return "".join(out)


def from_roman(text):
    """Parse a Roman numeral; subtractive notation (IV, XC, ...) is accepted."""
    symbols = {"M": 1000, "D": 500, "C": 100, "L": 50, "X": 10, "V": 5, "I": 1}
    if not text:
        raise ValueError("empty numeral")
    total = 0
    prev = 0
    for ch in reversed(text.upper()):
        if ch not in symbols:
            raise ValueError("invalid numeral: %r" % text)
        value = symbols[ch]
        if value < prev:
            total -= value
        else:
            total += value
            prev = value
    return total
