"""Group advantages against hand-computed numbers."""

from __future__ import annotations

import math

import pytest

from agentrl.trainer.advantages import compute_advantages, group_advantages
from agentrl.trainer.config import AdvantageConfig
from agentrl.trajectory import Group, Trajectory


def test_grpo_by_hand() -> None:
    # rewards [1, 0, 0, 1]: mean 0.5, sample std sqrt(4 * 0.25 / 3) = sqrt(1/3)
    adv = group_advantages([1, 0, 0, 1], AdvantageConfig("grpo", eps=0.0))
    a = 0.5 / math.sqrt(1 / 3)
    assert adv == pytest.approx([a, -a, -a, a])
    # population std: sqrt(4 * 0.25 / 4) = 0.5 -> +-1
    adv = group_advantages([1, 0, 0, 1], AdvantageConfig("grpo", eps=0.0, std_unbiased=False))
    assert adv == pytest.approx([1, -1, -1, 1])
    # eps in the denominator: 0.5 / (0.5 + 0.5)
    adv = group_advantages([1, 0, 0, 1], AdvantageConfig("grpo", eps=0.5, std_unbiased=False))
    assert adv == pytest.approx([0.5, -0.5, -0.5, 0.5])


def test_grpo_equal_rewards_give_zero_not_nan() -> None:
    assert group_advantages([3, 3, 3], AdvantageConfig("grpo")) == [0.0, 0.0, 0.0]


def test_grpo_no_std_by_hand() -> None:
    # mean of [2, 4, 9] is 5
    assert group_advantages([2, 4, 9], AdvantageConfig("grpo_no_std")) == pytest.approx([-3, -1, 4])


def test_rloo_by_hand() -> None:
    # A_0 = 1 - (2+3+6)/3 = -8/3; A_1 = 2 - (1+3+6)/3 = -4/3; A_2 = 3 - (1+2+6)/3 = 0; A_3 = 6 - 2 = 4
    assert group_advantages([1, 2, 3, 6], AdvantageConfig("rloo")) == pytest.approx([-8 / 3, -4 / 3, 0, 4])


def test_singleton_group_and_bad_reward() -> None:
    for est in ("grpo", "grpo_no_std", "rloo"):
        assert group_advantages([5.0], AdvantageConfig(est)) == [0.0]
    with pytest.raises(ValueError, match="reward\\[1\\]"):
        group_advantages([1.0, float("nan")], AdvantageConfig("grpo"))


def _t(i: int, group: str, reward: float) -> Trajectory:
    return Trajectory(id=f"t{i}", group_id=group, env_id="e", reward=reward)


def test_compute_advantages_groups_by_group_id_and_keeps_input_order() -> None:
    trajs = [_t(0, "a", 1), _t(1, "b", 10), _t(2, "a", 3), _t(3, "b", 20)]
    adv = compute_advantages(trajs, AdvantageConfig("grpo_no_std"))
    # group a: mean 2 -> [-1, +1]; group b: mean 15 -> [-5, +5]
    assert adv == pytest.approx([-1, -5, 1, 5])
    groups = [Group("a", [trajs[0], trajs[2]]), Group("b", [trajs[1], trajs[3]])]
    assert compute_advantages(groups, AdvantageConfig("grpo_no_std")) == pytest.approx([-1, 1, -5, 5])
