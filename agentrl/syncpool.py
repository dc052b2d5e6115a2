"""A thread pool for blocking env calls that survives calls which never return.

``concurrent.futures.ThreadPoolExecutor`` fits badly: its threads are joined at interpreter exit (one hung env call
and the process never exits), and a call whose caller timed out keeps its thread, so ``n`` hung calls leave no
thread for anyone. Python cannot kill a thread, so this pool lets hung calls go instead:

- Threads are daemon threads: a call that never returns does not hold up process exit.
- ``size`` threads serve the queue. When the caller of a running call gives up (timeout or cancellation: see
  :meth:`SyncPool.run`), that call is *abandoned*: its thread stops counting against ``size`` and leaves as soon as
  the call returns, and a new thread takes its place for queued work. So hung calls never starve the others.
- At most ``max_hung`` abandoned calls may be running at once; past that, :meth:`SyncPool.run` raises
  :class:`PoolExhausted` at once instead of starting threads without end (a process that far gone is replaced:
  :class:`agentrl.manager.workers.RayWorker`'s heartbeat reports it unhealthy).

Invariants: ``live - hung <= size`` threads serve new work; a call starts at most once; a call whose caller was
cancelled before it started never starts.
"""

from __future__ import annotations

import asyncio
import collections
import threading
from typing import Any, Callable, TypeVar

T = TypeVar("T")


class PoolExhausted(RuntimeError):
    """Too many blocking env calls are hung in this process for the pool to take more."""


class _Job:
    __slots__ = ("fn", "loop", "future", "state")

    def __init__(self, fn: Callable[[], Any], loop: asyncio.AbstractEventLoop, future: asyncio.Future):
        self.fn, self.loop, self.future = fn, loop, future
        self.state = "queued"  # -> running -> done | abandoned (running, caller gone) | cancelled (never ran)


def _settle(future: asyncio.Future, ok: bool, value: Any) -> None:
    if future.done():
        return
    if ok:
        future.set_result(value)
    else:
        future.set_exception(value)


class SyncPool:
    """Runs blocking calls on at most ``size`` daemon threads (see the module docstring)."""

    def __init__(self, size: int, *, max_hung: int | None = None, name: str = "agentrl-env"):
        if size < 1:
            raise ValueError(f"sync pool size must be >= 1, got {size}")
        self.size = size
        self.max_hung = max_hung if max_hung is not None else 4 * size
        self.name = name
        self._lock = threading.Lock()
        self._queue: collections.deque[_Job] = collections.deque()
        self._wake = threading.Condition(self._lock)
        self._serving = 0  # threads that count against size
        self._idle = 0
        self._hung = 0  # abandoned calls still running
        self._seq = 0
        self._closed = False

    def stats(self) -> dict[str, int]:
        """``serving`` (threads counted against size), ``idle``, ``queued``, ``hung`` (abandoned calls running)."""
        with self._lock:
            return {"size": self.size, "serving": self._serving, "idle": self._idle, "queued": len(self._queue),
                    "hung": self._hung}

    async def run(self, fn: Callable[[], T]) -> T:
        """Runs ``fn()`` on a pool thread and returns its result. If the awaiting task is cancelled (a timeout),
        a call still queued never runs and a running one is abandoned (module docstring). Raises PoolExhausted when
        ``max_hung`` calls are already hung."""
        loop = asyncio.get_running_loop()
        job = _Job(fn, loop, loop.create_future())
        with self._lock:
            if self._hung >= self.max_hung:
                raise PoolExhausted(
                    f"{self._hung} blocking env calls are hung in this process (limit {self.max_hung}); a sync env "
                    "never returns from reset/step/close: fix it, or make it async with its own timeouts")
            self._queue.append(job)
            self._wake.notify()
            if len(self._queue) > self._idle and self._serving < self.size:
                self._spawn()
        try:
            return await asyncio.shield(job.future)
        except asyncio.CancelledError:
            with self._lock:
                if job.state == "queued":
                    job.state = "cancelled"
                elif job.state == "running":
                    job.state = "abandoned"
                    self._hung += 1
                    self._serving -= 1  # its thread leaves once the call returns; a new one serves meanwhile
                    if len(self._queue) > self._idle:
                        self._spawn()
            raise

    def close(self) -> None:
        """Idle threads exit; queued calls still run; new ones are not refused (a replaced pool drains)."""
        with self._lock:
            self._closed = True
            self._wake.notify_all()

    def _spawn(self) -> None:  # with the lock held
        self._serving += 1
        self._seq += 1
        threading.Thread(target=self._work, name=f"{self.name}_{self._seq}", daemon=True).start()

    def _work(self) -> None:
        while True:
            with self._lock:
                job = None
                while job is None:
                    while self._queue:
                        cand = self._queue.popleft()
                        if cand.state == "queued":
                            job = cand
                            break
                    if job is not None:
                        break
                    if self._closed:
                        self._serving -= 1
                        return
                    self._idle += 1
                    woken = self._wake.wait(timeout=60.0)
                    self._idle -= 1
                    if not woken and not self._queue and not self._closed:
                        # an idle minute: give the thread back (a new one starts on demand)
                        self._serving -= 1
                        return
                job.state = "running"
            try:
                ok, value = True, job.fn()
            except BaseException as e:  # delivered to the caller
                ok, value = False, e
            with self._lock:
                abandoned = job.state == "abandoned"
                job.state = "done"
                if abandoned:
                    self._hung -= 1
            try:
                job.loop.call_soon_threadsafe(_settle, job.future, ok, value)
            except RuntimeError:  # the caller's loop is closed
                pass
            if abandoned:
                return  # a replacement already serves in this thread's place
