"""The environment manager: thousands of episodes, each its own asyncio task, stepping the moment its action arrives.

Flow of one episode (one task in the driver; :mod:`agentrl.manager.episode`)::

    queued ──admission──> open (create + reset, in the episode's env worker) ──> act (policy, in the driver)
       ──> step (worker) ──> act ──> ... ──> terminated | truncated | error | cancelled ──> close env + session

No lock-step barrier anywhere: an env steps when its own action arrives and the policy is asked when its own
observation arrives. Envs live in env workers (:mod:`agentrl.manager.workers`): ``workers: 0`` hosts them in this process,
``workers: N`` in N Ray actors (each running many envs on its own event loop); episodes go to the least-loaded live
worker. The policy lives in the driver.

Public API (one :class:`EnvManager` per policy; at most one producer — a ``collect_groups`` call, an episode run or
a continuous run — is active at a time)::

    async with EnvManager(ManagerConfig(...), policy) as mgr:
        trajs = await mgr.run_episodes([EpisodeSpec("my/Env-v0", seed=i) for i in range(8)])  # input order
        groups = await mgr.collect_groups(task_source)          # one batch: num_groups groups (sync training)

        mgr.restore(version=k, accepted=k * B)                   # optional: continue a run trained for k steps
        mgr.start(task_source)                                   # continuous mode (async training)
        batch = await mgr.next_batch(num_groups)                 # the groups to train at the current version
        ...; mgr.set_version(v)                                  # trainer moved to version v (after the weight sync)
        await mgr.stop()

Also: ``next_group()`` / ``groups()`` (one group at a time, same selection), ``stream_groups(task_source, n,
extra_groups)`` (``collect_groups`` yielding each group as it completes), ``stream_episodes(specs)`` (async
iterator of ``(spec index, trajectory)`` in finishing order), ``discard(n)``, ``metrics()`` (counters, gauges, step
latency percentiles, throughput), ``worker_stats()``, ``failed`` (recent error trajectories) and ``workers``.

``task_source`` is an iterable (or iterator) of :class:`EpisodeSpec`, or a zero-argument callable returning the next
spec (``None`` when exhausted). Each spec is the prototype of one group: its ``group_size + extra_per_group``
members share ``env_id``, ``env_kwargs``, ``seed`` and ``task`` (the task reaches the env as
``reset(options={"task": task, **spec.options})``).

Groups and redundancy (ROLL Flash, done fully; :mod:`agentrl.manager.groups`): ``collect_groups`` launches
``num_groups + extra_groups`` groups of ``group_size + extra_per_group`` episodes; the first ``group_size`` finished
episodes of a group and the first ``num_groups`` finished groups win. Losers are cancelled for real: the episode task
is cancelled, its env's ``aclose`` is awaited in the worker (a step in flight is cancelled there) and the policy
session's ``aclose`` is awaited; ``collect_groups`` returns only after every loser has been closed. In continuous
mode ``extra_per_group`` applies the same way; ``extra_groups`` has no meaning there. Over-provisioning picks the
fastest members by design, so it biases a batch toward short episodes: leave ``extra_per_group`` at 0 where that
matters. A policy session that raises :class:`~agentrl.manager.episode.GiveUpGroup` ends its group at once (no
retry, siblings cancelled, ``given_up_groups``); a batch round opens another task in its place (tail batching's
length budget, :mod:`agentrl.controller.tail`).

Admission, deadlines and staleness (``async_ratio`` α; :mod:`agentrl.manager.admission` states the rules and their
invariants): a group is opened only while ``accepted`` plus ``group_size`` for every open group and for the new one
stays within ``(α + a + 1)·B`` (AReaL's ``accepted + running < (α + v + 1)·B``, counted in whole groups), where ``a``
is the smaller of the trainer's version (:meth:`EnvManager.set_version`) and the engine's (``policy.version``); a
group admitted at ``a`` is due at step ``a + α`` and :meth:`EnvManager.next_batch` schedules batches earliest
deadline first (waiting for a running group only when a deadline needs it), so no token a trainer sees is more than
α versions old and nothing has to be cancelled for being slow. Episodes, held winners or ready groups that became stale anyway
(tokens older than ``v − α``, e.g. after ``discard``) are cancelled (``stale_policy: cancel``) or dropped at their
end (``drop``), counted in ``dropped_stale``, replaced within their group and charged to its failure budget.
Plain episode runs (``run_episodes``) ignore α.

Faults: an env that raises, exceeds ``step_timeout_s``/``reset_timeout_s``/``episode_timeout_s``, or returns
garbage (wrong tuple shape, a reward that is not a finite real number, bad messages, non-dict info) ends its episode
with termination ``error`` (``Trajectory.error`` holds the failure and a traceback summary); the group gets a
replacement member, up to ``max_failures_per_group`` failed or stale attempts, after which the group is abandoned and
another task is taken from the source. A policy that raises is handled the same way. A dead worker fails its
episodes; they are rescheduled on live workers (``rescheduled``) and, with ``restart_dead_workers``, a new worker
takes its place. Failed attempts are kept in :attr:`EnvManager.failed` (most recent ``failed_history``), never in
groups, and are never scored: ``info["failure_cause"]`` names why (:data:`~agentrl.manager.episode.FAILURE_CAUSES`)
and ``metrics()`` counts them as ``failures/<cause>``. Every trajectory id is unique (``<group id>.<attempt>``) and a finished trajectory is delivered at most once.
Infrastructure failures (an env raising an error whose ``failure_cause`` names its sandbox lost, its engine gone,
its memory or disk limit hit: ``sandbox_lost``, ``sandbox_engine``, ``sandbox_oom``, ``sandbox_disk``) are
counted the same way and retried in a fresh env, hence a fresh sandbox, up to ``infra_retries`` times per member
(``infra_retried``) before they are charged to the failure budget.

Sandbox fleets: :meth:`EnvManager.sandbox_demand` is the most episodes the rules let run at once
(``max_concurrency`` capped by the admission rule's open groups times their members, or a batch round's groups);
:meth:`EnvManager.warm_sandboxes` keeps a :class:`~agentrl.sandboxes.SandboxPool`'s warm pool at that fleet size,
so sandboxes are made before the episodes ask for them (``agentrl.envs.shell:ShellEnv`` takes them from its pool).

Trajectory fields: ``messages`` holds the whole conversation (opening messages, the policy's actions as assistant
messages, env messages), ``rewards`` one reward per step, ``reward`` the sum of step rewards unless the last env
info has ``"episode_reward"`` (then that value), ``info`` the last env info, token fields from
``session.token_record()`` when it is not None, timings ``env_s`` (reset+step as seen by the driver), ``policy_s``
(time in ``act``), ``queue_s`` (queued → episode start) and ``total_s`` (queued → trajectory ready, env closed).
An action with ``context_exhausted`` ends the episode as ``truncated`` without stepping the env (its text, if any,
is kept as the last assistant message and ``info["context_exhausted"]`` is set). Reaching ``max_turns`` actions
ends it as ``truncated`` too. When ``reset``'s info has ``"tools"``, the episode's ``EpisodeMeta`` gets a ``tools``
attribute with that value before the policy's first ``act`` (tool schemas for the chat template).

Modules: :mod:`~agentrl.manager.config` (inputs), :mod:`~agentrl.manager.admission` (the admission policy),
:mod:`~agentrl.manager.groups` (group bookkeeping), :mod:`~agentrl.manager.episode` (one episode's lifecycle),
:mod:`~agentrl.manager.pool` (env workers), :mod:`~agentrl.manager.manager` (:class:`EnvManager`: producers, metrics).
"""

from agentrl.manager.admission import Admission
from agentrl.manager.config import EpisodeConfig, EpisodeSpec, ManagerConfig, ManagerError, TaskSource
from agentrl.manager.manager import EnvManager

__all__ = ["Admission", "EnvManager", "EpisodeConfig", "EpisodeSpec", "ManagerConfig", "ManagerError", "TaskSource"]
