"""Per-turn advantage estimators: one advantage per turn (assistant action) of each trajectory of a group.

Notation. A group holds ``n`` trajectories of one task; trajectory ``i`` has ``T_i`` turns and step rewards
``r_{i,0..T_i-1}`` (``Trajectory.rewards``: the ``reward`` the env's ``step`` returned for that turn's action).
The discounted return-to-go from turn ``k`` is ``G_{i,k} = sum_{j=k}^{T_i-1} gamma^(j-k) r_{i,j}``; past the end of
an episode (``k >= T_i``) it is ``0``: a finished episode earns nothing more (its terminal value).

``turn_return`` (discounted per-turn returns, leave-one-out baseline at the same turn index over ALL members)::

    A_{i,k} = G_{i,k} - b_{i,k},    b_{i,k} = 1/(n-1) * sum_{j != i} G_{j,k}   (G_{j,k} = 0 when k >= T_j)

Why it is unbiased when episodes end at different turns. The policy gradient with reward-to-go is
``E[sum_{k<T_i} grad log pi(a_{i,k} | h_{i,k}) G_{i,k}]``. Subtracting ``b`` adds
``E[sum_{k<T_i} grad log pi(a_{i,k} | h_{i,k}) b_{i,k}]``, which is zero term by term when ``b_{i,k}`` does not depend
on ``a_{i,k}`` given the history ``h_{i,k}``: whether turn ``k`` exists (``k < T_i``) is decided by the history,
and ``b_{i,k}`` is built from the other members only (independent rollouts), each contributing at every turn index
whether it is still running or not. Nothing in the baseline depends on where trajectory ``i`` itself stops.

The biased alternative (MT-GRPO-style per-turn-index normalisation, see verl RFC #7244): normalise each turn's
*reward* over the members still running at that turn index, ``r~_{i,j} = r_{i,j} - mean_{m running at j} r_{m,j}``,
and sum the normalised rewards to go, ``A_{i,k} = sum_{j=k}^{T_i-1} gamma^(j-k) r~_{i,j}``. That subtracts
``sum_{j=k}^{T_i-1} gamma^(j-k) mean_j``: a baseline whose *number of terms is set by the trajectory's own stopping
turn* ``T_i``, hence action-dependent. Every "take another turn" decision is charged the group's mean
intermediate reward of that turn, a hidden length penalty (or bonus, for negative rewards) whenever the policy
controls termination. ``tests/trainer/test_turn_credit.py`` reproduces it on a synthetic stop-or-continue
policy, where the expected gradient of this rule differs from the exact one while ``turn_return``'s does not.

``gigpo`` (GiGPO, Feng et al. 2025: group in group). Episode level: ``A^E_i`` is GRPO over the episode rewards
(``Trajectory.reward``) of the group. Step level: the turns of the group's trajectories taken from the same env
state (the same *state key*, as the env identifies it) form a step group ``S``; within it
``A^S_{i,k} = (G_{i,k} - mean_S G) / (std_S G + eps)``, and ``0`` for a turn alone in its step group (no
comparison) or without a key. The turn's advantage is ``A_{i,k} = A^E_i + step_weight * A^S_{i,k}``. The step-level
term compares actions taken from one state, so its baseline depends on the state, not the action (the usual
state-dependent baseline); its std normalisation, like GRPO's, rescales per group.

State keys: the trainer reads ``Trajectory.info["state_keys"]``, a list with one key per turn: the key of the state
the turn's action was taken in (turn 0: the state after reset). The manager collects them from the
``info["state_key"]`` an env reports in ``reset`` and every ``step`` (see :mod:`agentrl.core`).
Keys are compared by value (strings and numbers as they are; other JSON values by their canonical JSON text).
"""

from __future__ import annotations

import json
import math
from collections.abc import Hashable, Sequence
from typing import Any


