"""Naming the cause when a sandbox fails an episode, so that the env manager can count it and retry the episode in
a fresh sandbox (``failures/<cause>``, :data:`~.base.SANDBOX_FAILURE_CAUSES`).

An env that runs its steps in a sandbox calls :func:`check_limits` on each command's result (a command that hit
the sandbox's memory or disk limit is the sandbox's failure, not the step's outcome) and passes every
:class:`~.base.SandboxError` it catches through :func:`infra_error` before re-raising it. What cannot be named at
the raise site is found out here: a docker sandbox whose engine no longer answers lost it to the engine
(``sandbox_engine``: a daemon restart or crash); any other dead sandbox was lost (``sandbox_lost``). A refusal by
the host guard (:class:`~.guards.HostCapacityError`) and a read over its own ``max_bytes``
(:class:`~.base.FileTooLarge`) are not infrastructure failures: a fresh sandbox would meet them again.

A sandbox pool's creation that fails while its engine does not answer waits for the engine (:func:`engine_back`,
bounded, one watcher per backend however many wait) instead of spending its retries on a daemon that restarts.
"""

from __future__ import annotations

import asyncio
import time

from .base import ExecResult, FileTooLarge, SandboxError, to_thread
from .guards import HostCapacityError


def check_limits(res: ExecResult, sandbox_id: str = "") -> ExecResult:
    """Returns ``res``; raises SandboxError (``sandbox_oom`` / ``sandbox_disk``) when the command hit the sandbox's
    memory or disk limit."""
    if res.oom_killed:
        raise SandboxError("a command hit the sandbox's memory limit (OOM kill)", sandbox_id=sandbox_id,
                           cause="sandbox_oom")
    if res.disk_full:
        raise SandboxError("a command filled the sandbox's work dir or /tmp (disk limit)", sandbox_id=sandbox_id,
                           cause="sandbox_disk")
    return res


# One watcher per backend polls an engine that does not answer, however many creations wait for it (a daemon
# restart under a fleet of 1,024 would otherwise be pinged 1,024 times a second).
_WATCHERS: dict[str, asyncio.Task] = {}


def _watcher(backend: str) -> asyncio.Task | None:
    """The backend's watcher still polling on this event loop (one left by a loop closed under it does not count)."""
    w = _WATCHERS.get(backend)
    return w if w is not None and not w.done() and w.get_loop() is asyncio.get_running_loop() else None


async def engine_down(backend: str) -> bool:
    """Whether ``backend``'s engine does not answer now (docker: its daemon; bwrap has no engine). While a watcher
    polls it (:func:`engine_back`), it is down without asking."""
    if backend != "docker":
        return False
    if _watcher(backend) is not None:
        return True
    from .docker_engine import engine_answers

    return not await to_thread(engine_answers)


async def _until_up(backend: str, deadline: float, poll_s: float) -> bool:
    from .docker_engine import engine_answers

    while not await to_thread(engine_answers):
        left = deadline - time.monotonic()
        if left <= 0:
            return False
        await asyncio.sleep(min(poll_s, left))
    return True


async def engine_back(backend: str, deadline: float, poll_s: float = 1.0) -> bool:
    """Waits until ``backend``'s engine answers again or ``time.monotonic()`` passes ``deadline``; whether it
    answers. The waiters share one watcher, which ends with the deadline of the waiter that started it (a later
    waiter then starts the next)."""
    if backend != "docker":
        return True
    while (left := deadline - time.monotonic()) > 0:
        watcher = _watcher(backend)
        if watcher is None:
            watcher = _WATCHERS[backend] = asyncio.ensure_future(_until_up(backend, deadline, poll_s))
        try:
            if await asyncio.wait_for(asyncio.shield(watcher), left):
                return True
        except asyncio.TimeoutError:
            return False
        # that watcher gave up at its own, earlier deadline: watch again until this one's
    return False


async def infra_error(err: SandboxError, backend: str) -> SandboxError:
    """``err`` with its ``failure_cause`` set when it is an infrastructure failure (left None otherwise, see the
    module docstring); ``backend`` is the failed sandbox's ("docker" asks whether its engine still answers)."""
    if err.failure_cause is not None or isinstance(err, (HostCapacityError, FileTooLarge)):
        return err
    err.failure_cause = "sandbox_engine" if await engine_down(backend) else "sandbox_lost"
    return err
