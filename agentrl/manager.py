"""The environment manager: thousands of episodes, each its own asyncio task, stepping the moment its action arrives.

Flow of one episode (one task in the driver)::

    queued ──admission──> open (create + reset, in the episode's env worker) ──> act (policy, in the driver)
       ──> step (worker) ──> act ──> ... ──> terminated | truncated | error | cancelled ──> close env + session

No lock-step barrier anywhere: an env steps when its own action arrives and the policy is asked when its own
observation arrives. Envs live in env workers (:mod:`agentrl.workers`): ``workers: 0`` hosts them in this process,
``workers: N`` in N Ray actors (each running many envs on its own event loop); episodes go to the least-loaded live
worker. The policy lives in the driver.

Public API (one :class:`EnvManager` per policy; at most one producer — a ``collect_groups`` call, an episode run or
a continuous run — is active at a time)::

    async with EnvManager(ManagerConfig(...), policy) as mgr:
        trajs = await mgr.run_episodes([EpisodeSpec("my/Env-v0", seed=i) for i in range(8)])  # input order
        groups = await mgr.collect_groups(task_source)          # one batch: num_groups groups (sync training)

        mgr.start(task_source)                                   # continuous mode (async training)
        async for group in mgr.groups():                         # groups in completion order
            ...; mgr.set_version(v)                              # trainer moved to policy version v
            mgr.discard(k)                                       # optional: k delivered trajectories rejected
        await mgr.stop()

Also: ``stream_episodes(specs)`` (async iterator of ``(spec index, trajectory)`` in finishing order),
``next_group()``, ``metrics()`` (counters, gauges, step latency percentiles, throughput), ``worker_stats()``,
``failed`` (recent error trajectories) and ``workers`` (the :class:`~agentrl.workers.EnvWorker` list).

``task_source`` is an iterable (or iterator) of :class:`EpisodeSpec`, or a zero-argument callable returning the next
spec (``None`` when exhausted). Each spec is the prototype of one group: its ``group_size + extra_per_group``
members share ``env_id``, ``env_kwargs``, ``seed`` and ``task`` (the task reaches the env as
``reset(options={"task": task, **spec.options})``).

Groups and redundancy (ROLL Flash, done fully): ``collect_groups`` launches ``num_groups + extra_groups`` groups of
``group_size + extra_per_group`` episodes; the first ``group_size`` finished episodes of a group and the first
``num_groups`` finished groups win. Losers are cancelled for real: the episode task is cancelled, its env's
``aclose`` is awaited in the worker (a step in flight is cancelled there) and the policy session's ``aclose`` is
awaited; ``collect_groups`` returns only after every loser has been closed. In continuous mode ``extra_per_group``
applies the same way; ``extra_groups`` has no meaning there (there is no batch to complete).

Admission (AReaL's rule): an episode starts only while ``running < max_concurrency`` and, when ``async_ratio`` α is
set, ``accepted + running < (α + v + 1)·B``. ``running`` counts live episode tasks (over-provisioned ones
included) plus ``held`` winners (finished, waiting for their group mates: not yet accepted, no longer running);
``accepted`` counts trajectories delivered in groups (minus those the consumer hands back with
:meth:`EnvManager.discard`, e.g. filtered groups); ``v`` is :attr:`EnvManager.version` (set by the trainer
controller with :meth:`EnvManager.set_version`, else ``policy.version``) and ``B`` is ``batch_size`` (default
``num_groups·group_size``). Admission is done a whole group at a time (a group is opened only if all its
``group_size + extra_per_group`` members fit under the bound), so partly admitted groups cannot deadlock. With a
trainer that consumes B trajectories per version this keeps the producer at most α batches ahead. Over-provisioned
members count against the bound: for redundancy with α set, size ``batch_size`` for the launched episodes (or
leave α null for a batch-synchronous ``collect_groups``). Plain episode runs (``run_episodes``) ignore α.

Staleness: with α set, an episode whose oldest token version (from ``Action.versions``) falls below ``v − α`` is
cancelled (``stale_policy: cancel``) or kept and dropped at its end (``drop``); either way it is
counted in ``dropped_stale`` and its group gets a replacement member. The rule applies only while the policy serves
a fresh enough version (``policy.version >= v − α``): call ``set_version(v)`` once the inference side has v, and a
lagging engine never makes the manager cancel and restart episodes in a loop.

Faults: an env that raises, exceeds ``step_timeout_s``/``reset_timeout_s``/``episode_timeout_s``, or returns
garbage (wrong tuple shape, a reward that is not a finite real number, bad messages, non-dict info) ends its episode
with termination ``error`` (``Trajectory.error`` holds the failure and a traceback summary); the group gets a
replacement member, up to ``max_failures_per_group`` failures, after which the group is abandoned and another task is
taken from the source. A policy that raises is handled the same way. A dead worker fails its episodes; they are
rescheduled on live workers (``rescheduled``) and, with ``restart_dead_workers``, a new worker takes its place.
Failed attempts are kept in :attr:`EnvManager.failed` (most recent ``failed_history``), never in groups. Every
trajectory id is unique (``<group id>.<attempt>``) and a finished trajectory is delivered at most once.

Trajectory fields: ``messages`` holds the whole conversation (opening messages, the policy's actions as assistant
messages, env messages), ``rewards`` one reward per step, ``reward`` the sum of step rewards unless the last env
info has ``"episode_reward"`` (then that value), ``info`` the last env info, token fields from
``session.token_record()`` when it is not None, timings ``env_s`` (reset+step as seen by the driver), ``policy_s``
(time in ``act``), ``queue_s`` (queued → episode start) and ``total_s`` (queued → trajectory ready, env closed).
An action with ``context_exhausted`` ends the episode as ``truncated`` without stepping the env (its text, if any,
is kept as the last assistant message and ``info["context_exhausted"]`` is set). Reaching ``max_turns`` actions
ends it as ``truncated`` too. When ``reset``'s info has ``"tools"``, the episode's ``EpisodeMeta`` gets a ``tools``
attribute with that value before the policy's first ``act`` (tool schemas for the chat template).
"""

