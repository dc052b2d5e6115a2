"""The manager's env workers: one in-process worker (``workers: 0``) or N Ray env-worker actors, restarted when
they die.

Invariants: :attr:`WorkerPool.workers` holds started workers only; a dead worker is replaced (``restart_dead_workers``)
or, when none is left alive and none can be restarted, ``on_fatal`` is called once with a :class:`ManagerError`;
:meth:`WorkerPool.close` cancels pending restarts before shutting the workers (and a Ray the pool started) down.
"""

from __future__ import annotations

import asyncio
import itertools
from typing import Callable

from agentrl import raystart
from agentrl.manager.config import ManagerConfig, ManagerError
from agentrl.manager.workers import EnvWorker, LocalWorker, RayWorker


class WorkerPool:
    """Starts, restarts and shuts down the env workers of one manager. ``on_new_worker()`` is called when a
    restarted worker joins (queued episodes can start), ``on_fatal(err)`` when no worker is left; ``counts`` gets
    ``worker_deaths``."""

    def __init__(self, cfg: ManagerConfig, prefix: str, counts: dict[str, int],
                 on_new_worker: Callable[[], None], on_fatal: Callable[[ManagerError], None]):
        self.cfg, self.prefix, self.counts = cfg, prefix, counts
        self.on_new_worker, self.on_fatal = on_new_worker, on_fatal
        self.workers: list[EnvWorker] = []
        self.started = False
        self._ray_started = False
        self._count = itertools.count()
        self._restarts: set[asyncio.Task] = set()

    def live(self) -> list[EnvWorker]:
        return [w for w in self.workers if w.alive]

    async def start(self) -> None:
        """Starts the workers (and a local Ray when ``workers > 0`` and Ray is not initialised); idempotent."""
        if self.started:
            return
        self.started = True
        if self.cfg.workers == 0:
            self.workers = [LocalWorker("local", self.cfg.worker_imports)]
            return
        import ray

        if not ray.is_initialized():
            raystart.init(self.cfg.ray_address, self.cfg.ray_num_cpus, log_to_driver=True)
            self._ray_started = True
        new = [self._new_ray_worker() for _ in range(self.cfg.workers)]
        await asyncio.gather(*(w.start() for w in new))
        self.workers = new

    def _new_ray_worker(self) -> RayWorker:
        c = self.cfg
        w = RayWorker(f"envw-{self.prefix}-{next(self._count)}", c.worker_imports, c.sync_env_threads,
                      c.worker_num_cpus, c.rpc_grace_s, batch_window_s=c.rpc_batch_window_s)
        w.on_death = self._on_death
        return w

    def _on_death(self, worker: EnvWorker, cause: str) -> None:
        self.counts["worker_deaths"] += 1
        if self.cfg.restart_dead_workers and self.started:
            t = asyncio.ensure_future(self._restart(worker))
            self._restarts.add(t)
            t.add_done_callback(self._restarts.discard)
        elif not self.live():
            self.on_fatal(ManagerError(f"every env worker died (last: {worker.name}: {cause})"))

    async def _restart(self, dead: EnvWorker) -> None:
        w = self._new_ray_worker()
        try:
            await w.start()
        except Exception as e:
            if not self.live():
                self.on_fatal(ManagerError(f"cannot restart env worker {dead.name}: {e!r}"))
            return
        self.workers = [x for x in self.workers if x is not dead] + [w]
        self.on_new_worker()

    async def close(self) -> None:
        """Cancels pending restarts, shuts every worker down, and Ray too if the pool started it."""
        for t in list(self._restarts):
            t.cancel()
        await asyncio.gather(*self._restarts, return_exceptions=True)
        await asyncio.gather(*(w.shutdown() for w in self.workers), return_exceptions=True)
        self.workers = []
        self.started = False
        if self._ray_started:
            import ray

            ray.shutdown()
            self._ray_started = False
