"""A virtual clock for asyncio: time jumps to the next event instead of passing.

:class:`VirtualTimeLoop` is an ordinary selector event loop (real sockets, pipes and threads still work) whose
``time()`` is virtual. Each iteration first polls real I/O without waiting; if nothing is ready and a timer is
scheduled, the clock is set to that timer's due time at once, exactly (no sleeping, no float drift: the clock takes
the timer's own ``when``). With no timer and nothing ready it waits for real I/O, as a real loop does (a thread
finishing, a socket). So a program that only sleeps runs in the time its callbacks take, and its virtual timeline is
exactly what its sleeps add up to.

Invariants: the clock never goes backwards; it moves only when no callback is ready (everything runnable at a
virtual instant runs at that instant, in the order asyncio gives it); a timer never fires before its due time.
Executor work (``run_in_executor``, ``asyncio.to_thread``: the controller's trajectory log) runs inline, at once,
on the loop's thread: it takes no virtual time, and it cannot race the callbacks that are ready at the same instant,
so a simulation is a function of its seeds (a real thread's finishing point among those callbacks would depend on
the machine's load). A function so sent must not wait for the loop itself. Threads started some other way (a thread
pool of one's own that wakes the loop with ``call_soon_threadsafe``, such as the pool :func:`agentrl.core.run_sync`
runs sync env methods on) are not seen: the clock may run ahead of them, so simulated envs are async throughout.
"""

from __future__ import annotations

import asyncio
import selectors
from typing import Any, Awaitable, TypeVar

T = TypeVar("T")


class _VirtualSelector(selectors.DefaultSelector):
    """The real selector, except that a wait for a timer moves the loop's clock instead of blocking."""

    loop: "VirtualTimeLoop"

    def select(self, timeout: float | None = None) -> list[Any]:
        events = super().select(0)
        if events or timeout == 0:
            return events
        loop = self.loop
        if timeout is None:  # nothing scheduled: only real I/O can wake us
            return super().select(None)
        due = [h._when for h in loop._scheduled if not h._cancelled]  # type: ignore[attr-defined]
        loop._now = max(loop._now, min(due) if due else loop._now + timeout)
        return []


class VirtualTimeLoop(asyncio.SelectorEventLoop):
    """An event loop on virtual time (module docstring). ``start``: the clock's first reading."""

    def __init__(self, start: float = 0.0) -> None:
        selector = _VirtualSelector()
        super().__init__(selector)
        selector.loop = self
        self._now = float(start)

    def time(self) -> float:
        return self._now

    def run_in_executor(self, executor: Any, func: Any, *args: Any) -> asyncio.Future:
        fut = self.create_future()
        try:
            fut.set_result(func(*args))
        except BaseException as e:  # noqa: BLE001 - delivered to the awaiting coroutine, as a thread's would be
            fut.set_exception(e)
        return fut


def run_virtual(main: Awaitable[T], start: float = 0.0) -> tuple[T, float]:
    """Runs ``main`` to completion on a fresh :class:`VirtualTimeLoop`; returns its result and the virtual seconds
    it took."""
    loop = VirtualTimeLoop(start)
    try:
        asyncio.set_event_loop(loop)
        result = loop.run_until_complete(main)
        return result, loop.time() - start
    finally:
        asyncio.set_event_loop(None)
        loop.close()
