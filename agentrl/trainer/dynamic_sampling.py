"""Dynamic sampling (DAPO, Yu et al. 2025): leave out of the update the groups that carry no learning signal.

A group whose members all get the same reward has zero group-relative advantage everywhere, yet costs a full
forward and backward. :func:`filter_groups` splits a batch of groups into those that carry signal and those that do
not, by the configured estimator:

- trajectory-level estimators (``grpo``, ``grpo_no_std``, ``rloo``): DAPO's rule, the spread of the episode
  rewards ``max R - min R`` is at most ``tol``;
- turn-level estimators (``turn_return``, ``gigpo``): equal episode rewards can still leave per-turn signal
  (different intermediate rewards, different returns from one env state), so a group is left out only when every
  per-turn advantage the estimator gives it is at most ``tol`` in magnitude.

A group of one member has no baseline and is always left out. The filter only decides; replacing the dropped
groups by new ones (up to a bound, within the staleness bound, recording the dropped tasks as consumed in the task
ledger) is the controller's job.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

from agentrl.trainer.advantages import compute_advantages
from agentrl.trainer.config import TURN_ESTIMATORS, AdvantageConfig
from agentrl.trajectory import Group


@dataclass
class FilteredGroups:
    """The outcome of :func:`filter_groups`: ``kept`` and ``dropped`` in their input order."""

    kept: list[Group] = field(default_factory=list)
    dropped: list[Group] = field(default_factory=list)

    @property
    def num_dropped(self) -> int:
        return len(self.dropped)

    def metrics(self) -> dict[str, float]:
        """``dynamic_sampling/{groups_kept,groups_dropped,drop_frac}``."""
        total = len(self.kept) + len(self.dropped)
        return {
            "dynamic_sampling/groups_kept": float(len(self.kept)),
            "dynamic_sampling/groups_dropped": float(len(self.dropped)),
            "dynamic_sampling/drop_frac": len(self.dropped) / total if total else 0.0,
        }


def carries_signal(group: Group, cfg: AdvantageConfig, tol: float = 1e-9) -> bool:
    """Whether ``group`` gives the estimator of ``cfg`` anything to learn from (see module docstring)."""
    if len(group.trajectories) <= 1:
        return False
    if cfg.estimator not in TURN_ESTIMATORS:
        rewards = [float(r) for r in group.rewards]
        bad = [t.id for t, r in zip(group.trajectories, rewards) if not math.isfinite(r)]
        if bad:
            raise ValueError(f"group {group.id}: trajectory {bad[0]} has a non-finite reward")
        return max(rewards) - min(rewards) > tol
    for adv in compute_advantages([group], cfg):
        values = adv if isinstance(adv, list) else [adv]
        if any(abs(v) > tol for v in values):
            return True
    return False


def filter_groups(groups: Sequence[Group], cfg: AdvantageConfig, tol: float = 1e-9) -> FilteredGroups:
    """Splits ``groups`` into those that carry signal (``kept``) and those that do not (``dropped``). Raises
    ``ValueError`` if ``tol`` is negative or a reward is not finite (as the estimators do)."""
    if not tol >= 0:
        raise ValueError(f"tol must be >= 0, got {tol}")
    out = FilteredGroups()
    for g in groups:
        (out.kept if carries_signal(g, cfg, tol) else out.dropped).append(g)
    return out
