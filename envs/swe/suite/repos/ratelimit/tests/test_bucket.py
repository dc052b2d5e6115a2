import unittest

from ratelimit import TokenBucket


class FakeClock:
    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now


class TestTokenBucket(unittest.TestCase):
    def test_starts_full(self):
        b = TokenBucket(1, 3, clock=FakeClock())
        self.assertEqual([b.try_acquire() for _ in range(4)], [True, True, True, False])

    def test_refills_at_rate(self):
        clock = FakeClock()
        b = TokenBucket(2, 2, clock=clock)
        self.assertTrue(b.try_acquire(2))
        self.assertFalse(b.try_acquire())
        clock.now = 0.5
        self.assertTrue(b.try_acquire())
        self.assertFalse(b.try_acquire())

    def test_too_many(self):
        with self.assertRaises(ValueError):
            TokenBucket(1, 2, clock=FakeClock()).try_acquire(3)
