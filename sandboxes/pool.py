"""SandboxPool: bounded concurrency, rate-limited creation with retries, optional warm reuse, and a sweep of the
orphans (dead drivers' and expired sandboxes) of each backend the first time the pool is asked for it."""

from __future__ import annotations

import asyncio
import contextlib
import random
import time
from collections import defaultdict
from dataclasses import dataclass
from typing import AsyncIterator, Awaitable, Callable

from .base import Sandbox, SandboxError, SandboxSpec
from .sweep import SweepReport, auto_sweep, merge


class TokenBucket:
    """``rate`` tokens per second, at most ``burst`` saved up. ``acquire()`` waits for one token (FIFO-fair enough:
    waiters are serialised by a lock)."""

    def __init__(self, rate: float, burst: int = 1):
        if not (rate > 0):
            raise ValueError(f"TokenBucket rate must be > 0, got {rate!r}")
        self.rate = float(rate)
        self.burst = max(1, int(burst))
        self.tokens = float(self.burst)
        self.stamp = time.monotonic()
        self._lock = asyncio.Lock()

    async def acquire(self) -> None:
        async with self._lock:
            while True:
                now = time.monotonic()
                self.tokens = min(self.burst, self.tokens + (now - self.stamp) * self.rate)
                self.stamp = now
                if self.tokens >= 1:
                    self.tokens -= 1
                    return
                await asyncio.sleep((1 - self.tokens) / self.rate)


@dataclass
class PoolStats:
    created: int = 0
    create_failures: int = 0
    retries: int = 0
    reused: int = 0
    stopped: int = 0
    in_use: int = 0
    peak_in_use: int = 0


Factory = Callable[[SandboxSpec], Awaitable[Sandbox]]


class SandboxPool:
    """Hands out sandboxes: ``async with pool.acquire(spec) as sb: ...``.

    max_alive: sandboxes handed out at once (acquire waits beyond that). Warm sandboxes idle in the pool are extra,
        at most ``max_warm`` per spec.
    create_rate / create_burst: token bucket on creations (engines fall over when asked for hundreds at once).
    retries / backoff_s: a create failing with a transient SandboxError is retried after backoff_s·2^k (+ jitter).
    acquire(spec, reuse=True): take a warm sandbox of an equal spec if one is idle (else create), and on release
        reset it (kill its processes, empty work dir and /tmp) and keep it warm instead of destroying it.
    Invariant: every sandbox this pool created is stopped by ``close()`` or on release, including when the holder's
    task is cancelled.
    Start: the first acquire/prewarm of each backend sweeps that backend's orphans in the background (``swept()``
    awaits those sweeps and returns what they removed).
    """

    def __init__(
        self,
        *,
        max_alive: int = 64,
        create_rate: float = 20.0,
        create_burst: int = 4,
        retries: int = 3,
        backoff_s: float = 0.5,
        max_warm: int = 8,
        run: str | None = None,
        factory: Factory | None = None,
    ):
        if max_alive < 1:
            raise ValueError(f"SandboxPool.max_alive must be >= 1, got {max_alive}")
        self.max_alive = max_alive
        self.retries = retries
        self.backoff_s = backoff_s
        self.max_warm = max_warm
        self.run = run
        self._sem = asyncio.Semaphore(max_alive)
        self._bucket = TokenBucket(create_rate, create_burst)
        self._warm: dict[str, list[Sandbox]] = defaultdict(list)
        self._factory = factory
        self._closed = False
        self._sweeps: dict[str, asyncio.Future] = {}
        self.stats = PoolStats()

    def _sweep_once(self, backend: str) -> None:
        if backend not in self._sweeps:
            fut = auto_sweep(backend, force=True)
            if fut is not None:
                self._sweeps[backend] = fut

    async def swept(self) -> SweepReport:
        """Waits for the sweeps this pool started; returns what they removed."""
        done = await asyncio.gather(*self._sweeps.values(), return_exceptions=True)
        return merge([r for r in done if isinstance(r, SweepReport)])

    async def _new(self, spec: SandboxSpec) -> Sandbox:
        from .factory import create_sandbox

        attempt = 0
        while True:
            await self._bucket.acquire()
            try:
                if self._factory is not None:
                    sb = await self._factory(spec)
                else:
                    sb = await create_sandbox(spec, run=self.run).start()
                self.stats.created += 1
                return sb
            except SandboxError as e:
                self.stats.create_failures += 1
                if not e.transient or attempt >= self.retries:
                    raise
                delay = self.backoff_s * (2**attempt) * (1 + 0.25 * random.random())
                attempt += 1
                self.stats.retries += 1
                await asyncio.sleep(delay)

    async def prewarm(self, spec: SandboxSpec, n: int) -> None:
        """Create ``n`` sandboxes of ``spec`` and keep them idle for ``acquire(spec, reuse=True)``."""
        self._sweep_once(spec.backend)
        made = await asyncio.gather(*(self._new(spec) for _ in range(n)))
        self._warm[spec.key()].extend(made)

    @contextlib.asynccontextmanager
    async def acquire(self, spec: SandboxSpec, *, reuse: bool = False) -> AsyncIterator[Sandbox]:
        if self._closed:
            raise SandboxError("pool is closed")
        self._sweep_once(spec.backend)
        async with self._sem:
            sb = None
            if reuse:
                idle = self._warm.get(spec.key())
                while idle and sb is None:
                    cand = idle.pop()
                    if cand.running and (cand.expires_at or 0) > time.time() + 60:
                        sb = cand
                        self.stats.reused += 1
                    else:
                        await self._stop(cand)
            if sb is None:
                sb = await self._new(spec)
            self.stats.in_use += 1
            self.stats.peak_in_use = max(self.stats.peak_in_use, self.stats.in_use)
            keep = False
            try:
                yield sb
                keep = reuse
            finally:
                self.stats.in_use -= 1
                # Shielded: a cancelled holder must still release its sandbox.
                await asyncio.shield(self._release(spec, sb, keep))

    async def _release(self, spec: SandboxSpec, sb: Sandbox, keep: bool) -> None:
        if keep and not self._closed and sb.running and len(self._warm[spec.key()]) < self.max_warm:
            try:
                await sb.reset()
                self._warm[spec.key()].append(sb)
                return
            except SandboxError:
                pass
        await self._stop(sb)

    async def _stop(self, sb: Sandbox) -> None:
        try:
            await sb.stop()
        finally:
            self.stats.stopped += 1

    @property
    def warm_count(self) -> int:
        return sum(len(v) for v in self._warm.values())

    async def close(self) -> None:
        """Stop every idle warm sandbox; later acquires fail. Sandboxes still held are stopped on release."""
        self._closed = True
        idle = [sb for v in self._warm.values() for sb in v]
        self._warm.clear()
        await asyncio.gather(*(self._stop(sb) for sb in idle), return_exceptions=True)

    async def __aenter__(self) -> "SandboxPool":
        return self

    async def __aexit__(self, *exc) -> None:
        await self.close()
