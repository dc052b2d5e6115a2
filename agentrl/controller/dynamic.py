"""Dynamic sampling (DAPO) in the controller: groups that carry no learning signal are left out of the update and
replaced by new ones, up to a bound per step.

Which groups carry no signal is the trainer's rule (:func:`agentrl.trainer.dynamic_sampling.filter_groups`: equal
rewards for trajectory-level estimators, all-zero per-turn advantages for turn-level ones). Per step:

1. take the step's ``n`` groups from the batch source;
2. leave out those without signal; while fewer than ``n`` are kept and the step's ``max_extra_groups`` are not
   spent, hand the left-out groups' admission budget back to the manager (``EnvManager.discard``: admission may
   start as many trajectories again) and take that many more groups from the source.

Invariants. The staleness bound holds: every group comes from the same source under the same admission rule and
deadlines. The trajectories the step consumes from admission stay ``n * group_size`` (what a resumed run restores),
since each replacement group is paid for by a discarded one. Every task is closed once: a kept group's task is
trained, a left-out group's task is dropped (listed in the metrics row's ``dropped_tasks``, never replayed). A step
with fewer than ``n`` kept groups trains on those; a step in which no group carries signal trains on the last ``n``
left out (no policy-gradient signal, but the version moves on and every consumed task is accounted for).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from agentrl.trajectory import Group


@dataclass
class DynamicSamplingConfig:
    """``enabled``: leave zero-signal groups out of the update (see :mod:`agentrl.controller.dynamic`);
    ``max_extra_groups``: groups a step may take beyond ``num_groups`` to replace them (>= 0; 0 only filters)."""

    enabled: bool = False
    max_extra_groups: int = 8

    def validate(self) -> None:
        if self.max_extra_groups < 0:
            raise ValueError(f"max_extra_groups must be >= 0, got {self.max_extra_groups}")


class DynamicBatches:
    """A batch source that applies dynamic sampling to ``source`` (same ``next_batch`` API, no ``on_group``)."""

    def __init__(self, source: Any, manager: Any, advantage: Any, cfg: DynamicSamplingConfig) -> None:
        self.source, self.mgr, self.advantage, self.cfg = source, manager, advantage, cfg
        self.left_out: list[Group] = []  # the last step's groups left out of the update (their tasks are dropped)
        self._last: dict[str, float] = {}

    @property
    def last(self) -> dict[str, float]:
        return {**getattr(self.source, "last", {}), **self._last}

    async def next_batch(self, n: int, steps_left: int = 1, on_group: Any = None) -> list[Group]:
        from agentrl.trainer.dynamic_sampling import filter_groups

        if on_group is not None:
            raise ValueError("dynamic sampling does not stream groups (refused by the config: streaming)")
        batch = await self.source.next_batch(n, steps_left)
        kept: list[Group] = []
        left_out: list[Group] = []
        extra, taken = self.cfg.max_extra_groups, len(batch)
        while True:
            f = filter_groups(batch, self.advantage)
            kept += f.kept
            left_out += f.dropped
            missing = n - len(kept)
            if missing <= 0 or extra <= 0 or not batch or not left_out:
                break
            k = min(missing, extra, len(left_out))
            extra -= k
            # each replacement is paid for by a left-out group's budget, so the step consumes n groups' worth
            self.mgr.discard(sum(len(g.trajectories) for g in left_out[-k:]))
            batch = await self.source.next_batch(k, steps_left)
            taken += len(batch)
        if not kept:
            kept, left_out = left_out[-n:], left_out[:-n]
        self.left_out = left_out
        self._last = {"dynamic_sampling/groups_kept": float(len(kept)),
                      "dynamic_sampling/groups_left_out": float(len(left_out)),
                      "dynamic_sampling/groups_taken": float(taken)}
        return kept
