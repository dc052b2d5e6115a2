"""Env workers: where environments live while the driver's episode tasks drive them.

An :class:`EnvHost` owns many env instances on one asyncio event loop, keyed by a *handle* the driver chooses (the
trajectory id). It creates an env on ``open`` (``agentrl.make``, or a ``"package.module:Class"`` entry point),
resets it, steps it and closes it. Every env call runs as its own task so that ``close`` can cancel a step that is
still in flight (a hung env), and every call has a timeout. The host never raises for an env's fault: it returns a
reply ``("ok", value)`` or ``("err", kind, message, traceback)`` with ``kind`` one of :data:`FAILURE_KINDS`.
Results are validated here (tuple shape, reward a finite real number, observation messages, info a dict) so that
garbage never reaches the driver.

The driver talks to hosts through one interface, :class:`EnvWorker`:

- :class:`LocalWorker` hosts the envs in the driver's own process and loop (tests, single-process runs).
- :class:`RayWorker` hosts them in a Ray async actor (:class:`_RayHostActor`). Calls are multiplexed: the requests
  made during one loop iteration go to the actor as one ``submit`` call, and the actor streams replies back through
  one long-poll ``poll`` call, so thousands of concurrent env steps cost a few Ray calls per loop iteration instead
  of one each (measured here: about 4.5× the step rate of one Ray call per step at 4,096 concurrent envs).
  Replies come back as soon as each env call finishes: nothing waits for a batch.

A worker that dies (``ray.exceptions.RayActorError``) fails every call in flight with :class:`WorkerDied`; the
manager reschedules those episodes on live workers. A worker that stops answering without dying (an env blocking
its event loop, a stopped process) is treated the same way: a heartbeat (``health`` every
``heartbeat_interval_s``) that gets no reply within ``heartbeat_timeout_s`` kills the actor and fails its calls
with :class:`WorkerDied`, as does a worker whose sync pool holds too many hung calls.

Sync-only envs run in the thread pool of :func:`agentrl.core.run_sync` (:mod:`agentrl.syncpool`) inside the host's
process: a timed-out sync call cannot be killed (Python threads cannot be), so it is abandoned on its daemon thread,
which neither holds a pool slot nor blocks process exit.
"""

from __future__ import annotations

import abc
import asyncio
import importlib
import itertools
import math
import numbers
import os
import resource
import time
import traceback
from typing import Any, Callable

import numpy as np

from agentrl.core import Message, MessagesSpace, as_messages, run_sync, set_sync_env_threads, sync_pool_stats

FAILURE_KINDS = ("make", "exception", "timeout", "protocol", "cancelled")
"""``make``: the env could not be created; ``exception``: reset/step raised; ``timeout``: a call exceeded its
timeout; ``protocol``: the env returned something that breaks the gymnasium contract; ``cancelled``: the call was
cancelled because the env was closed."""

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

    import agentrl

    if env_id in gymnasium.registry:
        return agentrl.make(env_id, **env_kwargs)
    if ":" in env_id:
        module, _, attr = env_id.partition(":")
        if module and attr and "/" not in module:
            return getattr(importlib.import_module(module), attr)(**env_kwargs)
    return agentrl.make(env_id, **env_kwargs)  # raises RegistrationError with close-match hints


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


async def _areset(env: Any, seed: int | None, options: dict[str, Any] | None) -> Any:
    if hasattr(env, "areset"):
        return await env.areset(seed=seed, options=options)
    return await run_sync(env.reset, seed=seed, options=options)


async def _astep(env: Any, action: str) -> Any:
    if hasattr(env, "astep"):
        return await env.astep(action)
    return await run_sync(env.step, action)


async def _aclose(env: Any) -> None:
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
            return self._err("exception", f"{what} raised {e!r}", _tb_summary(e))
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
            return self._err("exception", f"{what} raised {e!r}", _tb_summary(e))
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


class EnvWorker(abc.ABC):
    """The driver's view of one env host. ``load`` is maintained by the manager (episodes placed here)."""

    name: str
    alive: bool = True
    load: int = 0
    on_death: Callable[["EnvWorker", str], None] | None = None

    async def start(self) -> None:
        """Starts the host (a no-op for local workers)."""

    async def open(self, handle: str, env_id: str, env_kwargs: dict[str, Any], seed: int | None,
                   options: dict[str, Any] | None, timeout: float | None) -> tuple[list[Message], dict[str, Any]]:
        """Creates and resets an env; returns ``(opening messages, info)``. Raises EnvFailure / WorkerDied."""
        return _unwrap(await self._request("open", (handle, env_id, env_kwargs, seed, options, timeout), timeout))

    async def step(self, handle: str, action: str, timeout: float | None) -> tuple[list[Message], float, bool, bool, dict[str, Any]]:
        """Steps an env; returns ``(messages, reward, terminated, truncated, info)``. Raises EnvFailure / WorkerDied."""
        return _unwrap(await self._request("step", (handle, action, timeout), timeout))

    async def close(self, handle: str, timeout: float | None) -> None:
        """Closes an env (cancelling its in-flight call). Raises EnvFailure / WorkerDied."""
        _unwrap(await self._request("close", (handle, timeout), timeout))

    @abc.abstractmethod
    async def _request(self, op: str, args: tuple, timeout: float | None) -> Reply: ...

    @abc.abstractmethod
    async def stats(self) -> dict[str, Any]:
        """Returns the host's :meth:`EnvHost.stats`."""

    @abc.abstractmethod
    async def shutdown(self) -> None:
        """Closes every env and stops the host."""


