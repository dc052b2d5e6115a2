"""TokenBucket: `rate` tokens per second, at most `capacity` stored."""

import time


class TokenBucket:
    def __init__(self, rate, capacity, clock=time.monotonic):
        if rate <= 0 or capacity <= 0:
            raise ValueError("rate and capacity must be positive")
        self.rate = float(rate)
        self.capacity = float(capacity)
        self.clock = clock
        self._tokens = float(capacity)
        self._last = clock()

    def _refill(self):
        now = self.clock()
        elapsed = max(0.0, now - self._last)
        self._tokens = self._tokens + elapsed * self.rate
        self._last = now

    def available(self):
        """Return the number of tokens available now."""
        self._refill()
        return self._tokens

    def try_acquire(self, n=1):
        """Take n tokens if available; return whether they were taken."""
        if n > self.capacity:
            raise ValueError("cannot acquire more than capacity")
        self._refill()
        if self._tokens >= n:
            self._tokens -= n
            return True
        return False
