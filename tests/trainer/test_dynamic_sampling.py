"""Dynamic sampling: groups without learning signal are left out and counted."""

from __future__ import annotations

import pytest

from agentrl.trainer.config import AdvantageConfig
from agentrl.trainer.dynamic_sampling import carries_signal, filter_groups
from agentrl.trajectory import Group, Trajectory


def _group(gid: str, rewards: list[float], steps: list[list[float]] | None = None) -> Group:
    trajs = []
    for i, r in enumerate(rewards):
        rs = steps[i] if steps else [r]
        t = Trajectory(id=f"{gid}-{i}", group_id=gid, env_id="test", reward=r, rewards=rs,
                       token_ids=[1] + [2, 3] * len(rs), loss_mask=[0] + [1, 0] * len(rs))
        t.logprobs = [-1.0 if m else 0.0 for m in t.loss_mask]
        t.versions = [0 if m else -1 for m in t.loss_mask]
        trajs.append(t)
    return Group(id=gid, trajectories=trajs)


def test_zero_variance_groups_are_dropped_and_counted() -> None:
    groups = [_group("a", [1.0, 1.0, 1.0]), _group("b", [0.0, 1.0, 0.0]), _group("c", [0.0, 0.0]),
              _group("d", [2.0]), _group("e", [0.5, 0.5 + 1e-12])]
    out = filter_groups(groups, AdvantageConfig(estimator="grpo"))
    assert [g.id for g in out.kept] == ["b"]
    assert [g.id for g in out.dropped] == ["a", "c", "d", "e"] and out.num_dropped == 4
    assert out.metrics() == {"dynamic_sampling/groups_kept": 1.0, "dynamic_sampling/groups_dropped": 4.0,
                             "dynamic_sampling/drop_frac": 0.8}
    assert filter_groups([], AdvantageConfig()).metrics()["dynamic_sampling/drop_frac"] == 0.0


def test_turn_level_estimators_keep_groups_with_per_turn_signal() -> None:
    # equal episode rewards (1.0 each) but different intermediate rewards: turn_return still has signal
    mixed = _group("m", [1.0, 1.0], steps=[[1.0, 0.0], [0.0, 1.0]])
    same = _group("s", [1.0, 1.0], steps=[[0.0, 1.0], [0.0, 1.0]])
    assert not carries_signal(mixed, AdvantageConfig(estimator="grpo"))
    assert carries_signal(mixed, AdvantageConfig(estimator="turn_return"))
    assert not carries_signal(same, AdvantageConfig(estimator="turn_return"))
    assert not carries_signal(same, AdvantageConfig(estimator="gigpo"))


def test_bad_input_is_named() -> None:
    with pytest.raises(ValueError, match="tol"):
        filter_groups([], AdvantageConfig(), tol=-1.0)
    with pytest.raises(ValueError, match="group x: trajectory x-1 has a non-finite reward"):
        filter_groups([_group("x", [0.0, float("nan")])], AdvantageConfig())
