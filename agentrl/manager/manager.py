""":class:`EnvManager`: producers (batches, episode streams, continuous runs), admission pumping, version changes
and metrics. The rules live in :mod:`agentrl.manager.admission`, the group bookkeeping in
:mod:`agentrl.manager.groups`, one episode's body in :mod:`agentrl.manager.episode` and the env workers in
:mod:`agentrl.manager.pool`; the package docstring (:mod:`agentrl.manager`) describes the behaviour as a user sees it.

Invariant of the pump: episodes start only while ``running < max_concurrency``, and a group is opened only when
:meth:`agentrl.manager.admission.Admission.fits` says so (whole groups at once, so that partly admitted groups can
never deadlock; an open group reserves ``group_size`` trajectories). Every state change that could let a waiting
consumer proceed wakes the round.
"""

from __future__ import annotations

import asyncio
import uuid
from typing import Any, AsyncIterator, Iterable

import numpy as np

from agentrl.manager.admission import Admission
from agentrl.manager.config import EpisodeSpec, ManagerConfig, ManagerError, TaskSource
from agentrl.manager.episode import EpisodeRunner, StaleEpisode
from agentrl.manager.groups import OPEN, Episode, GroupBook, GroupState, Round, clock
from agentrl.manager.pool import WorkerPool
from agentrl.policy import Policy
from agentrl.trajectory import Group, Trajectory
from agentrl.manager.workers import EnvWorker

_COUNTERS = ("started", "finished", "cancelled", "failed", "dropped_stale", "rescheduled", "replaced", "surplus",
             "delivered_groups", "failed_groups", "given_up_groups", "env_steps", "policy_calls", "worker_deaths",
             "infra_retried")


