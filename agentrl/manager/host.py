"""The env host: where environments live while the driver's episode tasks drive them.

An :class:`EnvHost` owns many env instances on one asyncio event loop, keyed by a *handle* the driver chooses (the
trajectory id). It creates an env on ``open`` (``agentrl.make``, or a ``"package.module:Class"`` entry point),
resets it, steps it and closes it. Every env call runs as its own task so that ``close`` can cancel a step that is
still in flight (a hung env), and every call has a timeout. The host never raises for an env's fault: it returns a
reply ``("ok", value)`` or ``("err", kind, message, traceback)`` with ``kind`` one of :data:`FAILURE_KINDS`.
Results are validated here (tuple shape, reward a finite real number, observation messages, info a dict) so that
garbage never reaches the driver.

Sync-only envs run in the thread pool of :func:`agentrl.core.run_sync` (:mod:`agentrl.syncpool`) inside the host's
process: a timed-out sync call cannot be killed (Python threads cannot be), so it is abandoned on its daemon thread,
which neither holds a pool slot nor blocks process exit. Where a host runs, and how the driver reaches it, is
:mod:`agentrl.manager.workers`.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib
import math
import numbers
import os
import resource
import time
import traceback
from typing import Any, Iterator

import numpy as np

from agentrl.core import Message, MessagesSpace, as_messages, run_sync
from agentrl.sandboxes.base import SANDBOX_FAILURE_CAUSES

INFRA_CAUSES = SANDBOX_FAILURE_CAUSES
"""Infrastructure failures an env names by raising an exception whose ``failure_cause`` is one of these (a
:class:`~agentrl.sandboxes.SandboxError` named by :func:`~agentrl.sandboxes.infra_error`): the env lost its sandbox
(killed from outside, its engine gone, its memory or disk limit hit). The reply's kind is the cause itself."""

FAILURE_KINDS = ("make", "exception", "timeout", "protocol", "cancelled") + INFRA_CAUSES
"""``make``: the env could not be created; ``exception``: reset/step raised; ``timeout``: a call exceeded its
timeout; ``protocol``: the env returned something that breaks the gymnasium contract; ``cancelled``: the call was
cancelled because the env was closed; one of :data:`INFRA_CAUSES`: reset/step raised an infrastructure failure."""

Reply = tuple  # ("ok", value) | ("err", kind, message, traceback_text)

_MESSAGES = MessagesSpace()


class EnvFailure(Exception):
    """An env call failed in its host. ``kind`` is one of :data:`FAILURE_KINDS`; ``traceback_text`` is the env's
    traceback summary (may be empty)."""

    def __init__(self, kind: str, message: str, traceback_text: str = ""):
        super().__init__(kind, message, traceback_text)
        self.kind, self.message, self.traceback_text = kind, message, traceback_text

    def __str__(self) -> str:
        return f"env {self.kind}: {self.message}"


class WorkerDied(Exception):
    """The worker hosting an env died; the call's outcome is unknown and its env is gone."""

    def __init__(self, worker: str, cause: str):
        super().__init__(worker, cause)
        self.worker, self.cause = worker, cause

    def __str__(self) -> str:
        return f"env worker {self.worker} died: {self.cause}"


class ProtocolError(ValueError):
    """An env's reset/step returned a value that breaks the contract (the message names the bad part)."""


def _tb_summary(e: BaseException, limit: int = 8) -> str:
    return "".join(traceback.format_exception(type(e), e, e.__traceback__, limit=-limit)).strip()


def make_env(env_id: str, env_kwargs: dict[str, Any]) -> Any:
    """Returns a new env: ``env_id`` registered with agentrl/gymnasium, or a ``"package.module:Class"`` entry
    point called with ``env_kwargs``."""
    import gymnasium

    from agentrl.registration import load_entry_point, make

    if env_id in gymnasium.registry:
        return make(env_id, **env_kwargs)
    module, sep, attr = env_id.partition(":")
    if sep and module and attr and "/" not in module:
        return load_entry_point(env_id)(**env_kwargs)
    return make(env_id, **env_kwargs)  # raises RegistrationError with close-match hints


def check_messages(obs: Any, where: str) -> list[Message]:
    """Returns ``obs`` as a list of chat messages; raises :class:`ProtocolError` naming ``where`` otherwise."""
    if not _MESSAGES.contains(obs):
        raise ProtocolError(
            f"{where}: observation must be a str or a list of {{'role', 'content': str}} messages, got {type(obs).__name__} {str(obs)[:120]!r}"
        )
    return [dict(m) for m in as_messages(obs)]


def check_reset(result: Any) -> tuple[list[Message], dict[str, Any]]:
    """Validates ``reset``'s ``(obs, info)``; returns ``(messages, info)`` or raises :class:`ProtocolError`."""
    if not isinstance(result, tuple) or len(result) != 2:
        raise ProtocolError(f"reset must return (obs, info), got {type(result).__name__} {str(result)[:120]!r}")
    obs, info = result
    if info is None:
        info = {}
    if not isinstance(info, dict):
        raise ProtocolError(f"reset: info must be a dict, got {type(info).__name__}")
    return check_messages(obs, "reset"), info