class LocalWorker(EnvWorker):
    """Hosts envs in the driver's process and event loop."""

    def __init__(self, name: str = "local", imports: list[str] | tuple[str, ...] = ()):
        self.name = name
        self.host = EnvHost(name, imports, call_mode="inline")

    async def _request(self, op: str, args: tuple, timeout: float | None) -> Reply:
        return await getattr(self.host, op)(*args)

    async def stats(self) -> dict[str, Any]:
        return self.host.stats()

    async def shutdown(self) -> None:
        await self.host.close_all(5.0)
        self.alive = False


class _RayHostActor:
    """The Ray actor around an :class:`EnvHost`: ``submit`` starts a batch of requests, ``poll`` returns the
    replies finished since the last poll (waiting for at least one)."""

    def __init__(self, name: str, imports: list[str], sync_threads: int):
        set_sync_env_threads(sync_threads)
        self.host = EnvHost(name, imports, call_mode="own")
        self._done: list[tuple[int, Reply]] = []
        self._ready: asyncio.Event | None = None
        self._tasks: set[asyncio.Task] = set()

    def _event(self) -> asyncio.Event:
        if self._ready is None:
            self._ready = asyncio.Event()
        return self._ready

    async def ping(self) -> str:
        return self.host.name

    async def pid(self) -> int:
        return os.getpid()

    async def health(self) -> dict[str, int]:
        """Answered on the event loop: no answer means the loop is blocked (or the process stopped)."""
        return sync_pool_stats()

    async def submit(self, batch: list[tuple[int, str, tuple]]) -> None:
        for rid, op, args in batch:
            t = asyncio.ensure_future(self._run(rid, op, args))
            self._tasks.add(t)
            t.add_done_callback(self._tasks.discard)

    async def _run(self, rid: int, op: str, args: tuple) -> None:
        try:
            reply = await getattr(self.host, op)(*args)
        except BaseException as e:  # a host bug must still answer the driver
            reply = ("err", "exception", f"worker {op} failed: {e!r}", _tb_summary(e))
        self._done.append((rid, reply))
        self._event().set()

    async def poll(self, window_s: float = 0.0) -> list[tuple[int, Reply]]:
        ev = self._event()
        await ev.wait()
        if window_s > 0:  # gather the replies that finish within the window into this one return
            await asyncio.sleep(window_s)
        out, self._done = self._done, []
        ev.clear()
        return out

    async def stats(self) -> dict[str, Any]:
        return self.host.stats()

    async def close_all(self, timeout: float) -> None:
        await self.host.close_all(timeout)


