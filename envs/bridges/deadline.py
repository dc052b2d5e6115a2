"""A time bound on an in-process library call: what keeps one endless loop in a bridged library (a TextArena game
stepped in a state it never meant to reach) from holding the bridges' one lock (:mod:`.rng`) forever, which would
stall every other bridged env of the process.

Flow: ``with bounded(seconds, what):`` registers the calling thread and its deadline with the process's one
watchdog thread (started on first use, every :data:`TICK_S`), runs the body, and unregisters. Past the deadline the
watchdog raises an interrupt in the registered thread (CPython's ``PyThreadState_SetAsyncExc``), again every
:data:`REPEAT_S` while the body has not ended (a library's ``except Exception`` may swallow one; the interrupt is a
``BaseException`` so that few do). The body ends with :class:`LibraryTimeout` naming ``what`` and the bound.

Invariants:

- A body that ends in time is never interrupted, also when the deadline passes while it returns: a pending
  interrupt is withdrawn, or consumed, before ``bounded`` exits.
- Cheap: a bounded call costs a dictionary entry under a lock (no thread, no wake-up per call); the bridges' calls
  are tens of microseconds. The bound is kept to within :data:`TICK_S`.
- The interrupt lands between Python bytecodes: a single C call that never returns (a catastrophic regular
  expression, a huge integer power) is not stopped by it.
"""

from __future__ import annotations

import ctypes
import os
import threading
import time

TICK_S = 0.05
REPEAT_S = 0.5


class LibraryTimeout(TimeoutError):
    """A bridged library's call did not return within its bound and was interrupted; its env's state is lost."""


class _Interrupt(BaseException):
    """What the watchdog raises in the stuck thread (never seen outside :func:`bounded`)."""


class _Call:
    __slots__ = ("tid", "deadline", "fired")

    def __init__(self, tid: int, deadline: float):
        self.tid, self.deadline, self.fired = tid, deadline, False


_lock = threading.Lock()
_calls: dict[int, _Call] = {}
_watchdog: threading.Thread | None = None


def _raise_in(tid: int, exc: type[BaseException] | None) -> None:
    ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(tid), ctypes.py_object(exc) if exc else None)


def _watch() -> None:
    while True:
        time.sleep(TICK_S)
        now = time.monotonic()
        with _lock:
            for call in _calls.values():
                if now >= call.deadline:
                    call.fired, call.deadline = True, now + REPEAT_S
                    _raise_in(call.tid, _Interrupt)


def _forked() -> None:  # the child has no watchdog thread: the next bounded call starts one
    global _lock, _watchdog
    _lock, _watchdog = threading.Lock(), None
    _calls.clear()


os.register_at_fork(after_in_child=_forked)


def timeout_arg(value: object, owner: str) -> float:
    """``value`` as a call bound in seconds, or a ValueError naming ``owner``'s ``call_timeout_s``."""
    if not isinstance(value, (int, float)) or isinstance(value, bool) or not value > 0:
        raise ValueError(f"{owner}: call_timeout_s must be a positive number of seconds, got {value!r}")
    return float(value)


class bounded:
    """``with bounded(seconds, what):`` interrupts the body with :class:`LibraryTimeout` once it has run ``seconds``
    (None or 0: unbounded). A class rather than a generator context manager: half the cost per call, which matters
    on calls of tens of microseconds."""

    __slots__ = ("seconds", "what", "call")

    def __init__(self, seconds: float | None, what: str):
        self.seconds, self.what, self.call = seconds, what, None

    def __enter__(self) -> None:
        global _watchdog
        if not self.seconds:
            return
        call = _Call(threading.get_ident(), time.monotonic() + self.seconds)
        with _lock:
            if _watchdog is None:
                _watchdog = threading.Thread(target=_watch, name="agentrl-deadline", daemon=True)
                _watchdog.start()
            _calls[id(call)] = call
        self.call = call

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: object) -> bool:
        call = self.call
        if call is None:
            return False
        self.call = None
        while True:  # an interrupt landing here is consumed and the withdrawal retried
            try:
                with _lock:  # once unregistered under the lock, the watchdog raises nothing more here
                    _calls.pop(id(call), None)
                    if call.fired:
                        _raise_in(call.tid, None)  # withdraw one not raised yet
                break
            except _Interrupt:
                continue
        if exc_type is not None and issubclass(exc_type, _Interrupt):
            raise LibraryTimeout(f"{self.what} did not return within {self.seconds:g} s and was interrupted (an "
                                 "endless loop in the library?)") from None
        return False
