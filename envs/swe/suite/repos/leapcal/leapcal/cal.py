"""Leap years and month lengths in the Gregorian calendar."""

_DAYS = [31, 28, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31]


def is_leap(year):
    """Return True if year is a leap year."""
    return year % 4 == 0


def days_in_month(year, month):
    """Return the number of days of month (1-12) in year."""
    if not 1 <= month <= 12:
        raise ValueError("month must be in 1..12, got %r" % month)
    if month == 2 and is_leap(year):
        return 29
    return _DAYS[month - 1]


def day_of_year(year, month, day):
    """Return the 1-based ordinal of the date within its year."""
    if not 1 <= day <= days_in_month(year, month):
        raise ValueError("invalid day %r for %d-%02d" % (day, year, month))
    return sum(days_in_month(year, m) for m in range(1, month)) + day
