"""Tail batching (RollPacker's idea) for the synchronous, on-policy controller (``async_ratio: 0``).

A rollout batch waits for its slowest trajectory; with a long-tailed length distribution the engine idles on a few
stragglers every step. Tail batching splits the rounds (one round = one trained batch = one step)::

    short round:  launch num_groups + extra_prompts prompts, each response capped at length_budget generated tokens
                  ──> the first num_groups groups whose members all finish within the budget are the batch
                  ──> every other prompt (over budget, or simply not done yet) is aborted and deferred
    long round:   replay num_groups deferred prompts (topped up with fresh ones at the end of a run) without a budget
                  ──> the batch is all of them, however long they run

Invariants
- **Strictly on-policy**: a round runs entirely at one engine version (the controller syncs weights only between
  rounds) and an aborted attempt is discarded, never resumed, so every trained token has staleness 0.
- **Every deferred prompt is trained exactly once**: a prompt leaves the short rounds only by being trained or
  deferred; deferred prompts are replayed in long rounds (first in, first out) and a long round trains every prompt
  it launched (a prompt whose episodes keep failing is dropped as the plain controller drops such a group). The
  planner schedules long rounds early enough that nothing is left deferred after the last step
  (:meth:`TailPlanner.plan`), as long as a short round defers at most ``extra_prompts`` prompts; a short round
  that needs top-up waves (many prompts over budget) may defer more, and what is left at the end of the run stays
  in the checkpoint's open tasks and is trained first on resume.
- **What it biases**: the prompts a short round trains are those whose sampled group happened to finish within the
  budget; the same prompts' long samples are not lost but trained later in a long round from a fresh group, so the
  set of prompts trained is unbiased, while within a short round the samples of a prompt are conditioned on being
  short. RollPacker accepts this; with ``length_budget`` above the median group length it concerns few prompts.

:class:`TailPlanner` decides (pure bookkeeping, driven alone by ``tests/pipeline/test_tail.py``); :class:`TailRounds`
runs rounds on an :class:`~agentrl.manager.EnvManager` (``stream_episodes``, so the manager's retries, worker pool and
cancellation apply); :class:`BudgetPolicy` ends an episode at the budget, mid-turn for the vLLM agent loop
(:attr:`agentrl.rollout.AgentLoopSession.max_new_tokens`), at the end of the turn for other policies.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, field
from typing import Any, Awaitable, Callable

from agentrl.manager import EpisodeSpec
from agentrl.policy import Action, EpisodeMeta, Policy, PolicySession, TokenRecord
from agentrl.trajectory import Group, Trajectory

SHORT, LONG = "short", "long"
OVER_BUDGET = "tail/over_budget"  # set in a trajectory's info when its episode was ended at the length budget


@dataclass
class TailBatchingConfig:
    """Tail batching (see :mod:`agentrl.tail`). ``length_budget``: generated tokens a trajectory may have in a
    short round (all turns together); ``extra_prompts``: prompts a short round launches beyond ``num_groups``."""

    enabled: bool = False
    length_budget: int = 0
    extra_prompts: int = 2

    def validate(self) -> None:
        if not self.enabled:
            return
        if self.length_budget < 1:
            raise ValueError(f"length_budget must be >= 1 generated tokens when tail batching is enabled, got "
                             f"{self.length_budget} (pick one above most responses, e.g. their 75th percentile)")
        if self.extra_prompts < 1:
            raise ValueError(f"extra_prompts must be >= 1, got {self.extra_prompts}: short rounds need prompts to "
                             f"spare, or they wait for the tail like a plain round")


# ------------------------------------------------------------------------------------------------------- planner
@dataclass
class RoundPlan:
    """One round: its ``kind``, the deferred tasks it replays, how many fresh tasks it opens, the groups it trains
    (``need``) and the length budget of its episodes (None: no budget)."""

    kind: str
    replay: list[int]
    fresh: int
    need: int
    budget: int | None


@dataclass
class TailPlanner:
    """Chooses each round's kind and keeps the deferred prompts (first in, first out).

    A round is long when ``num_groups`` prompts are waiting, or when the rounds left could not drain the queue after
    one more short round (each short round may defer ``extra_prompts`` more), so the last round is always long: the
    run ends with nothing deferred when short rounds defer at most ``extra_prompts``. A long round with fewer than
    ``num_groups`` deferred prompts fills up with fresh ones (no budget: a plain synchronous round for them)."""

    num_groups: int
    extra_prompts: int
    length_budget: int
    deferred: deque[int] = field(default_factory=deque)
    short_rounds: int = 0
    long_rounds: int = 0
    deferred_total: int = 0

    def plan(self, steps_left: int) -> RoundPlan:
        """Returns the plan of the next round, ``steps_left`` rounds before the end of the run (this one included)."""
        n, d = self.num_groups, len(self.deferred)
        drain_after_short = math.ceil((d + self.extra_prompts) / n)
        if d >= n or drain_after_short > steps_left - 1:  # (the last round is never short: none would follow)
            replay = [self.deferred.popleft() for _ in range(min(n, d))]
            return RoundPlan(LONG, replay, n - len(replay), n, None)
        return RoundPlan(SHORT, [], n + self.extra_prompts, n, self.length_budget)

    def finished(self, plan: RoundPlan, deferred: list[int]) -> None:
        """Records a completed round and the tasks it deferred. A long round defers nothing unless it was cut off
        (the manager stopped): those tasks go back to the front of the queue."""
        if plan.kind == LONG:
            self.long_rounds += 1
            self.deferred.extendleft(reversed(deferred))
            return
        self.short_rounds += 1
        self.deferred.extend(deferred)
        self.deferred_total += len(deferred)

    def metrics(self) -> dict[str, float]:
        """``tail/short_rounds``, ``tail/long_rounds`` (so far), ``tail/deferred_waiting`` (prompts queued for a long
        round), ``tail/deferred_total`` (prompts deferred so far) and ``tail/length_budget``."""
        return {"tail/short_rounds": float(self.short_rounds), "tail/long_rounds": float(self.long_rounds),
                "tail/deferred_waiting": float(len(self.deferred)), "tail/deferred_total": float(self.deferred_total),
                "tail/length_budget": float(self.length_budget)}


# ------------------------------------------------------------------------------------------------- the budget
class BudgetPolicy(Policy):
    """Wraps the rollout policy: sessions opened while :attr:`budget` is set end their episode once it has generated
    more than ``budget`` tokens (``finish_reason`` ``"budget"``, trajectory info ``tail/over_budget``)."""

    def __init__(self, inner: Policy):
        self.inner = inner
        self.budget: int | None = None

    @property
    def version(self) -> int:
        return self.inner.version

    def session(self, meta: EpisodeMeta) -> PolicySession:
        return _BudgetSession(self.inner.session(meta), self.budget)

    def __getattr__(self, name: str) -> Any:  # metrics(), tools_for(), engine ... of the wrapped policy
        return getattr(self.inner, name)


class _BudgetSession(PolicySession):
    def __init__(self, inner: PolicySession, budget: int | None):
        self.inner, self.budget = inner, budget
        self.generated = 0
        self.over = False

    async def act(self, new_messages: list[Any]) -> Action:
        if self.budget is not None and hasattr(self.inner, "max_new_tokens"):
            # one token past the budget tells an over-budget response from one that ends exactly at it
            self.inner.max_new_tokens = self.budget - self.generated + 1  # type: ignore[attr-defined]
        action = await self.inner.act(new_messages)
        self.generated += len(action.token_ids)
        if self.budget is not None and self.generated > self.budget:
            self.over = True
            return Action(text="", finish_reason="budget", context_exhausted=True)
        return action

    def token_record(self) -> TokenRecord | None:
        rec = self.inner.token_record()
        if rec is not None and self.over:
            rec.info = {**rec.info, OVER_BUDGET: True}
        return rec

    async def aclose(self) -> None:
        await self.inner.aclose()


# ------------------------------------------------------------------------------------------------------- rounds
@dataclass
class RoundResult:
    """What one round produced: the trained ``groups`` (completion order), the ``deferred`` tasks (short rounds),
    the ``failed`` tasks (an episode kept failing: dropped) and counts of the round's episodes."""

    groups: list[Group]
    deferred: list[int]
    failed: list[int]
    launched: int = 0
    over_budget: int = 0
    waves: int = 0