from __future__ import annotations

import asyncio
import collections
import itertools
import time
import traceback
import uuid
from dataclasses import dataclass, field
from typing import Any, AsyncIterator, Callable, Iterable, Iterator, Literal

import numpy as np

from agentrl.policy import EpisodeMeta, Policy, PolicySession
from agentrl.trajectory import Group, Trajectory
from agentrl.workers import EnvFailure, EnvWorker, LocalWorker, RayWorker, WorkerDied


@dataclass
class EpisodeSpec:
    """What to run: the env (``env_id`` registered, or ``"package.module:Class"``), its constructor kwargs, the
    reset seed, the task (passed as ``options["task"]``), extra reset ``options``, an optional ``group_id`` (one is
    generated when None) and ``max_turns`` (None: the manager's ``max_turns``)."""

    env_id: str
    env_kwargs: dict[str, Any] = field(default_factory=dict)
    seed: int | None = None
    task: Any = None
    group_id: str | None = None
    max_turns: int | None = None
    options: dict[str, Any] | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.env_id, str) or not self.env_id:
            raise ValueError(f"EpisodeSpec.env_id must be a non-empty str, got {self.env_id!r}")
        if not isinstance(self.env_kwargs, dict):
            raise ValueError(f"EpisodeSpec.env_kwargs must be a dict, got {type(self.env_kwargs).__name__}")
        if self.max_turns is not None and self.max_turns < 1:
            raise ValueError(f"EpisodeSpec.max_turns must be >= 1, got {self.max_turns}")


