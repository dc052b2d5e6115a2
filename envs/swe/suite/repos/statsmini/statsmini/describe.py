"""mean, median, mode and variance of a sequence of numbers."""

from collections import Counter


def _check(values):
    values = list(values)
    if not values:
        raise ValueError("no values")
    return values


def mean(values):
    values = _check(values)
    return sum(values) / len(values)


def median(values):
    """Return the median (the mean of the two middle values for an even count)."""
    values = sorted(_check(values))
    return values[len(values) // 2]


def mode(values):
    """Return the most common value (the smallest one on ties)."""
    counts = Counter(_check(values))
    best = max(counts.values())
    return min(v for v, c in counts.items() if c == best)


def variance(values, sample=True):
    """Return the sample (n - 1) or population (n) variance."""
    values = _check(values)
    n = len(values)
    if sample and n < 2:
        raise ValueError("sample variance needs at least two values")
    m = mean(values)
    ss = sum((v - m) ** 2 for v in values)
    return ss / (n - 1 if sample else n)
