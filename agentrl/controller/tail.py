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
  it launched (a prompt whose episodes keep failing is dropped, and closed for good, as the plain controller drops
  such a group: :mod:`agentrl.controller.ledger`). The
  planner schedules long rounds early enough that nothing is left deferred after the last step
  (:meth:`TailPlanner.plan`) unless a late short round defers more than any before it (a short round defers
  ``extra_prompts`` plus one per group given up on the way); what is left then stays in the checkpoint's open tasks
  (``tail/deferred_waiting``) and is trained first on resume.
- **What it biases**: the prompts a short round trains are those whose sampled group happened to finish within the
  budget; the same prompts' long samples are not lost but trained later in a long round from a fresh group, so the
  set of prompts trained is unbiased, while within a short round the samples of a prompt are conditioned on being
  short. That is inherent to tail batching; with ``length_budget`` above most groups' longest member it concerns few
  prompts (``tail/deferred`` counts them).

:class:`TailPlanner` decides (pure bookkeeping, driven alone by ``tests/controller/test_schedulers.py``);
:class:`TailRounds` runs rounds on an :class:`~agentrl.manager.EnvManager` (``stream_groups``, so the manager's groups, retries, worker
pool and cancellation apply); :class:`BudgetPolicy` ends an episode at the budget and gives its group up, mid-turn
for the vLLM agent loop (:attr:`agentrl.agent.loop.AgentLoopSession.max_new_tokens`), at the end of the turn for other
policies.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, field
from typing import Any, Awaitable, Callable

from agentrl.manager import EpisodeSpec
from agentrl.manager.episode import GiveUpGroup
from agentrl.policy import Action, EpisodeMeta, Policy, PolicySession, TokenRecord
from agentrl.trajectory import Group

SHORT, LONG = "short", "long"


@dataclass
class TailBatchingConfig:
    """Tail batching (see :mod:`agentrl.controller.tail`). ``length_budget``: generated tokens a trajectory may have in a
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
    one more short round deferring as many as the most any short round deferred so far (at least ``extra_prompts``),
    so the last round is always long, and the run ends with nothing deferred unless a late short round defers more
    than any before it. A long round with fewer than
    ``num_groups`` deferred prompts fills up with fresh ones (no budget: a plain synchronous round for them)."""

    num_groups: int
    extra_prompts: int
    length_budget: int
    deferred: deque[int] = field(default_factory=deque)
    short_rounds: int = 0
    long_rounds: int = 0
    deferred_total: int = 0
    dropped: int = 0
    max_deferred: int = 0  # the most one short round deferred so far (at least extra_prompts)

    def __post_init__(self) -> None:
        self.max_deferred = max(self.max_deferred, self.extra_prompts)

    def plan(self, steps_left: int) -> RoundPlan:
        """Returns the plan of the next round, ``steps_left`` rounds before the end of the run (this one included)."""
        n, d = self.num_groups, len(self.deferred)
        drain_after_short = math.ceil((d + self.max_deferred) / n)
        if d >= n or drain_after_short > steps_left - 1:  # (the last round is never short: none would follow)
            replay = [self.deferred.popleft() for _ in range(min(n, d))]
            return RoundPlan(LONG, replay, n - len(replay), n, None)
        return RoundPlan(SHORT, [], n + self.extra_prompts, n, self.length_budget)

    def finished(self, plan: RoundPlan, deferred: list[int]) -> None:
        """Records a completed round and the tasks it did not train: a short round defers them, a long round drops
        them (groups that kept failing: the plain controller drops such groups too)."""
        if plan.kind == LONG:
            self.long_rounds += 1
            self.dropped += len(deferred)
            return
        self.short_rounds += 1
        self.max_deferred = max(self.max_deferred, len(deferred))
        self.deferred.extend(deferred)
        self.deferred_total += len(deferred)

    def metrics(self) -> dict[str, float]:
        """``tail/short_rounds``, ``tail/long_rounds`` (so far), ``tail/deferred_waiting`` (prompts queued for a long
        round), ``tail/deferred_total`` (prompts deferred so far) and ``tail/length_budget``."""
        return {"tail/short_rounds": float(self.short_rounds), "tail/long_rounds": float(self.long_rounds),
                "tail/deferred_waiting": float(len(self.deferred)), "tail/deferred_total": float(self.deferred_total),
                "tail/dropped": float(self.dropped),
                "tail/length_budget": float(self.length_budget)}