class TailRounds:
    """Runs the controller's rounds with tail batching on ``manager`` (whose policy must be ``budget_policy``).

    ``spec_for(i)`` returns task ``i``'s spec, ``open_task()`` opens a fresh task and returns its index (the
    controller's :class:`~agentrl.pipeline.TaskLedger`)."""

    def __init__(self, manager: Any, budget_policy: BudgetPolicy, planner: TailPlanner, group_size: int,
                 spec_for: Callable[[int], EpisodeSpec], open_task: Callable[[], int]):
        self.mgr, self.policy, self.planner, self.group_size = manager, budget_policy, planner, group_size
        self.spec_for, self.open_task = spec_for, open_task
        self.last: dict[str, float] = {}

    async def next_batch(self, n: int, steps_left: int,
                         on_group: Callable[[Group], Awaitable[None] | None] | None = None) -> list[Group]:
        """Runs one round of ``n`` groups (the planner's ``num_groups``), planned for ``steps_left`` rounds before
        the end, and returns its groups; ``on_group`` is
        called with each group as it is accepted (the streamed trainer). A short round whose launched prompts
        cannot all be accepted (too many over budget) opens another wave of fresh prompts, still at the same
        version, until it has ``need`` groups."""
        if n != self.planner.num_groups:
            raise ValueError(f"tail batching plans rounds of {self.planner.num_groups} groups, asked for {n}")
        plan = self.planner.plan(steps_left)
        tasks = list(plan.replay) + [self.open_task() for _ in range(plan.fresh)]
        res = RoundResult([], [], [])
        while True:
            res.waves += 1
            await self._wave(tasks, plan, res, on_group)
            missing = plan.need - len(res.groups)
            if missing <= 0 or not tasks:
                break
            extra = self.planner.extra_prompts if plan.kind == SHORT else 0
            tasks = [self.open_task() for _ in range(missing + extra)]
        self.planner.finished(plan, res.deferred)
        self.last = {"tail/long_round": float(plan.kind == LONG), "tail/launched": float(res.launched),
                     "tail/over_budget": float(res.over_budget), "tail/deferred": float(len(res.deferred)),
                     "tail/failed": float(len(res.failed)), "tail/waves": float(res.waves),
                     **self.planner.metrics()}
        return res.groups

    async def _wave(self, tasks: list[int], plan: RoundPlan, res: RoundResult,
                    on_group: Callable[[Group], Awaitable[None] | None] | None) -> None:
        gs = self.group_size
        specs = []
        for i in tasks:
            base = self.spec_for(i)
            for j in range(gs):  # one spec per member: its own group id keeps trajectory ids unique
                specs.append(EpisodeSpec(base.env_id, env_kwargs=base.env_kwargs, seed=base.seed, task=base.task,
                                         group_id=f"{base.group_id}~{j}", max_turns=base.max_turns,
                                         options=base.options))
        members: dict[int, list[Trajectory]] = {i: [] for i in tasks}
        out: set[int] = set()  # trained, over budget or failed: no longer wanted
        done: set[int] = set()
        self.policy.budget = plan.budget
        res.launched += len(specs)
        stream = self.mgr.stream_episodes(specs)
        try:
            async for k, traj in stream:
                i = tasks[k // gs]
                if i in out:
                    continue
                if traj.termination in ("error", "cancelled"):
                    out.add(i)
                    res.failed.append(i)
                elif (traj.info or {}).get(OVER_BUDGET):
                    out.add(i)
                    res.over_budget += 1
                else:
                    traj.group_id = self.spec_for(i).group_id
                    members[i].append(traj)
                    if len(members[i]) == gs:
                        g = Group(traj.group_id, members.pop(i))
                        res.groups.append(g)
                        out.add(i)
                        done.add(i)
                        if on_group is not None:
                            got = on_group(g)
                            if got is not None:
                                await got
                        if len(res.groups) >= plan.need:
                            break
        finally:
            self.policy.budget = None
            await stream.aclose()  # cancels what still runs and closes its envs
        res.deferred += [i for i in tasks if i not in done and i not in res.failed]
