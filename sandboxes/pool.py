"""SandboxPool: bounded concurrency, rate-limited creation with retries, host resource guards, a warm pool of fresh
sandboxes refilled in the background, optional warm reuse (reset), and a sweep of the orphans (dead drivers' and
expired sandboxes) of each backend the first time the pool is asked for it.

Invariants: every creation passes the token bucket (callers and the refill wait for a token, nothing times out on
it) and the host guard (refused with HostCapacityError before anything is made); a sandbox handed out once is never
handed out again unless it was reset (``reuse=True``); every sandbox made is stopped on release or by ``close()``."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import time
from collections import defaultdict
from dataclasses import dataclass
from typing import AsyncIterator, Awaitable, Callable

from .base import Sandbox, SandboxError, SandboxSpec
from .faults import engine_back, engine_down
from .guards import HostGuard
from .snapshot import Snapshot, restore_snapshot
from .sweep import SweepReport, auto_sweep, merge

log = logging.getLogger("agentrl.sandboxes")


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


class ExecGate:
    """At most ``slots`` commands running at once across the sandboxes that share it; the others wait in FIFO order.

    Why: a fleet whose steps are CPU-bound overcommits the host (1,024 sandboxes each running a 0.1 s-CPU command
    on 2 cores take ~50 s of wall time each), so commands run past their wall-clock timeouts, are killed and
    retried, and the work is done twice. Waiting for a slot is backpressure: a command's timeout then measures its
    own running time. ``running``/``waiting``/``peak_running`` are for stats and tests."""

    def __init__(self, slots: int):
        if not isinstance(slots, int) or slots < 1:
            raise ValueError(f"max_running_execs must be an int >= 1, got {slots!r}")
        self.slots = slots
        self._sem = asyncio.Semaphore(slots)
        self.running = self.waiting = self.peak_running = 0

    @contextlib.asynccontextmanager
    async def slot(self) -> AsyncIterator[None]:
        self.waiting += 1
        try:
            await self._sem.acquire()
        finally:
            self.waiting -= 1
        self.running += 1
        self.peak_running = max(self.peak_running, self.running)
        try:
            yield
        finally:
            self.running -= 1
            self._sem.release()


@dataclass
class PoolStats:
    created: int = 0
    create_failures: int = 0
    retries: int = 0
    reused: int = 0
    warm_hits: int = 0  # acquires served by a fresh sandbox of the warm pool
    refill_failures: int = 0
    dead_idle: int = 0  # idle sandboxes found dead when about to be handed out (stopped instead)
    stopped: int = 0
    in_use: int = 0
    peak_in_use: int = 0


Factory = Callable[[SandboxSpec], Awaitable[Sandbox]]


class Shielded:
    """Coroutines run to their end even when their caller is cancelled (an env's close timeout while a container
    is being removed), and awaited together by :meth:`drain`: a closed pool owns no sandbox."""

    def __init__(self) -> None:
        self._tasks: set[asyncio.Task] = set()

    def run(self, coro) -> asyncio.Future:
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._done)
        return asyncio.shield(task)

    def _done(self, task: asyncio.Task) -> None:
        # the shield lets go of a cancelled caller's task: its failure (a removal timed out) is said here, and the
        # sandbox is left to the sweep
        self._tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.warning("a stop that outlived its caller failed: %s", task.exception())

    async def drain(self) -> None:
        while self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)


class Creator:
    """Makes a pool's sandboxes: paced by a token bucket (``create_rate`` / ``create_burst``), at most
    ``max_creating`` in flight (the rest wait in the driver), each charged to the host ``guard`` before it is made.
    A transient failure is retried after backoff_s·2^k (+ jitter), up to ``retries`` times; one met while the
    backend's engine does not answer (a docker daemon restarting) first waits up to ``engine_wait_s`` for it to
    answer again, and that costs no retry. Counts go to ``stats``; ``closed`` refuses new creations."""

    def __init__(self, *, create_rate: float, create_burst: int, max_creating: int, retries: int, backoff_s: float,
                 engine_wait_s: float, run: str | None, factory: Factory | None, guard: HostGuard, stats: PoolStats):
        if max_creating < 1:
            raise ValueError(f"SandboxPool.max_creating must be >= 1, got {max_creating}")
        for name, value in (("retries", retries), ("backoff_s", backoff_s), ("engine_wait_s", engine_wait_s)):
            if value < 0:
                raise ValueError(f"SandboxPool.{name} must be >= 0, got {value}")
        self.retries, self.backoff_s, self.engine_wait_s = retries, backoff_s, engine_wait_s
        self.run, self.factory, self.guard, self.stats = run, factory, guard, stats
        self.bucket = TokenBucket(create_rate, create_burst)
        self.in_flight = asyncio.Semaphore(max_creating)
        self.closed = False

    async def create(self, spec: SandboxSpec) -> Sandbox:
        from .factory import create_sandbox

        attempt = 0
        engine_deadline: float | None = None
        while True:
            await self.bucket.acquire()
            if self.closed:
                raise SandboxError("pool is closed")
            self.guard.admit(spec)  # HostCapacityError: nothing was made
            try:
                async with self.in_flight:
                    if self.factory is not None:
                        sb = await self.factory(spec)
                    else:
                        sb = await create_sandbox(spec, run=self.run).start()
                self.stats.created += 1
                return sb
            except BaseException as e:
                self.guard.release(spec)
                if not isinstance(e, SandboxError):
                    raise
                self.stats.create_failures += 1
                if e.transient and await engine_down(spec.backend):
                    if engine_deadline is None:
                        engine_deadline = time.monotonic() + self.engine_wait_s
                    if await engine_back(spec.backend, engine_deadline):
                        continue
                if not e.transient or attempt >= self.retries:
                    raise
                delay = self.backoff_s * (2**attempt) * (1 + 0.25 * random.random())
                attempt += 1
                self.stats.retries += 1
                await asyncio.sleep(delay)


def _key(spec: SandboxSpec, snapshot: Snapshot | None) -> str:
    """Idle sandboxes are interchangeable when their spec and the state in their work dir are."""
    return spec.key() + "|" + (snapshot.key if snapshot is not None else "")


class SandboxPool:
    """Hands out sandboxes: ``async with pool.acquire(spec) as sb: ...``.

    max_alive: sandboxes handed out at once (acquire waits beyond that). Warm sandboxes idle in the pool are extra,
        at most ``max_warm`` per spec.
    create_rate / create_burst: token bucket on creations (engines fall over when asked for hundreds at once).
    max_creating: creations in flight at once, the rest waiting in the driver: the bucket paces starts only, and an
        engine slower than the rate piles them up until client timeouts, whose retries leave orphan containers.
    retries / backoff_s: a create failing with a transient SandboxError is retried after backoff_s·2^k (+ jitter).
    engine_wait_s: a create failing while its engine does not answer waits this long for it first (:class:`Creator`).
    acquire(spec, reuse=True): take a warm sandbox of an equal spec if one is idle (else create), and on release
        reset it (kill its processes, empty work dir and /tmp) and keep it warm instead of destroying it.
    Invariant: every sandbox this pool created is stopped by ``close()`` or on release, even a cancelled holder's.
    keep_warm(spec, n): keep ``n`` fresh (never used) sandboxes of ``spec`` ready; ``acquire(spec)`` takes one
        and a background task makes its replacement, through the same token bucket.
    guard: HostGuard charging every live sandbox against the host's memory, PIDs and file descriptors.
    max_running_execs: commands running at once in this pool's sandboxes (:class:`ExecGate`; None: no limit, right
        for steps that mostly wait); a few per core for CPU-bound steps on a fleet larger than the host.
    Start: the first acquire/prewarm of each backend sweeps that backend's orphans in the background (``swept()``
    awaits those sweeps and returns what they removed).
    """

    def __init__(self, *, max_alive: int = 64, create_rate: float = 20.0, create_burst: int = 4, retries: int = 3,
                 backoff_s: float = 0.5, max_warm: int = 8, run: str | None = None, factory: Factory | None = None,
                 guard: HostGuard | None = None, max_running_execs: int | None = None, max_creating: int = 8,
                 engine_wait_s: float = 120.0):
        if max_alive < 1:
            raise ValueError(f"SandboxPool.max_alive must be >= 1, got {max_alive}")
        self.max_alive = max_alive
        self.max_warm = max_warm
        self.run = run
        self._sem = asyncio.Semaphore(max_alive)
        self.exec_gate = None if max_running_execs is None else ExecGate(max_running_execs)
        self._warm: dict[str, list[Sandbox]] = defaultdict(list)
        self._closed = False
        self._sweeps: dict[str, asyncio.Future] = {}
        self.guard = guard if guard is not None else HostGuard()
        self._fresh: dict[str, list[Sandbox]] = defaultdict(list)
        self._targets: dict[str, tuple[SandboxSpec, Snapshot | None, int, bool]] = {}
        self._held: dict[str, int] = defaultdict(int)  # handed out, per key (a fleet target counts them)
        self._making: dict[str, int] = defaultdict(int)
        self._refill_wake = asyncio.Event()
        self._refill_task: asyncio.Task | None = None
        self._stops = Shielded()  # stops and releases that outlive a cancelled caller
        self._fresh_ready = asyncio.Condition()
        self.refill_error: BaseException | None = None  # the last error of the background refill
        self.stats = PoolStats()
        self._creator = Creator(create_rate=create_rate, create_burst=create_burst, max_creating=max_creating,
                                retries=retries, backoff_s=backoff_s, engine_wait_s=engine_wait_s, run=run,
                                factory=factory, guard=self.guard, stats=self.stats)

    def _sweep_once(self, backend: str) -> None:
        if backend not in self._sweeps:
            fut = auto_sweep(backend, force=True)
            if fut is not None:
                self._sweeps[backend] = fut

    async def swept(self) -> SweepReport:
        """Waits for the sweeps this pool started; returns what they removed."""
        done = await asyncio.gather(*self._sweeps.values(), return_exceptions=True)
        return merge([r for r in done if isinstance(r, SweepReport)])

    async def _new(self, spec: SandboxSpec, snapshot: Snapshot | None = None) -> Sandbox:
        """Create (bucket, guard, retries) and, with ``snapshot``, restore it; a sandbox that fails its restore is
        stopped and the error raised."""
        sb = await self._create(spec)
        if snapshot is not None:
            try:
                await restore_snapshot(sb, snapshot)
            except BaseException:
                await self._stops.run(self._stop(sb))
                raise
        return sb

    async def _create(self, spec: SandboxSpec) -> Sandbox:
        sb = await self._creator.create(spec)
        sb.exec_gate = self.exec_gate
        return sb

    async def prewarm(self, spec: SandboxSpec, n: int) -> None:
        """Create ``n`` sandboxes of ``spec`` and keep them idle for ``acquire(spec, reuse=True)``."""
        self._sweep_once(spec.backend)
        self.guard.check(spec, n)
        made = await asyncio.gather(*(self._new(spec) for _ in range(n)), return_exceptions=True)
        good = [sb for sb in made if not isinstance(sb, BaseException)]
        self._warm[_key(spec, None)].extend(good)
        for err in made:
            if isinstance(err, BaseException):
                raise err

    async def keep_warm(self, spec: SandboxSpec, n: int, *, wait: bool = False,
                        snapshot: Snapshot | None = None, fleet: bool = False) -> None:
        """Keep ``n`` fresh sandboxes of ``spec`` made ahead of the acquires that take them (0 stops refilling;
        those already made stay until taken or ``close()``). ``wait``: return once they are ready. ``snapshot``: each
        is restored to it before it counts as ready (``acquire(spec, snapshot=...)`` takes those). ``fleet``: ``n``
        is the size of the whole fleet, the sandboxes of ``spec`` handed out included: the pool keeps ``n`` minus
        those fresh, so that every one of ``n`` concurrent episodes finds one ready and no more are made (a release
        makes room for the next; :meth:`agentrl.manager.EnvManager.warm_sandboxes` sizes ``n`` by the admission
        rule). Raises HostCapacityError at once when the host cannot hold them on top of what the pool holds."""
        if n < 0:
            raise ValueError(f"keep_warm n must be >= 0, got {n}")
        if self._closed:
            raise SandboxError("pool is closed")
        self._sweep_once(spec.backend)
        key = _key(spec, snapshot)
        missing = self._missing(key, n, fleet)
        if missing > 0:
            self.guard.check(spec, missing)
        self._targets[key] = (spec, snapshot, n, fleet)
        self.refill_error = None  # a new target: wait for what this refill meets, not an earlier one
        if self._refill_task is None:
            self._refill_task = asyncio.create_task(self._refill_loop())
        self._refill_wake.set()
        if wait:
            async with self._fresh_ready:
                await self._fresh_ready.wait_for(
                    lambda: self._missing(key, n, fleet, making=False) <= 0 or self.refill_error is not None
                    or self._closed)
            if self.refill_error is not None and self._missing(key, n, fleet, making=False) > 0:
                raise self.refill_error

    def _missing(self, key: str, n: int, fleet: bool, making: bool = True) -> int:
        """What the target ``n`` of ``key`` still lacks (fresh, being made unless ``making`` is false, and with
        ``fleet`` those handed out)."""
        return n - len(self._fresh[key]) - (self._making[key] if making else 0) - (self._held[key] if fleet else 0)

    async def _refill_loop(self) -> None:
        """Make what the targets miss, concurrently, each creation through the bucket (which paces them)."""
        while not self._closed:
            await self._refill_wake.wait()
            self._refill_wake.clear()
            if self._closed:
                return
            jobs = []
            for key, (spec, snapshot, n, fleet) in list(self._targets.items()):
                for _ in range(self._missing(key, n, fleet)):
                    self._making[key] += 1
                    jobs.append(self._refill_one(key, spec, snapshot))
            if jobs:
                await asyncio.gather(*jobs)

    async def _refill_one(self, key: str, spec: SandboxSpec, snapshot: Snapshot | None) -> None:
        try:
            sb = await self._new(spec, snapshot)
        except Exception as e:  # kept (until the next keep_warm) for its wait and the caller's look; the next
            # acquire wakes the refill again
            self.refill_error = e
            self.stats.refill_failures += 1
            sb = None
        finally:
            self._making[key] -= 1
        if sb is not None:
            if self._closed:
                await self._stop(sb)
            else:
                self._fresh[key].append(sb)
        async with self._fresh_ready:
            self._fresh_ready.notify_all()

    async def _take_idle(self, idle: list[Sandbox] | None) -> Sandbox | None:
        """The first idle sandbox that is alive with a minute of TTL left; the dead and expiring ones are stopped
        (killed from outside, lost with the engine, or swept while idle: never handed out)."""
        while idle:
            sb = idle.pop(0)
            if sb.running and (sb.expires_at is None or sb.expires_at > time.time() + 60):
                if await sb.dead_reason() is None:
                    return sb
                self.stats.dead_idle += 1
            await self._stops.run(self._stop_quietly(sb))
        return None

    async def _stop_quietly(self, sb: Sandbox) -> None:
        try:
            await self._stop(sb)
        except SandboxError:
            pass  # a dead sandbox that will not go: the sweep removes it

    async def _take_fresh(self, key: str) -> Sandbox | None:
        if key in self._targets:
            self._refill_wake.set()  # replace what is taken
        sb = await self._take_idle(self._fresh.get(key))
        if sb is not None:
            self.stats.warm_hits += 1
        return sb

    @contextlib.asynccontextmanager
    async def acquire(self, spec: SandboxSpec, *, reuse: bool = False,
                      snapshot: Snapshot | None = None) -> AsyncIterator[Sandbox]:
        """A sandbox of ``spec`` for one episode: a reset one (``reuse``), else a fresh one of the warm pool, else a
        new one. ``snapshot``: its work dir holds that state when handed out, and on release (``reuse``) it is
        restored to it rather than emptied."""
        if self._closed:
            raise SandboxError("pool is closed")
        self._sweep_once(spec.backend)
        async with self._sem:
            sb = None
            key = _key(spec, snapshot)
            # Held from the start: one being checked or made is in no list, and a refill would replace it.
            self._held[key] += 1
            try:
                if reuse and (sb := await self._take_idle(self._warm.get(key))) is not None:
                    self.stats.reused += 1  # reset ones first: the fresh ones are all that plain acquires can take
                sb = sb or await self._take_fresh(key) or await self._new(spec, snapshot)
            except BaseException:
                self._held[key] -= 1
                raise
            self.stats.in_use += 1
            self.stats.peak_in_use = max(self.stats.peak_in_use, self.stats.in_use)
            keep = False
            try:
                yield sb
                keep = reuse
            finally:
                self.stats.in_use -= 1
                self._held[key] -= 1
                try:
                    # Shielded: a cancelled holder must still release its sandbox.
                    await self._stops.run(self._release(key, snapshot, sb, keep))
                finally:
                    if key in self._targets:  # a fleet target has room for the next episode's sandbox now
                        self._refill_wake.set()

    async def _release(self, key: str, snapshot: Snapshot | None, sb: Sandbox, keep: bool) -> None:
        if keep and not self._closed and sb.running and len(self._warm[key]) < self.max_warm:
            try:
                if snapshot is not None:
                    await restore_snapshot(sb, snapshot)
                else:
                    await sb.reset()
                self._warm[key].append(sb)
                return
            except SandboxError:
                pass
        await self._stop(sb)

    async def _stop(self, sb: Sandbox) -> None:
        try:
            await sb.stop()
        finally:
            self.stats.stopped += 1
            self.guard.release(sb.spec)

    @property
    def warm_count(self) -> int:
        """Reset sandboxes idle for ``acquire(reuse=True)``."""
        return sum(len(v) for v in self._warm.values())

    @property
    def fresh_count(self) -> int:
        """Fresh sandboxes of the warm pool, ready for any acquire."""
        return sum(len(v) for v in self._fresh.values())

    async def close(self) -> None:
        """Stop every idle warm sandbox and wait for the stops under way; later acquires fail. Sandboxes still held
        are stopped on release."""
        self._closed = self._creator.closed = True
        if self._refill_task is not None:
            # Not cancelled: a creation cut off half-way could leave its sandbox; each one finishing now sees the
            # pool closed and stops what it made.
            self._refill_wake.set()
            await asyncio.gather(self._refill_task, return_exceptions=True)
        async with self._fresh_ready:
            self._fresh_ready.notify_all()
        idle = [sb for v in (*self._warm.values(), *self._fresh.values()) for sb in v]
        self._warm.clear()
        self._fresh.clear()
        await asyncio.gather(*(self._stop(sb) for sb in idle), return_exceptions=True)
        await self._stops.drain()

    async def __aenter__(self) -> "SandboxPool":
        return self

    async def __aexit__(self, *exc) -> None:
        await self.close()
