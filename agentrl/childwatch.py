"""Child processes of asyncio watched by a pidfd on the loop that started them, not by a thread each.

On Python 3.11 asyncio's default child watcher (``ThreadedChildWatcher``) starts one thread per subprocess, blocked
in ``waitpid``; ``Thread.start`` waits for the new thread to run, which under a busy GIL stalls the event loop ~1 ms
per subprocess. A sandbox fleet starts one bwrap per command (thousands a minute): measured on 512 bwrap sandboxes
stepping nearly free commands, 1.51-1.55 ms of the driver's CPU per step with the threads, 1.33-1.38 ms without
(BENCHMARKS.md, "Sandbox fleet"). Python 3.12 watches children with a pidfd by default where the kernel has one;
:func:`install` does the same on 3.11.

Why not 3.11's own ``PidfdChildWatcher``: it serves the one loop it is attached to (the main thread's), so a
subprocess started by a loop in another thread would be registered on the wrong loop. :class:`LoopPidfdWatcher` is
the loop-agnostic form 3.12 adopted: each child's pidfd is read by the loop running when it was started.

Invariant: :func:`install` replaces only asyncio's default watcher (none yet, or the threaded one); a watcher a user
set stays. Children already watched by threads keep their threads.
"""

from __future__ import annotations

import asyncio
import os
import sys
import threading
from typing import Any, Callable

_done = False
_lock = threading.Lock()


class LoopPidfdWatcher(asyncio.AbstractChildWatcher):
    """Each child's exit is read from its pidfd by the event loop that started it (see the module docstring)."""

    def add_child_handler(self, pid: int, callback: Callable[..., Any], *args: Any) -> None:
        loop = asyncio.get_running_loop()
        pidfd = os.pidfd_open(pid)
        loop._add_reader(pidfd, self._reap, loop, pid, pidfd, callback, args)  # type: ignore[attr-defined]

    @staticmethod
    def _reap(loop: asyncio.AbstractEventLoop, pid: int, pidfd: int, callback: Callable[..., Any],
              args: tuple) -> None:
        loop._remove_reader(pidfd)  # type: ignore[attr-defined]
        try:
            _, status = os.waitpid(pid, 0)
            code = os.waitstatus_to_exitcode(status)
        except ChildProcessError:  # reaped by someone else's waitpid: asyncio's own convention for that case
            code = 255
        finally:
            os.close(pidfd)
        callback(pid, code, *args)

    def remove_child_handler(self, pid: int) -> bool:
        return True  # the pidfd's reader ends with the child; asyncio calls this only for its own bookkeeping

    def attach_loop(self, loop: asyncio.AbstractEventLoop | None) -> None:
        pass  # every child's loop is the one running when it started

    def is_active(self) -> bool:
        return True

    def close(self) -> None:
        pass

    def __enter__(self) -> "LoopPidfdWatcher":
        return self

    def __exit__(self, *exc: Any) -> None:
        pass


def _pidfd_works() -> bool:
    try:
        os.close(os.pidfd_open(os.getpid()))
        return True
    except (AttributeError, OSError):  # not Linux, or a kernel before 5.3
        return False


def install() -> bool:
    """Makes asyncio watch child processes by pidfd (see the module docstring); cheap after the first call. Returns
    whether the process's watcher is now a pidfd one (False: Python 3.12+, which does this itself; no pidfd; a
    custom loop policy or watcher)."""
    global _done
    if _done or sys.version_info >= (3, 12):
        return _done
    with _lock:
        if _done:
            return True
        policy = asyncio.get_event_loop_policy()
        if type(policy) is not asyncio.DefaultEventLoopPolicy or not _pidfd_works():
            return False
        current = getattr(policy, "_watcher", None)  # read without get_child_watcher(), which would make one
        if isinstance(current, LoopPidfdWatcher):
            _done = True
        elif current is None or type(current) is asyncio.ThreadedChildWatcher:
            # set_child_watcher closes the old watcher: for the threaded one that leaves its running threads alone
            policy.set_child_watcher(LoopPidfdWatcher())
            _done = True
        return _done