def check_step(result: Any) -> tuple[list[Message], float, bool, bool, dict[str, Any]]:
    """Validates ``step``'s ``(obs, reward, terminated, truncated, info)``; returns it normalised (messages, float,
    bool, bool, dict) or raises :class:`ProtocolError` naming the bad element."""
    if not isinstance(result, tuple) or len(result) != 5:
        n = len(result) if isinstance(result, (tuple, list)) else "?"
        raise ProtocolError(
            f"step must return a 5-tuple (obs, reward, terminated, truncated, info), got {type(result).__name__} of length {n}"
        )
    obs, reward, terminated, truncated, info = result
    if isinstance(reward, (bool, np.bool_)) or not isinstance(reward, numbers.Real):
        raise ProtocolError(f"step: reward must be a real number, got {type(reward).__name__} {str(reward)[:60]!r}")
    reward = float(reward)
    if not math.isfinite(reward):
        raise ProtocolError(f"step: reward must be finite, got {reward}")
    for name, flag in (("terminated", terminated), ("truncated", truncated)):
        if not isinstance(flag, (bool, np.bool_)):
            raise ProtocolError(f"step: {name} must be a bool, got {type(flag).__name__} {str(flag)[:60]!r}")
    if info is None:
        info = {}
    if not isinstance(info, dict):
        raise ProtocolError(f"step: info must be a dict, got {type(info).__name__}")
    return check_messages(obs, "step"), reward, bool(terminated), bool(truncated), info


class EnvExit(RuntimeError):
    """An env called ``sys.exit`` (a text game's "quit", a script's way out): a failed call of that env. Left as
    SystemExit, asyncio re-raises it out of the event loop and the whole worker (or driver) ends."""


@contextlib.contextmanager
def _no_exit() -> Iterator[None]:
    try:
        yield
    except SystemExit as e:
        raise EnvExit(f"the env called sys.exit({e.code!r}); an env may end its episode, not the process") from None


async def _areset(env: Any, seed: int | None, options: dict[str, Any] | None) -> Any:
    with _no_exit():
        if hasattr(env, "areset"):
            return await env.areset(seed=seed, options=options)
        return await run_sync(env.reset, seed=seed, options=options)


async def _astep(env: Any, action: str) -> Any:
    with _no_exit():
        if hasattr(env, "astep"):
            return await env.astep(action)
        return await run_sync(env.step, action)


async def _aclose(env: Any) -> None:
    with _no_exit():
        if hasattr(env, "aclose"):
            await env.aclose()
        else:
            await run_sync(env.close)


def _rss_bytes() -> int:
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except OSError:
        return 0


