"""Group-relative advantage estimators (one scalar per trajectory; the loss broadcasts it to the tokens).

- GRPO:          ``A_i = (R_i - mean_g R) / (std_g R + eps)``
- GRPO, no std:  ``A_i = R_i - mean_g R`` (Dr. GRPO's unbiased form)
- RLOO:          ``A_i = R_i - mean_{j != i} R_j`` (leave-one-out baseline)

A group of one trajectory carries no baseline information: every estimator returns 0.0 for it.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from agentrl.trainer.config import AdvantageConfig
from agentrl.trajectory import Group, Trajectory


def group_advantages(rewards: Sequence[float], cfg: AdvantageConfig) -> list[float]:
    """Returns one advantage per reward of a single group, in order. Rewards must be finite."""
    r = [float(x) for x in rewards]
    for i, x in enumerate(r):
        if not math.isfinite(x):
            raise ValueError(f"reward[{i}] is not finite: {x}")
    n = len(r)
    if n <= 1:
        return [0.0] * n
    total = sum(r)
    mean = total / n
    if cfg.estimator == "rloo":
        # mean_{j != i} R_j = (total - R_i) / (n - 1)
        return [x - (total - x) / (n - 1) for x in r]
    centred = [x - mean for x in r]
    if cfg.estimator == "grpo_no_std":
        return centred
    denom = (n - 1) if cfg.std_unbiased else n
    std = math.sqrt(sum(c * c for c in centred) / denom)
    return [c / (std + cfg.eps) for c in centred]


def compute_advantages(
    trajectories: Sequence[Trajectory] | Sequence[Group], cfg: AdvantageConfig
) -> list[float]:
    """Returns one advantage per trajectory, aligned with the flattened input.

    Given :class:`Group` objects, each group is one advantage group and the output follows
    ``[t for g in groups for t in g.trajectories]``. Given trajectories, they are grouped by ``group_id`` (order
    inside a group does not matter) and the output is aligned with the input list.
    """
    if trajectories and isinstance(trajectories[0], Group):
        out: list[float] = []
        for g in trajectories:  # type: ignore[assignment]
            out.extend(group_advantages([t.reward for t in g.trajectories], cfg))
        return out
    by_group: dict[str, list[int]] = {}
    for i, t in enumerate(trajectories):  # type: ignore[assignment]
        by_group.setdefault(t.group_id, []).append(i)
    adv = [0.0] * len(trajectories)
    for idx in by_group.values():
        vals = group_advantages([trajectories[i].reward for i in idx], cfg)  # type: ignore[union-attr]
        for i, a in zip(idx, vals):
            adv[i] = a
    return adv
