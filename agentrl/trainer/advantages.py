"""Group-relative advantage estimators, selected by ``trainer.advantage.estimator``.

Trajectory level (one scalar per trajectory; the loss broadcasts it to every generated token):

- ``grpo``:          ``A_i = (R_i - mean_g R) / (std_g R + eps)``
- ``grpo_no_std``:   ``A_i = R_i - mean_g R`` (Dr. GRPO's unbiased form)
- ``rloo``:          ``A_i = R_i - mean_{j != i} R_j`` (leave-one-out baseline)

Turn level (a list with one advantage per turn of the trajectory; the maths and the bias argument are in
:mod:`agentrl.trainer.turn_credit`):

- ``turn_return``:   discounted return-to-go from the per-step rewards minus a leave-one-out baseline taken at the
  same turn index over all members (finished ones contribute 0): unbiased when episodes end at different turns.
- ``gigpo``:         GRPO over episode rewards plus ``step_weight`` times a step-level GRPO over the turns taken from
  the same env state (``Trajectory.info["state_keys"]``).

Turns. A turn is the span of tokens the policy generated for one assistant action: a maximal run of
``loss_mask == 1`` inside one segment (:func:`turn_spans`). Turn ``k`` is matched to env step ``k``
(``Trajectory.rewards[k]``); a trajectory has ``max(spans, steps)`` turns, a generation the env never stepped (the
context ran out) counting as a turn with step reward 0. :func:`token_advantages` spreads a per-turn list over the
tokens; a list whose length is not the number of spans is refused there (batching drops that trajectory).

A group of one trajectory carries no baseline information: every estimator returns 0 for it.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Sequence
from typing import Any, Union

from agentrl.trainer.config import TURN_ESTIMATORS, AdvantageConfig
from agentrl.trainer.turn_credit import gigpo_advantages, turn_return_advantages
from agentrl.trajectory import Group, Trajectory

log = logging.getLogger(__name__)

Advantage = Union[float, list[float]]
"""One trajectory's advantage: a scalar for all its generated tokens, or one value per turn."""


def group_advantages(rewards: Sequence[float], cfg: AdvantageConfig) -> list[float]:
    """Returns one trajectory-level advantage per reward of a single group, in order (``grpo``, ``grpo_no_std``,
    ``rloo``; the turn-level estimators use ``grpo`` here for their episode term). Rewards must be finite."""
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


def turn_spans(t: Trajectory) -> list[tuple[int, int]]:
    """``(start, end)`` token indices of each turn of ``t``: maximal runs of ``loss_mask == 1``, never crossing a
    segment boundary, in order."""
    out: list[tuple[int, int]] = []
    for a, b in t.segment_slices():
        start = None
        for i in range(a, b):
            if t.loss_mask[i] == 1:
                if start is None:
                    start = i
            elif start is not None:
                out.append((start, i))
                start = None
        if start is not None:
            out.append((start, b))
    return out


def num_turns(t: Trajectory) -> int:
    """Turns of ``t`` for the turn-level estimators: generated spans or env steps, whichever is more."""
    return max(len(turn_spans(t)), len(t.rewards))


def token_advantages(t: Trajectory, adv: Sequence[float]) -> list[float]:
    """Per-token advantages of ``t`` from one value per turn: turn ``k``'s value on its span, 0 on every token the
    policy did not generate. Raises ``ValueError`` (naming the trajectory) unless ``len(adv)`` is the number of
    turn spans and every value is finite."""
    spans = turn_spans(t)
    if len(adv) != len(spans):
        raise ValueError(f"trajectory {t.id}: {len(adv)} turn advantages for {len(spans)} generated turns")
    out = [0.0] * len(t.token_ids)
    for k, ((a, b), v) in enumerate(zip(spans, adv)):
        v = float(v)
        if not math.isfinite(v):
            raise ValueError(f"trajectory {t.id}: turn advantage [{k}] is not finite: {v}")
        out[a:b] = [v] * (b - a)
    return out


def _state_keys(t: Trajectory) -> list[Any]:
    keys = t.info.get("state_keys") if isinstance(t.info, dict) else None
    if keys is None:
        return []
    if not isinstance(keys, list):
        log.warning("trajectory %s: info['state_keys'] is a %s, not a list: no step groups for it", t.id,
                    type(keys).__name__)
        return []
    return keys


def _turn_group(trajs: Sequence[Trajectory], cfg: AdvantageConfig) -> list[list[float]]:
    steps = []
    for t in trajs:
        n = num_turns(t)
        steps.append([float(r) for r in t.rewards] + [0.0] * (n - len(t.rewards)))
    if cfg.estimator == "turn_return":
        return turn_return_advantages(steps, cfg.gamma)
    episode = group_advantages([t.reward for t in trajs], AdvantageConfig(eps=cfg.eps, std_unbiased=cfg.std_unbiased))
    return gigpo_advantages(episode, steps, [_state_keys(t) for t in trajs], cfg.gamma, cfg.step_weight,
                            eps=cfg.eps, std_unbiased=cfg.std_unbiased)


def _one_group(trajs: Sequence[Trajectory], cfg: AdvantageConfig) -> list[Advantage]:
    if cfg.estimator in TURN_ESTIMATORS:
        return list(_turn_group(trajs, cfg))
    return list(group_advantages([t.reward for t in trajs], cfg))


def compute_advantages(
    trajectories: Sequence[Trajectory] | Sequence[Group], cfg: AdvantageConfig
) -> list[Advantage]:
    """Returns one advantage per trajectory (a float, or a per-turn list for the turn-level estimators), aligned
    with the flattened input.

    Given :class:`Group` objects, each group is one advantage group and the output follows
    ``[t for g in groups for t in g.trajectories]``. Given trajectories, they are grouped by ``group_id`` (order
    inside a group does not matter) and the output is aligned with the input list.
    """
    if trajectories and isinstance(trajectories[0], Group):
        out: list[Advantage] = []
        for g in trajectories:  # type: ignore[assignment]
            out.extend(_one_group(g.trajectories, cfg))
        return out
    by_group: dict[str, list[int]] = {}
    for i, t in enumerate(trajectories):  # type: ignore[assignment]
        by_group.setdefault(t.group_id, []).append(i)
    adv: list[Advantage] = [0.0] * len(trajectories)
    for idx in by_group.values():
        vals = _one_group([trajectories[i] for i in idx], cfg)  # type: ignore[misc]
        for i, a in zip(idx, vals):
            adv[i] = a
    return adv


def as_advantage(a: Any) -> Advantage:
    """A caller's advantage (a number, or a list, tuple or 1-D array of per-turn values) as a float or a list of
    floats, what crosses to the ranks. Raises ``ValueError`` for anything else."""
    try:
        if isinstance(a, (list, tuple)):
            return [float(x) for x in a]
        if hasattr(a, "tolist") and getattr(a, "ndim", 0) == 1:
            return [float(x) for x in a.tolist()]
        return float(a)
    except (TypeError, ValueError) as e:
        raise ValueError(f"an advantage must be a number or a list of per-turn numbers, got {a!r:.80}") from e
