"""Gregorian calendar helpers."""

from .cal import day_of_year, days_in_month, is_leap

__all__ = ["is_leap", "days_in_month", "day_of_year"]
