"""Operations on closed intervals given as (start, end) pairs."""


def merge(intervals):
    """Merge overlapping closed intervals.

    Returns a list of (start, end) tuples sorted by start, no two of which overlap.
    """
    result = []
    for start, end in intervals:
        if start > end:
            raise ValueError("start > end in interval (%r, %r)" % (start, end))
        if result and start < result[-1][1]:
            last_start, last_end = result[-1]
            result[-1] = (last_start, max(last_end, end))
        else:
            result.append((start, end))
    return result


def total_length(intervals):
    """Return the total length covered by the union of the intervals."""
    return sum(end - start for start, end in merge(intervals))
