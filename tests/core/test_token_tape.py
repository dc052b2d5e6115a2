"""TokenTape: the one home of the four aligned per-token arrays, and the invariants Trajectory.validate shares."""

from __future__ import annotations

import math

import pytest

from agentrl.trajectory import TokenTape, Trajectory


def test_appending_keeps_the_arrays_aligned():
    t = TokenTape()
    t.add_fixed([1, 2])
    t.add_generated([3, 4], [-0.1, -0.2], [5, 6])
    t.add_fixed([7])
    assert (t.token_ids, t.loss_mask, t.logprobs, t.versions) == (
        [1, 2, 3, 4, 7], [0, 0, 1, 1, 0], [0.0, 0.0, -0.1, -0.2, 0.0], [-1, -1, 5, 6, -1])
    t.check()
    assert len(t) == 5


@pytest.mark.parametrize("ids, lps, vs, match", [
    ([3, 4], [-0.1], [1, 1], "misaligned"),
    ([3], [-0.1], [-1], "without a version"),
    ([3], [math.nan], [1], "non-finite"),
    ([3], [math.inf], [1], "non-finite"),
])
def test_bad_generated_tokens_are_refused_and_nothing_is_appended(ids, lps, vs, match):
    t = TokenTape()
    t.add_fixed([1])
    with pytest.raises(ValueError, match=match):
        t.add_generated(ids, lps, vs)
    assert t.token_ids == [1] and t.loss_mask == [0]


def test_a_trajectory_with_a_non_finite_generated_logprob_is_invalid():
    tr = Trajectory(id="t", group_id="g", env_id="e", token_ids=[1, 2], loss_mask=[0, 1], logprobs=[0.0, math.nan],
                    versions=[-1, 0])
    with pytest.raises(ValueError, match="non-finite log-prob"):
        tr.validate()