def returns_to_go(rewards: Sequence[float], gamma: float, length: int | None = None) -> list[float]:
    """``G_k = sum_{j >= k} gamma^(j-k) r_j`` for ``k < length`` (default ``len(rewards)``); past the rewards, 0."""
    n = len(rewards) if length is None else length
    out = [0.0] * n
    acc = 0.0
    for k in range(len(rewards) - 1, -1, -1):
        acc = float(rewards[k]) + gamma * acc
        if k < n:
            out[k] = acc
    return out


def _check_finite(rewards: Sequence[Sequence[float]]) -> None:
    for i, rs in enumerate(rewards):
        for k, r in enumerate(rs):
            if not math.isfinite(float(r)):
                raise ValueError(f"member {i}: step reward [{k}] is not finite: {r}")


def turn_return_advantages(step_rewards: Sequence[Sequence[float]], gamma: float = 1.0) -> list[list[float]]:
    """One advantage per turn of each member of one group (``turn_return``, see module docstring): discounted
    return-to-go minus the leave-one-out mean, over all other members, of their (zero-padded) return-to-go at the
    same turn index. A group of one has no baseline: zeros."""
    _check_finite(step_rewards)
    n = len(step_rewards)
    if n <= 1:
        return [[0.0] * len(rs) for rs in step_rewards]
    horizon = max((len(rs) for rs in step_rewards), default=0)
    g = [returns_to_go(rs, gamma, horizon) for rs in step_rewards]
    totals = [sum(g[j][k] for j in range(n)) for k in range(horizon)]
    return [[g[i][k] - (totals[k] - g[i][k]) / (n - 1) for k in range(len(step_rewards[i]))] for i in range(n)]


def _key(k: Any) -> Hashable | None:
    if k is None:
        return None
    if isinstance(k, (str, int, float, bool)):
        return (type(k).__name__, k)
    return ("json", json.dumps(k, sort_keys=True, default=str))


def gigpo_step_advantages(step_rewards: Sequence[Sequence[float]], state_keys: Sequence[Sequence[Any]],
                          gamma: float = 1.0, *, eps: float = 1e-6, std_unbiased: bool = True) -> list[list[float]]:
    """The step-level term ``A^S`` of GiGPO for one group (see module docstring): turns are grouped by state key
    across all members; a turn without a key (``None`` or past the end of its member's key list) or alone in its
    step group gets 0."""
    _check_finite(step_rewards)
    g = [returns_to_go(rs, gamma) for rs in step_rewards]
    groups: dict[Hashable, list[tuple[int, int]]] = {}
    for i, rs in enumerate(step_rewards):
        keys = state_keys[i] if i < len(state_keys) else []
        for k in range(len(rs)):
            key = _key(keys[k]) if k < len(keys) else None
            if key is not None:
                groups.setdefault(key, []).append((i, k))
    out = [[0.0] * len(rs) for rs in step_rewards]
    for members in groups.values():
        m = len(members)
        if m <= 1:
            continue
        vals = [g[i][k] for i, k in members]
        mean = sum(vals) / m
        std = math.sqrt(sum((v - mean) ** 2 for v in vals) / ((m - 1) if std_unbiased else m))
        for (i, k), v in zip(members, vals):
            out[i][k] = (v - mean) / (std + eps)
    return out


def gigpo_advantages(episode_advantages: Sequence[float], step_rewards: Sequence[Sequence[float]],
                     state_keys: Sequence[Sequence[Any]], gamma: float = 1.0, step_weight: float = 1.0, *,
                     eps: float = 1e-6, std_unbiased: bool = True) -> list[list[float]]:
    """GiGPO per turn: ``A^E_i + step_weight * A^S_{i,k}`` with the episode-level advantages given (GRPO over the
    group's episode rewards, computed by the caller)."""
    if len(episode_advantages) != len(step_rewards):
        raise ValueError(f"{len(episode_advantages)} episode advantages for {len(step_rewards)} members")
    step = gigpo_step_advantages(step_rewards, state_keys, gamma, eps=eps, std_unbiased=std_unbiased)
    return [[float(a) + step_weight * s for s in row] for a, row in zip(episode_advantages, step)]
