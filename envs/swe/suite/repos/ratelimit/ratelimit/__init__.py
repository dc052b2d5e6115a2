"""Token-bucket rate limiting."""

from .bucket import TokenBucket

__all__ = ["TokenBucket"]