class EnvHost:
    """Hosts many envs on the current event loop. Methods return replies, never raise for env faults.

    Invariants: at most one call per handle is in flight (the driver's episode is sequential); after ``close``
    the handle holds nothing, its in-flight call (if any) has been cancelled and ``aclose`` has been awaited.
    A ``close`` that arrives before its ``open`` leaves a tombstone so the late ``open`` is refused.
    """

    _MAX_TOMBSTONES = 65536

    def __init__(self, name: str = "local", imports: list[str] | tuple[str, ...] = (), call_mode: str = "child"):
        self.name = name
        # How env calls run: "child" (a child task per call, which close() can cancel: any caller), "own" (each
        # call already runs in a task of its own: the Ray actor), "inline" (in the caller's task: the local
        # worker, where cancelling the episode cancels the call).
        if call_mode not in ("child", "own", "inline"):
            raise ValueError(f"call_mode must be 'child', 'own' or 'inline', got {call_mode!r}")
        self.call_mode = call_mode
        for mod in imports:
            importlib.import_module(mod)  # registers envs in this process
        self._envs: dict[str, Any] = {}
        self._inflight: dict[str, asyncio.Future] = {}
        self._tombstones: dict[str, None] = {}
        self.counts = {"opened": 0, "closed": 0, "close_errors": 0, "steps": 0, "cancelled_calls": 0, "errors": 0}
        self._env_time = 0.0

    def _err(self, kind: str, message: str, tb: str = "") -> Reply:
        self.counts["errors"] += 1
        return ("err", kind, message, tb)

    def _raised(self, e: Exception, what: str) -> Reply:
        cause = getattr(e, "failure_cause", None)
        return self._err(cause if cause in INFRA_CAUSES else "exception", f"{what} raised {e!r}", _tb_summary(e))

    async def _call(self, handle: str, coro: Any, timeout: float | None, what: str) -> Reply:
        if self.call_mode != "child" and hasattr(asyncio, "timeout"):
            return await self._call_in_own_task(handle, coro, timeout, what)
        task = asyncio.ensure_future(coro)
        self._inflight[handle] = task
        t0 = time.perf_counter()
        try:
            return ("ok", await asyncio.wait_for(task, timeout))
        except asyncio.TimeoutError:
            return self._err("timeout", f"{what} did not return within {timeout:.3g} s")
        except asyncio.CancelledError:
            cur = asyncio.current_task()
            if task.cancelled() and (cur is None or getattr(cur, "cancelling", lambda: 0)() == 0):
                return self._err("cancelled", f"{what} was cancelled because the env was closed")
            raise
        except Exception as e:
            return self._raised(e, what)
        finally:
            self._env_time += time.perf_counter() - t0
            if self._inflight.get(handle) is task:
                del self._inflight[handle]

    async def _call_in_own_task(self, handle: str, coro: Any, timeout: float | None, what: str) -> Reply:
        # "own": the caller's task exists for this call alone (a Ray request), so close() may cancel it directly.
        # "inline": the caller is the episode task itself (local worker); cancelling the episode cancels the env
        # call, so nothing is registered and the cancellation propagates. Either way: no extra task per call.
        own = self.call_mode == "own"
        task = asyncio.current_task()
        if own:
            self._inflight[handle] = task  # type: ignore[assignment]
        t0 = time.perf_counter()
        try:
            async with asyncio.timeout(timeout):
                return ("ok", await coro)
        except TimeoutError:
            return self._err("timeout", f"{what} did not return within {timeout:.3g} s")
        except asyncio.CancelledError:
            if not own:
                raise
            return self._err("cancelled", f"{what} was cancelled because the env was closed")
        except Exception as e:
            return self._raised(e, what)
        finally:
            self._env_time += time.perf_counter() - t0
            if own and self._inflight.get(handle) is task:
                del self._inflight[handle]

    async def open(
        self,
        handle: str,
        env_id: str,
        env_kwargs: dict[str, Any],
        seed: int | None,
        options: dict[str, Any] | None,
        timeout: float | None,
    ) -> Reply:
        """Creates and resets an env under ``handle``; replies ``("ok", (messages, info))``."""
        if handle in self._tombstones:
            del self._tombstones[handle]
            return self._err("cancelled", f"env {handle} was closed before it was opened")
        if handle in self._envs:
            return self._err("protocol", f"handle {handle!r} is already open on worker {self.name}")
        try:
            with _no_exit():
                env = make_env(env_id, dict(env_kwargs))
        except Exception as e:
            return self._err("make", f"cannot make env {env_id!r}: {e!r}", _tb_summary(e))
        self._envs[handle] = env
        self.counts["opened"] += 1
        reply = await self._call(handle, _areset(env, seed, options), timeout, f"reset of {env_id}")
        if reply[0] != "ok":
            return reply
        try:
            return ("ok", check_reset(reply[1]))
        except ProtocolError as e:
            return self._err("protocol", str(e))

    async def step(self, handle: str, action: str, timeout: float | None) -> Reply:
        """Steps the env under ``handle``; replies ``("ok", (messages, reward, terminated, truncated, info))``."""
        env = self._envs.get(handle)
        if env is None:
            return self._err("protocol", f"no env open under handle {handle!r} on worker {self.name}")
        self.counts["steps"] += 1
        reply = await self._call(handle, _astep(env, action), timeout, "step")
        if reply[0] != "ok":
            return reply
        try:
            return ("ok", check_step(reply[1]))
        except ProtocolError as e:
            return self._err("protocol", str(e))

    async def close(self, handle: str, timeout: float | None) -> Reply:
        """Cancels the handle's in-flight call, awaits the env's ``aclose`` and forgets it; replies ``("ok", None)``."""
        task = self._inflight.pop(handle, None)
        if task is not None and not task.done():
            task.cancel()
            self.counts["cancelled_calls"] += 1
            # Let the cancelled call unwind before aclose; a sync call in a thread cannot be waited for.
            await asyncio.wait([task], timeout=min(timeout or 5.0, 5.0))
        env = self._envs.pop(handle, None)
        if env is None:
            self._tombstones[handle] = None
            if len(self._tombstones) > self._MAX_TOMBSTONES:
                del self._tombstones[next(iter(self._tombstones))]
            return ("ok", None)
        try:
            await asyncio.wait_for(_aclose(env), timeout)
            self.counts["closed"] += 1
            return ("ok", None)
        except Exception as e:
            self.counts["close_errors"] += 1
            return self._err("exception", f"aclose raised {e!r}", _tb_summary(e))

    def stats(self) -> dict[str, Any]:
        """Returns counters: opened, closed, close_errors, steps, cancelled_calls, errors, plus live (envs held),
        inflight (calls running), rss_bytes, cpu_s (process CPU time) and env_s (time inside env calls)."""
        ru = resource.getrusage(resource.RUSAGE_SELF)
        return {
            **self.counts,
            "name": self.name,
            "live": len(self._envs),
            "inflight": len(self._inflight),
            "rss_bytes": _rss_bytes(),
            "cpu_s": ru.ru_utime + ru.ru_stime,
            "env_s": self._env_time,
        }

    async def close_all(self, timeout: float | None) -> None:
        await asyncio.gather(*(self.close(h, timeout) for h in list(self._envs)), return_exceptions=True)


def _unwrap(reply: Reply) -> Any:
    if reply[0] == "ok":
        return reply[1]
    _, kind, message, tb = reply
    raise EnvFailure(kind, message, tb)
