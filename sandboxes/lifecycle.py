"""The process-wide side of the sandboxes: this process's run id (a label on everything it creates, for sweeps),
the registry of live sandboxes that normal exit and SIGTERM stop at once, the host directory of bwrap state, and
the thread pool that blocking engine calls run in.
"""

from __future__ import annotations

import asyncio
import atexit
import functools
import os
import secrets
import signal
import socket
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

if TYPE_CHECKING:
    from .base import Sandbox

# Labels every sandbox carries (docker labels; bwrap's meta file), read by the sweep of what crashed drivers left.
LABEL_RUN = "agentrl.run"
LABEL_SANDBOX = "agentrl.sandbox"
LABEL_EXPIRES = "agentrl.expires"
LABEL_DRIVER = "agentrl.driver"  # "<hostname>:<pid>" of the process that created it


def default_run_id() -> str:
    """``$AGENTRL_RUN_ID`` or a fresh ``<host>-<pid>-<rand>`` id; all sandboxes of this process carry it."""
    return os.environ.get("AGENTRL_RUN_ID") or f"{socket.gethostname()[:20]}-{os.getpid()}-{secrets.token_hex(3)}"


_RUN_ID: str | None = None


def run_id() -> str:
    global _RUN_ID
    if _RUN_ID is None:
        _RUN_ID = default_run_id()
    return _RUN_ID


def driver_tag() -> str:
    return f"{socket.gethostname()}:{os.getpid()}"


# Per-process registry: normal exit and SIGTERM stop every live sandbox at once. --------------------------------
# Strong references: a started sandbox is a resource until stopped, even when its owner dropped it.
_LIVE: "set[Sandbox]" = set()
_HOOKS_LOCK = threading.Lock()
_EXIT_HOOKED = False
_SIGTERM_HOOKED = False


def cleanup_all() -> int:
    """Stop every sandbox this process still holds (blocking). Returns how many were stopped."""
    n = 0
    for sb in list(_LIVE):  # stop_sync unregisters
        try:
            sb.stop_sync()
            n += 1
        except Exception:  # cleanup must go on for the others
            pass
    return n


def _on_sigterm(prev: Any):
    def handler(signum: int, frame: Any) -> None:
        cleanup_all()
        if callable(prev):
            prev(signum, frame)
        elif prev == signal.SIG_IGN:
            return
        else:
            signal.signal(signum, signal.SIG_DFL)
            os.kill(os.getpid(), signum)

    return handler


def register_live(sb: Sandbox) -> None:
    """Track ``sb`` for exit/SIGTERM cleanup."""
    _LIVE.add(sb)
    install_exit_hooks()


def install_exit_hooks() -> None:
    """Install, once each, the exit and SIGTERM hooks that stop this process's sandboxes. Backends call it from
    ``start()`` on the event loop's thread. The SIGTERM handler can only be set from the main thread; it chains any
    handler already there, else re-raises the default action, so the process still terminates."""
    global _EXIT_HOOKED, _SIGTERM_HOOKED
    with _HOOKS_LOCK:
        if not _EXIT_HOOKED:
            _EXIT_HOOKED = True
            atexit.register(cleanup_all)
            # Interpreter exit joins executor threads before atexit handlers run, and a thread blocked in a docker
            # exec would hold the exit up until its command ends: stopping the sandboxes first ends those execs.
            register_threading_atexit = getattr(threading, "_register_atexit", None)
            if register_threading_atexit is not None:
                try:
                    register_threading_atexit(cleanup_all)
                except RuntimeError:
                    pass
        if not _SIGTERM_HOOKED and threading.current_thread() is threading.main_thread():
            _SIGTERM_HOOKED = True
            try:
                prev = signal.getsignal(signal.SIGTERM)
                signal.signal(signal.SIGTERM, _on_sigterm(prev))
            except (ValueError, OSError):
                pass


def unregister_live(sb: Sandbox) -> None:
    _LIVE.discard(sb)


def state_root() -> Path:
    """Host directory for bwrap sandboxes' work dirs: ``$AGENTRL_SANDBOX_STATE`` or ``/tmp/agentrl-sandboxes``."""
    return Path(os.environ.get("AGENTRL_SANDBOX_STATE", "/tmp/agentrl-sandboxes"))


def make_under_run_dir(make: Callable[[], None], attempts: int = 5) -> None:
    """Runs ``make``, which makes a run's dir (a state dir's, a cgroup's) and a sandbox's dir under it, again when
    it raises FileNotFoundError: a run's dir is removed whenever it is empty (by the release of the run's last
    sandbox or by a sweep, in other threads or processes), which can fall between the two."""
    for attempt in range(attempts):
        try:
            return make()
        except FileNotFoundError:
            if attempt == attempts - 1:
                raise


_EXECUTOR: ThreadPoolExecutor | None = None


async def to_thread(fn, *args, **kwargs):
    """Run a blocking engine call off the event loop, in a dedicated pool: asyncio's default pool has only
    cpu+4 threads, and a long exec holds a thread for its whole duration (``$AGENTRL_SANDBOX_THREADS``, 256)."""
    global _EXECUTOR
    if _EXECUTOR is None:
        _EXECUTOR = ThreadPoolExecutor(
            max_workers=int(os.environ.get("AGENTRL_SANDBOX_THREADS", "256")), thread_name_prefix="agentrl-sandbox"
        )
    return await asyncio.get_running_loop().run_in_executor(_EXECUTOR, functools.partial(fn, *args, **kwargs))
