"""Calls handed from the engine's thread to a caller's event loop, one wake-up for all that are waiting.

Why: :class:`~agentrl.inference.vllm_engine.VLLMEngine` runs vLLM on its own loop in its own thread, and every
engine step ends with something to hand back to callers: each streamed request's new ids, each finished request's
result. ``loop.call_soon_threadsafe`` per item writes the caller loop's wake-up pipe once per item (64 streamed
requests: 64 writes a step), and each write lets the woken caller thread take the GIL from the engine's thread
while it is still handing out the rest. A :class:`Relay` queues the calls and wakes its loop only when the queue
was empty, so the caller runs every call queued by then in one callback.

Invariants: calls run on the caller's loop in the order they were queued (a request's last ids before its
result); a call that raises is reported to the loop's exception handler and the others still run.
"""

from __future__ import annotations

import asyncio
import threading
import weakref
from typing import Any, Callable, Coroutine, TypeVar

T = TypeVar("T")


class Relay:
    """Queues ``(fn, arg)`` calls from any thread for ``loop``, where they run in order."""

    def __init__(self, loop: asyncio.AbstractEventLoop):
        self._loop = weakref.ref(loop)  # the Relays map holds relays by their loop, weakly: do not keep it alive
        self._calls: list[tuple[Callable[[Any], Any], Any]] = []
        self._lock = threading.Lock()

    def call(self, fn: Callable[[Any], Any], arg: Any) -> None:
        with self._lock:
            self._calls.append((fn, arg))
            wake = len(self._calls) == 1
        if wake:
            loop = self._loop()
            try:
                if loop is None:
                    raise RuntimeError("the event loop of this relay is gone")
                loop.call_soon_threadsafe(self._run, loop)
            except RuntimeError:  # closed or gone: nothing will run these, and the next call must try again
                with self._lock:
                    self._calls.clear()
                raise

    def _run(self, loop: asyncio.AbstractEventLoop) -> None:
        with self._lock:
            calls, self._calls = self._calls, []
        for fn, arg in calls:
            try:
                fn(arg)
            except Exception as e:  # one caller's failure must not drop the calls queued behind it
                loop.call_exception_handler({"message": f"relayed call {fn!r} failed", "exception": e})


class Relays:
    """One :class:`Relay` per caller loop, forgotten with the loop."""

    def __init__(self) -> None:
        self._by_loop: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, Relay] = weakref.WeakKeyDictionary()
        self._lock = threading.Lock()

    def for_loop(self, loop: asyncio.AbstractEventLoop) -> Relay:
        with self._lock:
            relay = self._by_loop.get(loop)
            if relay is None:
                relay = self._by_loop[loop] = Relay(loop)
            return relay

    async def run(self, coro: Coroutine[Any, Any, T], on: asyncio.AbstractEventLoop) -> T:
        """Runs ``coro`` on the loop ``on`` (another thread's) and returns its result here, handed back through this
        loop's relay. Cancelling the caller cancels ``coro``."""
        loop = asyncio.get_running_loop()
        done: asyncio.Future[T] = loop.create_future()
        relay = self.for_loop(loop)

        async def run() -> None:
            try:
                result = await coro
            except BaseException as e:
                relay.call(settle, (done, None, e))
                raise
            relay.call(settle, (done, result, None))

        fut = asyncio.run_coroutine_threadsafe(run(), on)
        try:
            return await done
        except asyncio.CancelledError:
            fut.cancel()
            raise


def settle(item: tuple[asyncio.Future, Any, BaseException | None]) -> None:
    """Gives ``future`` its result or exception (cancelled if the work was), unless it is already done (its caller
    was cancelled)."""
    future, result, error = item
    if future.done():
        return
    if error is None:
        future.set_result(result)
    elif isinstance(error, asyncio.CancelledError):
        future.cancel()
    else:
        future.set_exception(error)
