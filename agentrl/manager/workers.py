"""Env workers: how the driver reaches the :class:`~agentrl.manager.host.EnvHost` that holds its envs.

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
"""

from __future__ import annotations

import abc
import asyncio
import itertools
import os
from typing import Any, Callable

from agentrl.core import Message, set_sync_env_threads, sync_pool_stats
# EnvFailure, ProtocolError and make_env are re-exported: callers catch and use them through this module.
from agentrl.manager.host import (FAILURE_KINDS, EnvFailure, EnvHost, ProtocolError, Reply, WorkerDied,  # noqa: F401
                             _tb_summary, _unwrap, make_env)


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
