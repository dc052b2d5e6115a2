"""A time bound on an in-process library call: what keeps one endless loop in a bridged library (a TextArena game
stepped in a state it never meant to reach) from holding the bridges' one lock (:mod:`.rng`) forever, which would
stall every other bridged env of the process.

Flow: ``with bounded(seconds, what):`` runs its body on the calling thread while a watchdog thread waits. Past the
deadline the watchdog raises an interrupt in the calling thread (CPython's ``PyThreadState_SetAsyncExc``), again
every half second while the body has not ended (a library's ``except Exception`` may swallow one; the interrupt is
a ``BaseException`` so that few do). The body ends with :class:`LibraryTimeout` naming ``what`` and the bound.

Invariants: a body that ends in time is never interrupted, also when the deadline passes while it returns (a pending
interrupt is withdrawn, or consumed, before ``bounded`` exits). The interrupt lands between Python bytecodes: a
single C call that never returns (a catastrophic regular expression) is not stopped by it.
"""

from __future__ import annotations

import ctypes
import threading
from contextlib import contextmanager
from typing import Iterator

REPEAT_S = 0.5


class LibraryTimeout(TimeoutError):
    """A bridged library's call did not return within its bound and was interrupted; its env's state is lost."""


class _Interrupt(BaseException):
    """What the watchdog raises in the stuck thread (never seen outside :func:`bounded`)."""


def _raise_in(tid: int, exc: type[BaseException] | None) -> None:
    ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(tid), ctypes.py_object(exc) if exc else None)


@contextmanager
def bounded(seconds: float | None, what: str) -> Iterator[None]:
    """Interrupts the body with :class:`LibraryTimeout` once it has run ``seconds`` (None or 0: unbounded)."""
    if not seconds:
        yield
        return
    tid, guard, stop = threading.get_ident(), threading.Lock(), threading.Event()
    state = {"done": False, "fired": False}

    def watch() -> None:
        wait = seconds
        while not stop.wait(wait):
            with guard:
                if state["done"]:
                    return
                state["fired"] = True
                _raise_in(tid, _Interrupt)
            wait = REPEAT_S

    watchdog = threading.Thread(target=watch, name="agentrl-deadline", daemon=True)
    interrupted = False
    try:
        try:
            watchdog.start()  # inside: a bound shorter than the thread's start can fire while start() waits
            yield
        finally:
            while True:  # an interrupt landing here is consumed and the withdrawal retried
                try:
                    with guard:  # once done is set under the guard, the watchdog raises nothing more
                        state["done"] = True
                        if state["fired"]:
                            _raise_in(tid, None)  # withdraw one not raised yet
                    break
                except _Interrupt:
                    continue
            stop.set()
    except _Interrupt:
        interrupted = True
    if interrupted:
        raise LibraryTimeout(f"{what} did not return within {seconds:g} s and was interrupted (an endless loop in "
                             f"the library?)")