class EnvManager:
    """Runs episodes of text envs against a :class:`~agentrl.policy.Policy` (see :mod:`agentrl.manager`).

    One idea: the pump and the ways of consuming what it produces (batches, streams, a continuous run) share one
    round and its invariant (module docstring). What varies apart already lives apart: the admission rule
    (:mod:`.admission`), the group book (:mod:`.groups`), one episode's body (:mod:`.episode`), the workers
    (:mod:`.pool`)."""

    def __init__(self, config: ManagerConfig, policy: Policy):
        config.validate()  # raises ValueError naming the bad field
        self.cfg = config
        self.policy = policy
        prefix = uuid.uuid4().hex[:6]
        self.counts = dict.fromkeys(_COUNTERS, 0)
        self.admission = Admission(config.async_ratio, config.batch_size or config.num_groups * config.group_size)
        self._pool = WorkerPool(config, prefix, self.counts, self._pump, self._set_fatal)
        self._book = GroupBook(config, self.admission, self.counts, self._engine_version, self._cancel, prefix)
        self._runner = EpisodeRunner(config, policy, self.counts, self._check_tokens)
        self._running: set[Episode] = set()
        self._round: Round | None = None
        self._cround: Round | None = None  # the last continuous run (kept after stop() so next_group ends cleanly)
        self._fatal: ManagerError | None = None
        self.max_running = 0

    # ---- lifecycle -------------------------------------------------------------------------------------------
    async def __aenter__(self) -> "EnvManager":
        await self.start_workers()
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.aclose()

    @property
    def workers(self) -> list[EnvWorker]:
        """The env workers (:class:`~agentrl.manager.workers.EnvWorker`), started by :meth:`start_workers`."""
        return self._pool.workers

    async def start_workers(self) -> None:
        """Starts the env workers (and a local Ray when ``workers > 0`` and Ray is not initialised)."""
        await self._pool.start()

    async def aclose(self) -> None:
        """Stops any producer, closes every env and worker, and shuts Ray down if the manager started it."""
        await self.stop()
        await self._pool.close()

    # ---- versions and admission ------------------------------------------------------------------------------
    def _engine_version(self) -> int:
        return int(self.policy.version)

    @property
    def version(self) -> int:
        """The trainer's version v: the last :meth:`set_version` (or :meth:`restore`), else ``policy.version``."""
        return self.admission.version(self._engine_version())

    @property
    def batch_size(self) -> int:
        return self.admission.batch_size

    @property
    def running(self) -> int:
        return len(self._running)

    @property
    def held(self) -> int:
        """Finished winners waiting for their group to complete (counted with ``running`` by admission)."""
        return self._book.held

    @property
    def accepted(self) -> int:
        """Trajectories delivered in complete groups (ready or taken), minus those handed back with :meth:`discard`."""
        return self.admission.accepted

    @property
    def failed(self):
        """Recent error trajectories (most recent ``failed_history``)."""
        return self._book.failed

    def set_version(self, v: int) -> None:
        """Tells the manager the trainer's version (call it after the engine got the weights it syncs, if any):
        applies the staleness rule and re-runs admission. Call it again when only the engine's version moved."""
        self.admission.set_version(v)
        if self._round is not None:
            self._book.restale(self._round)
        self._pump()
        self._wake()

    def _wake(self) -> None:
        """Lets waiting consumers re-check (a version change moves deadlines)."""
        for r in {id(x): x for x in (self._round, self._cround) if x is not None}.values():
            r.wake()

    def restore(self, version: int, accepted: int) -> None:
        """Continues a run that trained ``version`` steps consuming ``accepted`` trajectories (``version·B`` for a
        trainer taking B per step): admission then admits what a fresh run at step 0 would (no burst)."""
        self.admission.restore(version, accepted)
        self._pump()
        self._wake()

    def discard(self, n: int) -> None:
        """The consumer rejected ``n`` delivered trajectories (e.g. a filtered group): they no longer count as
        accepted, so admission may start ``n`` more."""
        self.admission.discard(n)
        self._pump()

    def _check_tokens(self, ep: Episode) -> None:
        e = self._engine_version()
        if self.admission.is_stale(ep.oldest_version, e):
            if self.cfg.stale_policy == "cancel":
                raise StaleEpisode(self.admission.stale_reason(ep.oldest_version, e))  # type: ignore[arg-type]
            ep.stale = True

    def _group_fits(self, r: Round) -> bool:
        queued = len(self._book.pending)
        if r.target is None and len(self._running) + queued >= self.cfg.max_concurrency:
            return False  # continuous mode: do not queue beyond what can run
        if r.deliver_failed:
            return True
        reserved = self.admission.accepted + r.group_size * len(r.open)
        return self.admission.fits(reserved, r.group_size, self._engine_version())

    def _live_workers(self) -> list[EnvWorker]:
        return self._pool.live()

    def _pump(self) -> None:
        """Opens groups while admission allows and starts queued episodes while ``running < max_concurrency``."""
        live = self._live_workers()
        if not live:
            return
        r, pending = self._round, self._book.pending
        while True:
            while pending and len(self._running) < self.cfg.max_concurrency:
                ep = pending.popleft()
                ep.group.pending -= 1
                if ep.group.state != OPEN:
                    continue
                self._start(ep, min(live, key=lambda w: w.load))
            if r is None or r.closed or r.exhausted or r.to_open == 0 or not self._group_fits(r):
                break
            if self._book.open_group(r) is None:
                r.wake()  # the source ran out: waiters re-check whether anything can still finish
                break
            if r.to_open is not None:
                r.to_open -= 1

    def _start(self, ep: Episode, worker: EnvWorker) -> None:
        ep.worker = worker
        worker.load += 1
        ep.group.live.add(ep)
        self._running.add(ep)
        self.counts["started"] += 1
        self.max_running = max(self.max_running, len(self._running))
        ep.task = asyncio.get_running_loop().create_task(self._runner.run(ep))
        ep.task.add_done_callback(lambda t, ep=ep: self._on_done(ep, t))

    def _cancel(self, ep: Episode, reason: str) -> asyncio.Task | None:
        """Cancels a running episode once; returns its task (await it to know the env is closed)."""
        if ep.task is None:
            return None
        if ep.cancel_reason is None and not ep.task.done():
            ep.cancel_reason = reason
            ep.task.cancel()
        return ep.task

    def _on_done(self, ep: Episode, task: asyncio.Task) -> None:
        traj = ep.result
        if traj is None:  # cancelled before its body ran, or a bug in the body
            err = None if task.cancelled() else task.exception()
            traj = Trajectory(id=ep.id, group_id=ep.group.id, env_id=ep.spec.env_id, seed=ep.spec.seed,
                              task=ep.spec.task, termination="cancelled" if err is None else "error",
                              error=ep.cancel_reason or "cancelled" if err is None else repr(err),
                              timings={"env_s": 0.0, "policy_s": 0.0, "queue_s": 0.0,
                                       "total_s": clock() - ep.created})
        self._running.discard(ep)
        if ep.worker is not None:
            ep.worker.load -= 1
        ep.group.live.discard(ep)
        self._book.episode_ended(ep, traj)
        self._pump()
        ep.group.round.wake()

    # ---- producers -------------------------------------------------------------------------------------------
    def _set_fatal(self, err: ManagerError) -> None:
        self._fatal = err
        self._wake()

    def _begin(self, r: Round) -> None:
        if self._round is not None:
            raise ManagerError("another producer (collect_groups / run_episodes / start) is active; stop it first")
        if self._fatal is not None:
            raise self._fatal
        self._round = r

    async def _end(self, r: Round, reason: str) -> None:
        """Closes the round and cancels (and awaits) every episode still running or queued for it."""
        r.closed = True
        for g in list(r.open.values()):
            self._book.finish(g, reason)
        self._book.pending = type(self._book.pending)(ep for ep in self._book.pending if ep.group.round is not r)
        if r.reap:
            await asyncio.gather(*list(r.reap), return_exceptions=True)
        r.stopped = True
        r.wake()
        if self._round is r:
            self._round = None

    async def _take(self, r: Round, n: int, ordered: bool, batch: int | None = None, taken: int = 0
                    ) -> list[Group] | None:
        """Waits for and takes ``n`` ready groups of ``r`` (fewer once nothing more can finish; None if none):
        by the deadline rule (``ordered``; as part of a step's ``batch`` groups of which ``taken`` were taken) or
        in completion order."""
        adm = self.admission
        while True:
            if self._fatal is not None and not r.ready:
                raise self._fatal
            if ordered:
                step = self.version
                chosen = adm.select_batch(r.ready, r.open_versions, batch or n, step,
                                          lambda g: (g.admit_version, g.index), ended=r.finished, taken=taken, want=n)
            else:
                chosen = r.ready[:n] if len(r.ready) >= n or r.finished else None
            if chosen:
                return self._book.take(r, chosen)
            if r.finished:
                return None
            await r.changes()

    async def collect_groups(self, task_source: TaskSource, num_groups: int | None = None) -> list[Group]:
        """Runs one batch: launches ``num_groups + extra_groups`` groups and returns the first ``num_groups`` that
        finish (completion order), each holding the first ``group_size`` finished episodes of its group. Returns
        after every loser was cancelled and its env closed. Returns fewer groups only if the source ran out while
        groups kept failing. Raises :class:`ManagerError` if every worker died."""
        await self.start_workers()
        n = num_groups or self.cfg.num_groups
        gs = self.cfg.group_size
        r = Round(task_source, gs, gs + self.cfg.extra_per_group, n, deliver_failed=False,
                  to_open=n + self.cfg.extra_groups)
        self._begin(r)
        try:
            self._pump()
            out = await self._take(r, n, ordered=False) or []
        finally:
            await self._end(r, "redundant: the batch already has num_groups groups")
        if self._fatal is not None and len(out) < n:
            raise self._fatal
        return out

    async def stream_groups(self, task_source: TaskSource, num_groups: int | None = None,
                            extra_groups: int | None = None) -> AsyncIterator[Group]:
        """:meth:`collect_groups` (``extra_groups`` None: the config's), yielding each group as soon as it is
        complete; the round ends (losers cancelled, their envs closed) after ``num_groups`` groups, or when the
        iterator is closed early."""
        await self.start_workers()
        n = num_groups or self.cfg.num_groups
        gs = self.cfg.group_size
        extra = self.cfg.extra_groups if extra_groups is None else extra_groups
        r = Round(task_source, gs, gs + self.cfg.extra_per_group, n, deliver_failed=False, to_open=n + extra)
        self._begin(r)
        got = 0
        try:
            self._pump()
            while got < n:
                out = await self._take(r, 1, ordered=False)
                if not out:
                    break
                got += 1
                yield out[0]
        finally:
            await self._end(r, "redundant: the batch already has num_groups groups")
        if self._fatal is not None and got < n:
            raise self._fatal

    async def stream_episodes(self, specs: Iterable[EpisodeSpec]) -> AsyncIterator[tuple[int, Trajectory]]:
        """Runs one episode per spec (no groups, no redundancy) and yields ``(spec index, trajectory)`` as episodes
        finish. A failing episode is retried up to ``max_failures_per_group`` times; after that its last error
        trajectory is yielded."""
        await self.start_workers()
        specs = list(specs)
        r = Round(specs, 1, 1, len(specs), deliver_failed=True, to_open=len(specs))
        self._begin(r)
        try:
            self._pump()
            for _ in range(len(specs)):
                got = await self._take_indexed(r)
                if got is None:
                    break
                yield got
        finally:
            await self._end(r, "stopped: stream_episodes was closed")
        if self._fatal is not None:
            raise self._fatal

    async def _take_indexed(self, r: Round) -> tuple[int, Trajectory] | None:
        while not r.ready:
            if r.finished or self._fatal is not None:
                return None
            await r.changes()
        g: GroupState = r.ready[0]
        self._book.take(r, [g])
        return g.index, g.winners[0]

    async def run_episodes(self, specs: Iterable[EpisodeSpec]) -> list[Trajectory]:
        """Runs one episode per spec and returns their trajectories in input order (see :meth:`stream_episodes`)."""
        specs = list(specs)
        res: list[Trajectory | None] = [None] * len(specs)
        async for i, t in self.stream_episodes(specs):
            res[i] = t
        missing = [i for i, t in enumerate(res) if t is None]
        if missing:
            raise ManagerError(f"episodes {missing[:10]} produced no trajectory")
        return res  # type: ignore[return-value]

    def start(self, task_source: TaskSource) -> None:
        """Starts continuous production: groups are admitted while the admission rule allows and taken with
        :meth:`next_batch` / :meth:`next_group` / :meth:`groups`, until :meth:`stop`."""
        if not self._pool.started:
            raise ManagerError("call `await manager.start_workers()` (or use `async with`) before start()")
        gs = self.cfg.group_size
        r = Round(task_source, gs, gs + self.cfg.extra_per_group, None, deliver_failed=False, to_open=None)
        self._begin(r)
        self._cround = r
        self._pump()

    async def next_batch(self, n: int, *, batch: int | None = None, taken: int = 0) -> list[Group] | None:
        """Returns the ``n`` groups to train at the current version, earliest deadline first (a group admitted at
        ``a`` is due at step ``a + α``): the groups that must be trained now for every deadline to be met (waiting
        for them if they are still running), then other finished groups in completion order. Returns fewer once
        nothing more can finish, and None when the run ended with nothing left (source exhausted and nothing
        running, or stopped). A step taken in parts (a streamed trainer) passes its size ``batch`` (groups) and how
        many it ``taken`` so far: deadlines are planned with that capacity, not ``n``."""
        r = self._cround
        if r is None:
            raise ManagerError("no continuous run was started (call start())")
        return await self._take(r, n, ordered=True, batch=batch, taken=taken)

    def take_dropped(self) -> list[str]:
        """The ids of the continuous run's groups that ended without being delivered (abandoned after their failure
        budget, or given up by their policy) since the last call: their tasks will not be trained."""
        r = self._cround
        if r is None:
            return []
        out, r.dropped = r.dropped, []
        return out

    async def next_group(self) -> Group | None:
        """Returns the next group of the continuous run (:meth:`next_batch` of one), or None when the run ended."""
        got = await self.next_batch(1)
        return got[0] if got else None

    async def groups(self) -> AsyncIterator[Group]:
        """Yields the continuous run's groups (see :meth:`next_group`)."""
        while True:
            g = await self.next_group()
            if g is None:
                return
            yield g

    async def stop(self) -> None:
        """Ends the active producer: cancels its running episodes (closing their envs) and drops queued ones.
        Groups already ready can still be taken."""
        r = self._round
        if r is not None:
            await self._end(r, "stopped")

    # ---- sandboxes ahead of the episodes ---------------------------------------------------------------------
    def sandbox_demand(self) -> int:
        """The most episodes this manager's rules let run at once, hence the sandboxes they can ask for at once:
        ``max_concurrency``, capped by the open groups times their ``group_size + extra_per_group`` members, where
        the open groups are bounded by the admission rule when ``async_ratio`` is set
        (:meth:`~agentrl.manager.admission.Admission.max_open_groups`), else by a batch round's ``num_groups +
        extra_groups``. A group's losers (``extra_per_group``) still closing their env when the next group opens
        hold their sandbox a moment longer: the pool makes those on demand."""
        c = self.cfg
        groups = self.admission.max_open_groups(c.group_size)
        if groups is None:
            groups = c.num_groups + c.extra_groups
        return max(1, min(c.max_concurrency, groups * (c.group_size + c.extra_per_group)))

    async def warm_sandboxes(self, pool: Any, spec: Any, *, snapshot: Any = None, wait: bool = False) -> int:
        """Sizes ``pool``'s warm pool of ``spec`` (a :class:`~agentrl.sandboxes.SandboxPool`) by
        :meth:`sandbox_demand` as a fleet target: sandboxes are made before the episodes ask for them, every
        episode the admission rule lets start finds one ready, and none beyond are made. ``wait``: return once they
        are ready. Returns the demand."""
        n = self.sandbox_demand()
        await pool.keep_warm(spec, n, wait=wait, snapshot=snapshot, fleet=True)
        return n

    # ---- metrics ---------------------------------------------------------------------------------------------
    def metrics(self) -> dict[str, Any]:
        """Returns a snapshot: the counters (started, finished, cancelled, failed, dropped_stale, rescheduled,
        replaced, surplus, accepted, delivered_groups, failed_groups, env_steps, policy_calls, worker_deaths,
        infra_retried;
        ``failures/<cause>`` per :data:`~agentrl.manager.episode.FAILURE_CAUSES` once one happened), live
        gauges (running, held, pending, ready, max_running, version, workers_alive), env step latency percentiles
        in seconds (step_p50_s, step_p90_s, step_p99_s, step_max_s over the last ``latency_window`` steps) and
        throughput since the first episode started (elapsed_s, steps_per_s, episodes_per_s)."""
        m: dict[str, Any] = dict(self.counts)
        r = self._round or self._cround
        m.update(accepted=self.admission.accepted, running=len(self._running), held=self._book.held,
                 pending=len(self._book.pending), ready=len(r.ready) if r is not None else 0,
                 max_running=self.max_running, version=self.version, workers_alive=len(self._live_workers()))
        lat = self._runner.latencies
        if lat:
            a = np.fromiter(lat, dtype=np.float64)
            p50, p90, p99 = np.percentile(a, [50, 90, 99])
            m.update(step_p50_s=float(p50), step_p90_s=float(p90), step_p99_s=float(p99), step_max_s=float(a.max()))
        else:
            m.update(step_p50_s=None, step_p90_s=None, step_p99_s=None, step_max_s=None)
        t0 = self._runner.t0
        el = clock() - t0 if t0 is not None else 0.0
        ended = self.counts["finished"] + self.counts["failed"] + self.counts["cancelled"]
        m.update(elapsed_s=el, steps_per_s=self.counts["env_steps"] / el if el > 0 else 0.0,
                 episodes_per_s=ended / el if el > 0 else 0.0)
        return m

    async def worker_stats(self) -> list[dict[str, Any]]:
        """Returns each live worker's host counters (see :meth:`agentrl.manager.workers.EnvHost.stats`)."""
        return list(await asyncio.gather(*(w.stats() for w in self._live_workers())))
