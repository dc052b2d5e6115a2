"""The turn-level advantage estimators: hand-computed cases, selection by config, and the bias of per-turn-index
normalisation over running members that ``turn_return`` avoids (pure Python, no model)."""

from __future__ import annotations

import math
import random

import numpy as np
import pytest

from agentrl.config import ConfigError, from_dict
from agentrl.trainer.advantages import compute_advantages, num_turns
from agentrl.trainer.config import AdvantageConfig, TrainerConfig
from agentrl.trainer.turn_credit import (
    gigpo_advantages, gigpo_step_advantages, returns_to_go, turn_return_advantages,
)
from agentrl.trajectory import Group, Trajectory

R2 = math.sqrt(0.5)  # (1 - 0.5) / std([1, 0]) with the sample std


def _close(got: list[list[float]], want: list[list[float]]) -> bool:
    assert [len(r) for r in got] == [len(r) for r in want], (got, want)
    return all(x == pytest.approx(y, abs=1e-9) for g, w in zip(got, want) for x, y in zip(g, w))


def test_returns_to_go() -> None:
    assert returns_to_go([1.0, 2.0, 4.0], 0.5) == [1 + 0.5 * (2 + 0.5 * 4), 2 + 0.5 * 4, 4.0]
    assert returns_to_go([1.0], 1.0, length=3) == [1.0, 0.0, 0.0]


def test_turn_return_by_hand() -> None:
    # G (gamma 1, zero-padded to 3 turns): A [3, 2, 0], B [0, 0, 0], C [4, 1, 1]; totals per turn [7, 3, 1]
    adv = turn_return_advantages([[1.0, 2.0], [0.0], [3.0, 0.0, 1.0]], gamma=1.0)
    assert adv == [[3 - 4 / 2, 2 - 1 / 2], [0 - 7 / 2], [4 - 3 / 2, 1 - 2 / 2, 1 - 0 / 2]]
    # gamma 0.5: G A [2, 2, 0], B [0, 0, 0], C [3.25, 0.5, 1]
    adv = turn_return_advantages([[1.0, 2.0], [0.0], [3.0, 0.0, 1.0]], gamma=0.5)
    assert _close(adv, [[2 - 3.25 / 2, 2 - 0.5 / 2], [-5.25 / 2], [3.25 - 1.0, 0.5 - 1.0, 1.0]])
    assert turn_return_advantages([[1.0, 2.0]]) == [[0.0, 0.0]]  # a group of one has no baseline
    with pytest.raises(ValueError, match=r"member 1: step reward \[0\] is not finite"):
        turn_return_advantages([[1.0], [float("inf")]])


def test_gigpo_by_hand() -> None:
    # A: states s0 -> s1, rewards [0, 1], episode reward 1; B: s0 -> s2 -> s1, rewards 0, episode reward 0.
    # Episode GRPO: [+R2, -R2]. Step groups: s0 {A0: G=1, B0: G=0}, s1 {A1: 1, B2: 0}: +-R2; s2 {B1} alone: 0.
    rewards = [[0.0, 1.0], [0.0, 0.0, 0.0]]
    keys = [["s0", "s1"], ["s0", "s2", "s1"]]
    assert _close(gigpo_step_advantages(rewards, keys, eps=0.0), [[R2, R2], [-R2, 0.0, -R2]])
    adv = gigpo_advantages([R2, -R2], rewards, keys, step_weight=0.5, eps=0.0)
    assert _close(adv, [[1.5 * R2, 1.5 * R2], [-1.5 * R2, -R2, -1.5 * R2]])
    # no key (None, or a list too short) and keys compared by value, JSON values included
    step = gigpo_step_advantages([[1.0, 5.0], [0.0, 2.0]], [[{"x": [1, 2]}, None], [{"x": [1, 2]}]], eps=0.0)
    assert _close(step, [[R2, 0.0], [-R2, 0.0]])
    assert gigpo_step_advantages([[1.0], [0.0]], [["1"], [1]]) == [[0.0], [0.0]]  # "1" and 1 are different states


def _traj(tid: str, turns: int, rewards: list[float], reward: float | None = None, **info) -> Trajectory:
    t = Trajectory(id=tid, group_id="g", env_id="test", rewards=rewards,
                   reward=sum(rewards) if reward is None else reward, info=dict(info))
    t.token_ids, t.loss_mask = [1], [0]
    for _ in range(turns):
        t.token_ids += [2, 3, 4]
        t.loss_mask += [1, 1, 0]
    t.logprobs = [-1.0 if m else 0.0 for m in t.loss_mask]
    t.versions = [0 if m else -1 for m in t.loss_mask]
    t.validate()
    return t