class RayWorker(EnvWorker):
    """Hosts envs in a Ray async actor; requests are multiplexed (see the module docstring).

    ``heartbeat_interval_s`` / ``heartbeat_timeout_s`` (class defaults 5 s / 60 s, or constructor arguments): how
    often the driver asks the actor for ``health``, and how long it waits for the answer before it declares the
    worker stuck, kills it and fails its calls with :class:`WorkerDied`. ``death_cause`` says why a worker died.
    """

    _ids = itertools.count()
    heartbeat_interval_s: float = 5.0
    heartbeat_timeout_s: float = 60.0
    death_cause: str = ""

    def __init__(self, name: str, imports: list[str] | tuple[str, ...] = (), sync_threads: int = 32,
                 num_cpus: float = 0.0, rpc_grace_s: float = 10.0, actor_options: dict[str, Any] | None = None,
                 batch_window_s: float = 0.0, heartbeat_interval_s: float | None = None,
                 heartbeat_timeout_s: float | None = None):
        self.name = name
        if heartbeat_interval_s is not None:
            self.heartbeat_interval_s = heartbeat_interval_s
        if heartbeat_timeout_s is not None:
            self.heartbeat_timeout_s = heartbeat_timeout_s
        self._heartbeat: asyncio.Task | None = None
        self._imports, self._sync_threads = list(imports), sync_threads
        self._num_cpus, self._grace = num_cpus, rpc_grace_s
        # Requests made within this window go in one submit, replies finishing within it come back in one poll:
        # fewer Ray calls per env step under load, for at most 2 x window of added latency.
        self._window = batch_window_s
        self._actor_options = dict(actor_options or {})
        self.actor: Any = None
        self._futs: dict[int, asyncio.Future] = {}
        self._buf: list[tuple[int, str, tuple]] = []
        self._flush_scheduled = False
        self._poller: asyncio.Task | None = None
        self._rid = itertools.count()

    async def start(self) -> None:
        import ray

        cls = ray.remote(_RayHostActor)
        opts = {"max_concurrency": 64, "num_cpus": self._num_cpus, "scheduling_strategy": "SPREAD", **self._actor_options}
        self.actor = cls.options(**opts).remote(self.name, self._imports, self._sync_threads)
        await self.actor.ping.remote()
        self._poller = asyncio.ensure_future(self._poll_loop())
        self._heartbeat = asyncio.ensure_future(self._heartbeat_loop())

    async def _heartbeat_loop(self) -> None:
        import ray

        while self.alive:
            await asyncio.sleep(self.heartbeat_interval_s)
            if not self.alive:
                return
            try:
                health = await asyncio.wait_for(self.actor.health.remote(), self.heartbeat_timeout_s)
            except asyncio.CancelledError:
                raise
            except asyncio.TimeoutError:
                self._die(f"no heartbeat for {self.heartbeat_timeout_s:g} s (the worker is stuck)", kill=True)
                return
            except ray.exceptions.RayActorError as e:
                self._die(f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}")
                return
            except Exception as e:  # the link is unusable
                self._die(f"heartbeat failed: {e!r}", kill=True)
                return
            if isinstance(health, dict) and health.get("hung", 0) >= max(1, health.get("size", 1)) * 4:
                self._die(f"heartbeat: {health['hung']} sync env calls are hung in the worker", kill=True)
                return

    async def _poll_loop(self) -> None:
        import ray

        while self.alive:
            try:
                replies = await self.actor.poll.remote(self._window)
            except asyncio.CancelledError:
                raise
            except ray.exceptions.RayActorError as e:
                self._die(f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}")
                return
            except Exception as e:  # e.g. a deserialisation error: the link is unusable
                self._die(repr(e))
                return
            for rid, reply in replies:
                fut = self._futs.pop(rid, None)
                if fut is not None and not fut.done():
                    fut.set_result(reply)

    def _die(self, cause: str, kill: bool = False) -> None:
        if not self.alive:
            return
        self.alive = False
        self.death_cause = cause
        if kill:  # a stuck actor holds its resources (and hung threads) until killed
            import ray

            try:
                ray.kill(self.actor, no_restart=True)
            except Exception:
                pass
        for task in (self._poller, self._heartbeat):
            if task is not None and task is not asyncio.current_task() and not task.done():
                task.cancel()
        futs, self._futs = self._futs, {}
        for fut in futs.values():
            if not fut.done():
                fut.set_exception(WorkerDied(self.name, cause))
        if self.on_death is not None:
            self.on_death(self, cause)

    def _flush(self) -> None:
        self._flush_scheduled = False
        batch, self._buf = self._buf, []
        if not batch or not self.alive:
            return
        try:
            ref = self.actor.submit.remote(batch)
        except Exception as e:  # an argument that cannot be serialised fails only its own requests
            for rid, _, _ in batch:
                fut = self._futs.pop(rid, None)
                if fut is not None and not fut.done():
                    fut.set_result(("err", "protocol", f"cannot send request to worker {self.name}: {e!r}", ""))
            return
        del ref  # a dead actor is detected by the poll loop; submit itself returns nothing

    def _expire(self, rid: int, what: str) -> None:
        fut = self._futs.pop(rid, None)
        if fut is not None and not fut.done():
            fut.set_result(("err", "timeout", f"{what}: worker {self.name} gave no reply in time", ""))

    async def _request(self, op: str, args: tuple, timeout: float | None) -> Reply:
        if not self.alive:
            raise WorkerDied(self.name, "worker is dead")
        loop = asyncio.get_running_loop()
        rid = next(self._rid)
        fut = loop.create_future()
        self._futs[rid] = fut
        self._buf.append((rid, op, args))
        if not self._flush_scheduled:
            self._flush_scheduled = True
            if self._window > 0:
                loop.call_later(self._window, self._flush)
            else:
                loop.call_soon(self._flush)
        # The host enforces `timeout`; this driver-side timer only catches a worker that stopped answering.
        timer = loop.call_later(timeout + self._grace, self._expire, rid, op) if timeout is not None else None
        try:
            return await fut
        finally:
            if timer is not None:
                timer.cancel()
            self._futs.pop(rid, None)

    async def stats(self) -> dict[str, Any]:
        return await self.actor.stats.remote()

    async def shutdown(self) -> None:
        import ray

        if self.alive:
            try:
                await asyncio.wait_for(self.actor.close_all.remote(5.0), 10.0)
            except Exception:
                pass
        self.alive = False
        for task in (self._poller, self._heartbeat):
            if task is not None:
                task.cancel()
        try:
            ray.kill(self.actor, no_restart=True)
        except Exception:
            pass