@dataclass
class ManagerConfig:
    """Settings of :class:`EnvManager` (see the module docstring for the rules they drive)."""

    workers: int = 0  # 0: envs in this process; N: N Ray env-worker actors
    ray_address: str | None = None  # used only when Ray is not initialised yet
    ray_num_cpus: int | None = None  # for a local Ray started by the manager
    worker_num_cpus: float = 0.0  # Ray CPUs reserved per env worker
    worker_imports: list[str] = field(default_factory=list)  # modules each worker imports (registers envs)
    restart_dead_workers: bool = True
    sync_env_threads: int = 32  # thread pool for sync-only envs, per worker
    max_concurrency: int = 256
    async_ratio: int | None = None  # α; None disables the version-based admission and staleness rules
    batch_size: int | None = None  # B in trajectories; default num_groups * group_size
    stale_policy: Literal["cancel", "drop"] = "cancel"
    num_groups: int = 1
    group_size: int = 1
    extra_groups: int = 0
    extra_per_group: int = 0
    max_turns: int = 32
    step_timeout_s: float = 300.0
    reset_timeout_s: float = 300.0
    close_timeout_s: float = 30.0
    policy_timeout_s: float | None = None
    episode_timeout_s: float | None = None
    max_failures_per_group: int = 3
    rpc_grace_s: float = 10.0  # extra driver-side wait for a worker's reply beyond the call's own timeout
    rpc_batch_window_s: float = 0.0  # Ray workers: >0 holds requests/replies this long to send them in one call
    latency_window: int = 65536  # env step latencies kept for percentiles
    failed_history: int = 1024

    def validate(self) -> None:
        for name in ("max_concurrency", "num_groups", "group_size", "max_turns", "sync_env_threads",
                     "latency_window", "failed_history"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        for name in ("workers", "extra_groups", "extra_per_group", "max_failures_per_group"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must be >= 0, got {getattr(self, name)}")
        for name in ("step_timeout_s", "reset_timeout_s", "close_timeout_s", "policy_timeout_s", "episode_timeout_s",
                     "rpc_grace_s"):
            v = getattr(self, name)
            if v is not None and v <= 0:
                raise ValueError(f"{name} must be > 0, got {v}")
        if self.async_ratio is not None and self.async_ratio < 0:
            raise ValueError(f"async_ratio must be >= 0 or null, got {self.async_ratio}")
        if self.batch_size is not None and self.batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {self.batch_size}")
        b = self.batch_size or self.num_groups * self.group_size
        if self.async_ratio is not None and b < self.group_size + self.extra_per_group:
            raise ValueError(f"batch_size ({b}) must be >= group_size + extra_per_group "
                             f"({self.group_size + self.extra_per_group}): admission reserves whole groups")
        if self.rpc_batch_window_s < 0:
            raise ValueError(f"rpc_batch_window_s must be >= 0, got {self.rpc_batch_window_s}")
        if self.worker_num_cpus < 0:
            raise ValueError(f"worker_num_cpus must be >= 0, got {self.worker_num_cpus}")



class ManagerError(RuntimeError):
    """The manager cannot go on (e.g. every env worker is dead) or was used wrongly."""


class _Stale(Exception):
    pass


TaskSource = Iterable[EpisodeSpec] | Iterator[EpisodeSpec] | Callable[[], "EpisodeSpec | None"]


class _GroupState:
    __slots__ = ("id", "spec", "round", "index", "winners", "live", "pending", "attempts", "failures", "done",
                 "last_error")

    def __init__(self, gid: str, spec: EpisodeSpec, rnd: "_Round", index: int):
        self.id, self.spec, self.round, self.index = gid, spec, rnd, index
        self.winners: list[Trajectory] = []
        self.live: set[_Episode] = set()
        self.pending = 0
        self.attempts = itertools.count()
        self.failures = 0
        self.done = False
        self.last_error: Trajectory | None = None


class _Episode:
    __slots__ = ("id", "group", "spec", "created", "task", "worker", "cancel_reason", "oldest_version", "stale",
                 "worker_died", "result", "started")

    def __init__(self, group: _GroupState):
        self.group, self.spec = group, group.spec
        self.id = f"{group.id}.{next(group.attempts)}"
        self.created = time.perf_counter()
        self.task: asyncio.Task | None = None
        self.worker: EnvWorker | None = None
        self.cancel_reason: str | None = None
        self.oldest_version: int | None = None
        self.stale = False
        self.worker_died = False
        self.result: Trajectory | None = None
        self.started = False


class _Round:
    """One producer: a batch (``target`` groups) or a continuous run (``target`` None)."""

    def __init__(self, source: TaskSource, group_size: int, launch_size: int, target: int | None,
                 deliver_failed: bool, to_open: int | None):
        if callable(source):
            self._next: Callable[[], EpisodeSpec | None] = source
        else:
            it = iter(source)
            self._next = lambda: next(it, None)
        self.group_size, self.launch_size, self.target = group_size, launch_size, target
        self.deliver_failed = deliver_failed
        self.out: asyncio.Queue[tuple[int, Group] | None] = asyncio.Queue()  # (group index in the round, group)
        self.groups: dict[str, _GroupState] = {}
        self.delivered = 0
        self.exhausted = False
        self.closed = False
        self.count = itertools.count()
        self.reap: set[asyncio.Task] = set()  # cancelled losers still closing their envs
        self.to_open = to_open  # groups still to open (None: unbounded, continuous mode)

    def next_spec(self) -> EpisodeSpec | None:
        if self.exhausted:
            return None
        spec = self._next()
        if spec is None:
            self.exhausted = True
        elif not isinstance(spec, EpisodeSpec):
            raise ManagerError(f"task source yielded {type(spec).__name__}, expected EpisodeSpec")
        return spec


def _timeout_left(base: float | None, deadline: float | None) -> float | None:
    if deadline is None:
        return base
    left = deadline - time.perf_counter()
    if left <= 0:
        raise TimeoutError("episode_timeout_s exceeded")
    return left if base is None else min(base, left)


async def _with_timeout(aw: Any, timeout: float | None) -> Any:
    if timeout is None:
        return await aw
    if hasattr(asyncio, "timeout"):
        async with asyncio.timeout(timeout):
            return await aw
    return await asyncio.wait_for(aw, timeout)


class EnvManager:
    """Runs episodes of text envs against a :class:`~agentrl.policy.Policy` (see the module docstring)."""

    def __init__(self, config: ManagerConfig, policy: Policy):
        config.validate()  # raises ValueError naming the bad field
        self.cfg = config
        self.policy = policy
        self.workers: list[EnvWorker] = []
        self._started = False
        self._ray_started = False
        self._prefix = uuid.uuid4().hex[:6]
        self._gcount = itertools.count()
        self._wcount = itertools.count()
        self._version: int | None = None
        self._pending: collections.deque[_Episode] = collections.deque()
        self._running: set[_Episode] = set()
        self._held = 0  # finished winners waiting for their group mates (not yet accepted)
        self._round: _Round | None = None
        self._cround: _Round | None = None  # the last continuous run (kept after stop() so next_group ends cleanly)
        self._fatal: ManagerError | None = None
        self._bg: set[asyncio.Task] = set()
        self.failed: collections.deque[Trajectory] = collections.deque(maxlen=config.failed_history)
        self._lat: collections.deque[float] = collections.deque(maxlen=config.latency_window)
        self.counts = dict.fromkeys(
            ("started", "finished", "cancelled", "failed", "dropped_stale", "rescheduled", "replaced", "surplus",
             "accepted", "delivered_groups", "failed_groups", "env_steps", "policy_calls", "worker_deaths"), 0)
        self._t0: float | None = None
        self.max_running = 0

    # ---- lifecycle -------------------------------------------------------------------------------------------
    async def __aenter__(self) -> "EnvManager":
        await self.start_workers()
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.aclose()

    async def start_workers(self) -> None:
        """Starts the env workers (and a local Ray when ``workers > 0`` and Ray is not initialised)."""
        if self._started:
            return
        self._started = True
        if self.cfg.workers == 0:
            self.workers = [LocalWorker("local", self.cfg.worker_imports)]
            return
        import ray

        if not ray.is_initialized():
            kw: dict[str, Any] = {"include_dashboard": False, "log_to_driver": True}
            if self.cfg.ray_address:
                kw["address"] = self.cfg.ray_address
            elif self.cfg.ray_num_cpus is not None:
                kw["num_cpus"] = self.cfg.ray_num_cpus
            ray.init(**kw)
            self._ray_started = True
        new = [self._new_ray_worker() for _ in range(self.cfg.workers)]
        await asyncio.gather(*(w.start() for w in new))
        self.workers = new

    def _new_ray_worker(self) -> RayWorker:
        w = RayWorker(f"envw-{self._prefix}-{next(self._wcount)}", self.cfg.worker_imports, self.cfg.sync_env_threads,
                      self.cfg.worker_num_cpus, self.cfg.rpc_grace_s, batch_window_s=self.cfg.rpc_batch_window_s)
        w.on_death = self._on_worker_death
        return w

    async def aclose(self) -> None:
        """Stops any producer, closes every env and worker, and shuts Ray down if the manager started it."""
        await self.stop()
        for t in list(self._bg):
            t.cancel()
        await asyncio.gather(*self._bg, return_exceptions=True)
        await asyncio.gather(*(w.shutdown() for w in self.workers), return_exceptions=True)
        self.workers = []
        self._started = False
        if self._ray_started:
            import ray

            ray.shutdown()
            self._ray_started = False

    # ---- version, admission ----------------------------------------------------------------------------------
    @property
    def version(self) -> int:
        """The current policy version v: the last :meth:`set_version`, else ``policy.version``."""
        return self._version if self._version is not None else int(self.policy.version)

    @property
    def batch_size(self) -> int:
        return self.cfg.batch_size or self.cfg.num_groups * self.cfg.group_size

    @property
    def running(self) -> int:
        return len(self._running)

    def set_version(self, v: int) -> None:
        """Tells the manager the trainer's policy version; applies the staleness rule and re-runs admission."""
        self._version = int(v)
        a = self.cfg.async_ratio
        if a is not None and self._restart_helps():
            for ep in list(self._running):
                if ep.oldest_version is not None and ep.oldest_version < self._version - a:
                    if self.cfg.stale_policy == "cancel":
                        self._cancel(ep, f"stale: oldest token version {ep.oldest_version} < v - alpha = {self._version - a}")
                    else:
                        ep.stale = True
        self._pump()

    def discard(self, n: int) -> None:
        """The consumer rejected ``n`` delivered trajectories (e.g. a filtered group): they no longer count as
        accepted, so admission may start ``n`` more."""
        self.counts["accepted"] -= int(n)
        self._pump()

    @property
    def held(self) -> int:
        """Finished winners waiting for their group to complete (counted with ``running`` by admission)."""
        return self._held

    def _group_fits(self, r: _Round) -> bool:
        """Whether a new group of ``r`` may be opened now. Admission reserves a whole group at once
        (``accepted + running + held + queued + launch_size <= (α + v + 1)·B``) so that partly admitted groups can
        never deadlock; each episode start then satisfies AReaL's ``accepted + running < (α + v + 1)·B``."""
        queued = len(self._pending)
        if r.target is None and len(self._running) + queued >= self.cfg.max_concurrency:
            return False  # continuous mode: do not queue beyond what can run
        a = self.cfg.async_ratio
        if a is None or r.deliver_failed:
            return True
        reserved = self.counts["accepted"] + len(self._running) + self._held + queued
        return reserved + r.launch_size <= (a + self.version + 1) * self.batch_size

    def _live_workers(self) -> list[EnvWorker]:
        return [w for w in self.workers if w.alive]

    def _pump(self) -> None:
        """Opens groups while admission allows and starts queued episodes while ``running < max_concurrency``."""
        live = self._live_workers()
        if not live:
            return
        r = self._round
        while True:
            while self._pending and len(self._running) < self.cfg.max_concurrency:
                ep = self._pending.popleft()
                ep.group.pending -= 1
                if ep.group.done:
                    continue
                self._start(ep, min(live, key=lambda w: w.load))
            if (r is None or r.closed or r.exhausted or r.to_open == 0 or not self._group_fits(r)):
                break
            if self._open_group(r) is None:
                if not r.groups and r.target is not None:
                    r.out.put_nowait(None)  # the source ran out: the batch cannot be completed
                break
            if r.to_open is not None:
                r.to_open -= 1

    def _start(self, ep: _Episode, worker: EnvWorker) -> None:
        ep.worker = worker
        worker.load += 1
        ep.group.live.add(ep)
        self._running.add(ep)
        self.counts["started"] += 1
        self.max_running = max(self.max_running, len(self._running))
        ep.task = asyncio.get_running_loop().create_task(self._run_episode(ep))
        ep.task.add_done_callback(lambda t, ep=ep: self._on_done(ep, t))

    def _enqueue(self, group: _GroupState, front: bool = False) -> None:
        ep = _Episode(group)
        group.pending += 1
        if front:
            self._pending.appendleft(ep)
        else:
            self._pending.append(ep)

    def _open_group(self, r: _Round) -> _GroupState | None:
        spec = r.next_spec()
        if spec is None:
            return None
        index = next(r.count)
        gid = spec.group_id or f"{self._prefix}-g{next(self._gcount)}"
        g = _GroupState(gid, spec, r, index)
        r.groups[gid + f"#{index}"] = g
        for _ in range(r.launch_size):
            self._enqueue(g)
        return g

    def _cancel(self, ep: _Episode, reason: str) -> asyncio.Task | None:
        """Cancels a running episode once; returns its task (await it to know the env is closed)."""
        if ep.task is None:
            return None
        if ep.cancel_reason is None and not ep.task.done():
            ep.cancel_reason = reason
            ep.task.cancel()
        return ep.task

    # ---- one episode -----------------------------------------------------------------------------------------
    async def _run_episode(self, ep: _Episode) -> None:
        cfg, spec, worker = self.cfg, ep.spec, ep.worker
        assert worker is not None
        ep.started = True
        traj = Trajectory(id=ep.id, group_id=ep.group.id, env_id=spec.env_id, seed=spec.seed, task=spec.task)
        t_start = time.perf_counter()
        if self._t0 is None:
            self._t0 = t_start
        env_s = policy_s = 0.0
        deadline = t_start + cfg.episode_timeout_s if cfg.episode_timeout_s else None
        session: PolicySession | None = None
        opened = False
        try:
            meta = EpisodeMeta(ep.id, ep.group.id, spec.env_id, spec.seed, spec.task)
            session = self.policy.session(meta)
            options = dict(spec.options or {})
            if spec.task is not None:
                options.setdefault("task", spec.task)
            opened = True
            t = time.perf_counter()
            try:  # a failed or timed-out call's time is env time too
                new, info = await worker.open(ep.id, spec.env_id, spec.env_kwargs, spec.seed, options or None,
                                              _timeout_left(cfg.reset_timeout_s, deadline))
            finally:
                env_s += time.perf_counter() - t
            traj.messages.extend(new)
            traj.info = info
            if "tools" in info:  # the env's tool schemas, for policies that render them (before the first act)
                meta.tools = info["tools"]  # type: ignore[attr-defined]
            max_turns = spec.max_turns or cfg.max_turns
            termination = "truncated"
            while traj.num_turns < max_turns:
                t = time.perf_counter()
                action = await _with_timeout(session.act(new), _timeout_left(cfg.policy_timeout_s, deadline))
                policy_s += time.perf_counter() - t
                self.counts["policy_calls"] += 1
                if not isinstance(action.text, str):
                    raise TypeError(f"policy returned Action.text of type {type(action.text).__name__}, expected str")
                if action.versions:
                    lo = min(action.versions)
                    ep.oldest_version = lo if ep.oldest_version is None else min(ep.oldest_version, lo)
                    self._check_stale(ep)
                if action.context_exhausted:
                    if action.text:
                        traj.messages.append({"role": "assistant", "content": action.text})
                    traj.info = {**traj.info, "context_exhausted": True}
                    break
                traj.messages.append({"role": "assistant", "content": action.text})
                t = time.perf_counter()
                try:
                    new, reward, terminated, truncated, info = await worker.step(
                        ep.id, action.text, _timeout_left(cfg.step_timeout_s, deadline))
                finally:
                    dt = time.perf_counter() - t
                    env_s += dt
                self._lat.append(dt)
                self.counts["env_steps"] += 1
                traj.rewards.append(reward)
                traj.messages.extend(new)
                traj.num_turns += 1
                traj.info = info
                if terminated or truncated:
                    termination = "terminated" if terminated else "truncated"
                    break
            traj.termination = termination
            final = traj.info.get("episode_reward") if isinstance(traj.info, dict) else None
            traj.reward = float(final) if isinstance(final, (int, float)) and not isinstance(final, bool) else float(sum(traj.rewards))
        except asyncio.CancelledError:
            traj.termination, traj.error = "cancelled", ep.cancel_reason or "cancelled"
        except _Stale as e:
            traj.termination, traj.error = "cancelled", str(e)
            ep.cancel_reason = str(e)
        except WorkerDied as e:
            ep.worker_died = True
            traj.termination, traj.error = "error", f"WorkerDied({str(e)!r})"
        except EnvFailure as e:
            traj.termination = "error"
            traj.error = f"EnvFailure(kind={e.kind!r}, {e.message!r})" + (f"\n{e.traceback_text}" if e.traceback_text else "")
        except (TimeoutError, asyncio.TimeoutError) as e:
            traj.termination, traj.error = "error", f"TimeoutError({str(e) or 'policy_timeout_s exceeded'!r})"
        except Exception as e:
            tb = "".join(traceback.format_exception(type(e), e, e.__traceback__, limit=-6)).strip()
            traj.termination, traj.error = "error", f"{e!r}\n{tb}"
        traj.timings = {"env_s": env_s, "policy_s": policy_s, "queue_s": t_start - ep.created}
        ep.result = traj
        # Cleanup must finish even if this task is cancelled again meanwhile: the env and session are released
        # before the trajectory is reported.
        cleanup = asyncio.ensure_future(self._cleanup(ep, traj, session, worker if opened else None))
        while not cleanup.done():
            try:
                await asyncio.shield(cleanup)
            except asyncio.CancelledError:
                continue
        traj.timings["total_s"] = time.perf_counter() - ep.created

    async def _cleanup(self, ep: _Episode, traj: Trajectory, session: PolicySession | None,
                       worker: EnvWorker | None) -> None:
        if session is not None:
            try:
                rec = session.token_record()
                if rec is not None:
                    traj.token_ids, traj.loss_mask = list(rec.token_ids), list(rec.loss_mask)
                    traj.logprobs, traj.versions = list(rec.logprobs), list(rec.versions)
                    traj.prompt_len = rec.prompt_len
                    traj.segments = list(getattr(rec, "segments", None) or [])
                    traj.info = {**traj.info, **(getattr(rec, "info", None) or {})}
            except Exception as e:
                traj.info = {**traj.info, "token_record_error": repr(e)}
            try:
                await _with_timeout(session.aclose(), self.cfg.close_timeout_s)
            except Exception:
                pass
        if worker is not None and worker.alive:
            try:
                await worker.close(ep.id, self.cfg.close_timeout_s)
            except Exception:
                pass

    def _restart_helps(self) -> bool:
        """Whether a restarted episode would get fresh enough tokens: the policy serves version >= v - α. While the
        inference side lags behind (weights not loaded yet), the staleness rule is suspended; otherwise every new
        episode would be cancelled at its first action, over and over."""
        a = self.cfg.async_ratio
        return a is not None and int(self.policy.version) >= self.version - a

    def _check_stale(self, ep: _Episode) -> None:
        a = self.cfg.async_ratio
        if a is None or ep.oldest_version is None:
            return
        v = self.version
        if ep.oldest_version < v - a and self._restart_helps():
            msg = f"stale: oldest token version {ep.oldest_version} < v - alpha = {v - a}"
            if self.cfg.stale_policy == "cancel":
                raise _Stale(msg)
            ep.stale = True

    # ---- bookkeeping when an episode ends --------------------------------------------------------------------
    def _on_done(self, ep: _Episode, task: asyncio.Task) -> None:
        traj = ep.result
        if traj is None:  # cancelled before its body ran, or a bug in the body
            err = None if task.cancelled() else task.exception()
            traj = Trajectory(id=ep.id, group_id=ep.group.id, env_id=ep.spec.env_id, seed=ep.spec.seed,
                              task=ep.spec.task, termination="cancelled" if err is None else "error",
                              error=ep.cancel_reason or "cancelled" if err is None else repr(err),
                              timings={"env_s": 0.0, "policy_s": 0.0, "queue_s": 0.0,
                                       "total_s": time.perf_counter() - ep.created})
        self._running.discard(ep)
        if ep.worker is not None:
            ep.worker.load -= 1
        g = ep.group
        g.live.discard(ep)
        c = self.counts
        term = traj.termination
        if term == "cancelled":
            c["cancelled"] += 1
        elif term == "error":
            c["failed"] += 1
            self.failed.append(traj)
        else:
            c["finished"] += 1
        r = g.round
        if g.done:
            if term in ("terminated", "truncated"):
                c["surplus"] += 1
        elif term == "cancelled":
            if (ep.cancel_reason or "").startswith("stale"):
                c["dropped_stale"] += 1
                self._replace(g)
        elif term == "error":
            g.last_error = traj
            if ep.worker_died:
                c["rescheduled"] += 1
                self._replace(g)
            else:
                g.failures += 1
                if g.failures > self.cfg.max_failures_per_group:
                    self._abandon(g)
                else:
                    c["replaced"] += 1
                    self._replace(g)
        elif ep.stale:
            c["dropped_stale"] += 1
            self._replace(g)
        else:
            g.winners.append(traj)
            self._held += 1
            if len(g.winners) >= r.group_size:
                self._complete(g)
        self._pump()

    def _replace(self, g: _GroupState) -> None:
        if not g.round.closed:
            self._enqueue(g, front=True)

    def _finish_group(self, g: _GroupState, reason: str, delivered: bool = False) -> None:
        """Marks ``g`` done, releases its held winners (counted as ``surplus`` unless delivered) and cancels its
        live members, remembering their tasks so that the round's end can await their env closes."""
        if g.done:
            return
        g.done = True
        self._held -= len(g.winners)
        if not delivered:
            self.counts["surplus"] += len(g.winners)
        for ep in list(g.live):
            t = self._cancel(ep, reason)
            if t is not None and not t.done():
                g.round.reap.add(t)
                t.add_done_callback(g.round.reap.discard)
        g.round.groups.pop(g.id + f"#{g.index}", None)

    def _complete(self, g: _GroupState) -> None:
        r = g.round
        deliver = not r.closed and not (r.target is not None and r.delivered >= r.target)
        self._finish_group(g, "redundant: its group already has group_size finished episodes", delivered=deliver)
        if not deliver:
            return
        group = Group(g.id, g.winners[: r.group_size])
        r.delivered += 1
        self.counts["delivered_groups"] += 1
        if not r.deliver_failed:  # plain episode runs (stream_episodes) are not training batches
            self.counts["accepted"] += len(group.trajectories)
        r.out.put_nowait((g.index, group))
        if r.target is not None and r.delivered >= r.target:
            r.closed = True

    def _abandon(self, g: _GroupState) -> None:
        r = g.round
        self._finish_group(g, "abandoned: its group failed too often")
        self.counts["failed_groups"] += 1
        if r.deliver_failed and g.last_error is not None and not r.closed:
            r.delivered += 1
            r.out.put_nowait((g.index, Group(g.id, [g.last_error])))
            return
        if r.target is not None and not r.closed:
            r.to_open = (r.to_open or 0) + 1  # take another task from the source

    def _on_worker_death(self, worker: EnvWorker, cause: str) -> None:
        self.counts["worker_deaths"] += 1
        if self.cfg.restart_dead_workers and self._started:
            t = asyncio.ensure_future(self._restart_worker(worker))
            self._bg.add(t)
            t.add_done_callback(self._bg.discard)
        elif not self._live_workers():
            self._set_fatal(ManagerError(f"every env worker died (last: {worker.name}: {cause})"))

    async def _restart_worker(self, dead: EnvWorker) -> None:
        w = self._new_ray_worker()
        try:
            await w.start()
        except Exception as e:
            if not self._live_workers():
                self._set_fatal(ManagerError(f"cannot restart env worker {dead.name}: {e!r}"))
            return
        self.workers = [x for x in self.workers if x is not dead] + [w]
        self._pump()

    def _set_fatal(self, err: ManagerError) -> None:
        self._fatal = err
        if self._round is not None:
            self._round.out.put_nowait(None)

    # ---- producers -------------------------------------------------------------------------------------------
    def _begin(self, r: _Round) -> None:
        if self._round is not None:
            raise ManagerError("another producer (collect_groups / run_episodes / start) is active; stop it first")
        if self._fatal is not None:
            raise self._fatal
        self._round = r
        if self._t0 is None:
            self._t0 = time.perf_counter()

    async def _end(self, r: _Round, reason: str) -> None:
        """Closes the round and cancels (and awaits) every episode still running or queued for it."""
        r.closed = True
        for g in list(r.groups.values()):
            self._finish_group(g, reason)
        r.groups.clear()
        tasks = list(r.reap)
        self._pending = collections.deque(ep for ep in self._pending if ep.group.round is not r)
        if tasks:
            await asyncio.gather(*tasks, return_exceptions=True)
        if self._round is r:
            self._round = None

    async def collect_groups(self, task_source: TaskSource, num_groups: int | None = None) -> list[Group]:
        """Runs one batch: launches ``num_groups + extra_groups`` groups and returns the first ``num_groups`` that
        finish (completion order), each holding the first ``group_size`` finished episodes of its group. Returns
        after every loser was cancelled and its env closed. Returns fewer groups only if the source ran out while
        groups kept failing. Raises :class:`ManagerError` if every worker died."""
        await self.start_workers()
        n = num_groups or self.cfg.num_groups
        gs = self.cfg.group_size
        r = _Round(task_source, gs, gs + self.cfg.extra_per_group, n, deliver_failed=False,
                   to_open=n + self.cfg.extra_groups)
        self._begin(r)
        out: list[Group] = []
        try:
            self._pump()
            while len(out) < n:
                item = await r.out.get()
                if item is None:
                    break
                out.append(item[1])
        finally:
            await self._end(r, "redundant: the batch already has num_groups groups")
        if self._fatal is not None and len(out) < n:
            raise self._fatal
        return out

    async def stream_episodes(self, specs: Iterable[EpisodeSpec]) -> AsyncIterator[tuple[int, Trajectory]]:
        """Runs one episode per spec (no groups, no redundancy) and yields ``(spec index, trajectory)`` as episodes
        finish. A failing episode is retried up to ``max_failures_per_group`` times; after that its last error
        trajectory is yielded."""
        await self.start_workers()
        specs = list(specs)
        r = _Round(specs, 1, 1, len(specs), deliver_failed=True, to_open=len(specs))
        self._begin(r)
        try:
            self._pump()
            for _ in range(len(specs)):
                item = await r.out.get()
                if item is None:
                    break
                yield item[0], item[1].trajectories[0]
        finally:
            await self._end(r, "stopped: stream_episodes was closed")
        if self._fatal is not None:
            raise self._fatal

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
        """Starts continuous production: groups are admitted while the admission rule allows and delivered to
        :meth:`next_group` / :meth:`groups` in completion order, until :meth:`stop`."""
        if not self._started:
            raise ManagerError("call `await manager.start_workers()` (or use `async with`) before start()")
        gs = self.cfg.group_size
        r = _Round(task_source, gs, gs + self.cfg.extra_per_group, None, deliver_failed=False, to_open=None)
        self._begin(r)
        self._cround = r
        self._pump()

    async def next_group(self) -> Group | None:
        """Returns the next finished group of the continuous run, or None when the run ended (source exhausted and
        nothing left running, or stopped)."""
        r = self._cround
        if r is None:
            raise ManagerError("no continuous run was started (call start())")
        while True:
            if r.out.empty() and r.exhausted and not r.groups and not self._pending:
                return None
            try:
                item = await asyncio.wait_for(r.out.get(), 0.5) if r.exhausted else await r.out.get()
            except asyncio.TimeoutError:
                continue
            if item is None:
                if self._fatal is not None:
                    raise self._fatal
                return None
            return item[1]

    async def groups(self) -> AsyncIterator[Group]:
        """Yields the continuous run's groups as they finish (see :meth:`next_group`)."""
        while True:
            g = await self.next_group()
            if g is None:
                return
            yield g

    async def stop(self) -> None:
        """Ends the active producer: cancels its running episodes (closing their envs) and drops queued ones.
        Groups already delivered stay delivered."""
        r = self._round
        if r is not None:
            await self._end(r, "stopped")
            r.out.put_nowait(None)

    # ---- metrics ---------------------------------------------------------------------------------------------
    def metrics(self) -> dict[str, Any]:
        """Returns a snapshot: the counters (started, finished, cancelled, failed, dropped_stale, rescheduled,
        replaced, surplus, accepted, delivered_groups, failed_groups, env_steps, policy_calls, worker_deaths), live
        gauges (running, pending, max_running, version, workers_alive), env step latency percentiles in seconds
        (step_p50_s, step_p90_s, step_p99_s, step_max_s over the last ``latency_window`` steps) and throughput since
        the first episode started (elapsed_s, steps_per_s, episodes_per_s)."""
        m: dict[str, Any] = dict(self.counts)
        m.update(running=len(self._running), held=self._held, pending=len(self._pending), max_running=self.max_running,
                 version=self.version, workers_alive=len(self._live_workers()))
        if self._lat:
            a = np.fromiter(self._lat, dtype=np.float64)
            p50, p90, p99 = np.percentile(a, [50, 90, 99])
            m.update(step_p50_s=float(p50), step_p90_s=float(p90), step_p99_s=float(p99), step_max_s=float(a.max()))
        else:
            m.update(step_p50_s=None, step_p90_s=None, step_p99_s=None, step_max_s=None)
        el = time.perf_counter() - self._t0 if self._t0 is not None else 0.0
        ended = self.counts["finished"] + self.counts["failed"] + self.counts["cancelled"]
        m.update(elapsed_s=el, steps_per_s=self.counts["env_steps"] / el if el > 0 else 0.0,
                 episodes_per_s=ended / el if el > 0 else 0.0)
        return m

    async def worker_stats(self) -> list[dict[str, Any]]:
        """Returns each live worker's host counters (see :meth:`agentrl.workers.EnvHost.stats`)."""
        return list(await asyncio.gather(*(w.stats() for w in self._live_workers())))