def test_estimators_are_selected_by_config_and_align_turns_with_steps() -> None:
    # b's last generation was never stepped (the context ran out): a turn with step reward 0
    a, b = _traj("a", 2, [1.0, 2.0]), _traj("b", 2, [0.0])
    assert num_turns(b) == 2
    adv = compute_advantages([Group(id="g", trajectories=[a, b])], AdvantageConfig(estimator="turn_return"))
    assert adv == [[3.0 - 0.0, 2.0 - 0.0], [0.0 - 3.0, 0.0 - 2.0]]
    cfg = AdvantageConfig(estimator="gigpo", eps=0.0, step_weight=1.0)
    a.info["state_keys"], b.info["state_keys"] = ["s0", "s1"], ["s0", "s1"]
    assert _close(compute_advantages([a, b], cfg), [[2 * R2, 2 * R2], [-2 * R2, -2 * R2]])
    b.info["state_keys"] = "s0"  # not a list: no step groups for b (a warning), never a crash
    assert _close(compute_advantages([a, b], cfg), [[R2, R2], [-R2, -R2]])
    assert compute_advantages([a, b], AdvantageConfig(estimator="rloo")) == [3.0, -3.0]  # unchanged scalars


def test_config_bounds() -> None:
    c = from_dict(TrainerConfig, {"advantage": {"estimator": "gigpo", "gamma": 0.9, "step_weight": 0.5}})
    assert c.advantage.estimator == "gigpo"
    with pytest.raises(ConfigError, match="estimator"):
        from_dict(TrainerConfig, {"advantage": {"estimator": "turn_mean"}})
    with pytest.raises(ValueError, match="advantage.gamma"):
        AdvantageConfig(gamma=1.5).validate()
    with pytest.raises(ValueError, match="advantage.step_weight"):
        AdvantageConfig(step_weight=-1.0).validate()


# --------------------------------------------------------------------------------------- the bias, reproduced
# A policy that chooses the episode length: at each of at most K turns it stops with probability p = sigmoid(theta)
# (step reward S) or takes another turn (step reward C; after K turns the episode is truncated). The exact gradient
# of J(theta) = E[sum of rewards] is known; an estimator's gradient for one group is the mean over its members of
# sum_k d/dtheta log pi(a_k) * A_k, with d/dtheta log pi = 1 - p for "stop" and -p for "continue".
K, C, S, THETA, N_MEMBERS, N_GROUPS = 4, 1.0, 2.0, 0.0, 4, 20000


def _expected_return(theta: float) -> float:
    p = 1.0 / (1.0 + math.exp(-theta))
    return sum((1 - p) ** k * p * (k * C + S) for k in range(K)) + (1 - p) ** K * K * C


def running_member_rule(rewards: list[list[float]]) -> list[list[float]]:
    """MT-GRPO-style: each turn's reward minus the mean reward at that turn index over the *other* members still
    running (leave-one-out, so the only difference from ``turn_return`` is which terms the baseline has), summed to
    go: the baseline has as many terms as the trajectory's own length."""
    out = []
    for i, rs in enumerate(rewards):
        norm = []
        for j, r in enumerate(rs):
            others = [o[j] for m, o in enumerate(rewards) if m != i and j < len(o)]
            norm.append(r - (sum(others) / len(others) if others else 0.0))
        out.append(returns_to_go(norm, 1.0))
    return out


def test_per_turn_index_normalisation_is_biased_and_turn_return_is_not() -> None:
    exact = (_expected_return(THETA + 1e-5) - _expected_return(THETA - 1e-5)) / 2e-5  # -0.5625 at theta 0
    p = 1.0 / (1.0 + math.exp(-THETA))
    rng = random.Random(0)
    shipped, biased = [], []
    for _ in range(N_GROUPS):
        episodes = []
        for _ in range(N_MEMBERS):
            acts: list[bool] = []
            while len(acts) < K and not (acts and acts[-1]):
                acts.append(rng.random() < p)
            episodes.append(acts)
        rewards = [[S if a else C for a in acts] for acts in episodes]
        for est, out in ((turn_return_advantages(rewards), shipped), (running_member_rule(rewards), biased)):
            out.append(sum(((1 - p) if a else -p) * adv for acts, row in zip(episodes, est)
                           for a, adv in zip(acts, row)) / N_MEMBERS)
    tolerance = {}
    for name, g in (("shipped", np.array(shipped)), ("biased", np.array(biased))):
        se = float(g.std(ddof=1) / math.sqrt(len(g)))  # groups are independent samples
        tolerance[name] = (float(g.mean()), se)
    mean, se = tolerance["shipped"]
    assert abs(mean - exact) < 4 * se, (mean, exact, se)  # unbiased within 4 standard errors (se ~ 0.004)
    mean, se = tolerance["biased"]
    assert abs(mean - exact) > 50 * se, (mean, exact, se)  # ~ +0.08 against -0.56: even the sign is wrong
    assert mean * exact < 0