# ------------------------------------------------------------------------------------------------- the budget
class BudgetPolicy(Policy):
    """Wraps the rollout policy: a session opened while :attr:`budget` is set gives its group up
    (:class:`~agentrl.manager.episode.GiveUpGroup`) as soon as its episode has generated more than ``budget``
    tokens; :attr:`over_budget` counts those episodes."""

    def __init__(self, inner: Policy):
        self.inner = inner
        self.budget: int | None = None
        self.over_budget = 0

    @property
    def version(self) -> int:
        return self.inner.version

    def session(self, meta: EpisodeMeta) -> PolicySession:
        return _BudgetSession(self, self.inner.session(meta), self.budget)

    def __getattr__(self, name: str) -> Any:  # metrics(), tools_for(), engine ... of the wrapped policy
        return getattr(self.inner, name)


class _BudgetSession(PolicySession):
    def __init__(self, owner: BudgetPolicy, inner: PolicySession, budget: int | None):
        self.owner, self.inner, self.budget = owner, inner, budget
        self.generated = 0

    async def act(self, new_messages: list[Any]) -> Action:
        if self.budget is not None and hasattr(self.inner, "max_new_tokens"):
            # one token past the budget tells an over-budget response from one that ends exactly at it
            self.inner.max_new_tokens = self.budget - self.generated + 1  # type: ignore[attr-defined]
        action = await self.inner.act(new_messages)
        self.generated += len(action.token_ids)
        if self.budget is not None and self.generated > self.budget:
            self.owner.over_budget += 1
            raise GiveUpGroup(f"{self.generated} generated tokens > tail_batching.length_budget {self.budget}")
        return action

    def token_record(self) -> TokenRecord | None:
        return self.inner.token_record()

    async def aclose(self) -> None:
        await self.inner.aclose()


# ------------------------------------------------------------------------------------------------------- rounds
class TailRounds:
    """Runs the controller's rounds with tail batching on ``manager`` (whose policy must be ``budget_policy``, and
    whose ``async_ratio`` is None: a round's over-provisioned groups are not admission-counted; rounds are on-policy
    by construction). A round is one :meth:`~agentrl.manager.EnvManager.stream_groups`: a short round launches
    ``num_groups + extra_prompts`` fresh tasks and opens another fresh one whenever a group is given up (a member
    past the budget, or failing), so the engine keeps ``extra_prompts`` groups to spare until ``num_groups`` are
    complete; then the rest is cancelled. A long round streams its replayed tasks (then fresh ones, should a group
    fail) with no budget.

    ``spec_for(i)`` returns task ``i``'s spec, ``open_task()`` opens a fresh task and returns its index (None: no
    task left), ``drop(ids)`` closes the tasks a long round could not train (the controller's
    :class:`~agentrl.controller.ledger.TaskLedger`)."""

    def __init__(self, manager: Any, budget_policy: BudgetPolicy, planner: TailPlanner,
                 spec_for: Callable[[int], EpisodeSpec], open_task: Callable[[], int | None],
                 drop: Callable[[list[int]], None] | None = None):
        self.mgr, self.policy, self.planner = manager, budget_policy, planner
        self.spec_for, self.open_task, self.drop = spec_for, open_task, drop
        self.last: dict[str, float] = {}

    async def next_batch(self, n: int, steps_left: int,
                         on_group: Callable[[Group], Awaitable[None] | None] | None = None) -> list[Group]:
        """Runs one round of ``n`` groups (the planner's ``num_groups``), planned for ``steps_left`` rounds before
        the end, and returns its groups in completion order; ``on_group`` is called with each as it completes (the
        streamed trainer)."""
        if n != self.planner.num_groups:
            raise ValueError(f"tail batching plans rounds of {self.planner.num_groups} groups, asked for {n}")
        plan = self.planner.plan(steps_left)
        replay = deque(plan.replay)
        pulled: list[int] = []

        def source() -> EpisodeSpec | None:
            i = replay.popleft() if replay else self.open_task()
            if i is None:
                return None
            pulled.append(i)
            return self.spec_for(i)

        over0, given0 = self.policy.over_budget, self.mgr.counts.get("given_up_groups", 0)
        groups: list[Group] = []
        self.policy.budget = plan.budget
        stream = self.mgr.stream_groups(source, plan.need, extra_groups=len(plan.replay) + plan.fresh - plan.need)
        try:
            async for g in stream:
                groups.append(g)
                if on_group is not None:
                    got = on_group(g)
                    if got is not None:
                        await got
        finally:
            self.policy.budget = None
            await stream.aclose()
        done = {g.id for g in groups}
        deferred = [i for i in pulled if self.spec_for(i).group_id not in done]
        self.planner.finished(plan, deferred)
        if plan.kind == LONG and deferred and self.drop is not None:
            self.drop(deferred)
        self.last = {"tail/long_round": float(plan.kind == LONG), "tail/launched_groups": float(len(pulled)),
                     "tail/over_budget": float(self.policy.over_budget - over0),
                     "tail/given_up_groups": float(self.mgr.counts.get("given_up_groups", 0) - given0),
                     "tail/deferred": float(len(deferred) if plan.kind == SHORT else 0),
                     **self.planner.metrics()}
        return groups
