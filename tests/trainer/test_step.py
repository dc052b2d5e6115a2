"""Step bookkeeping on its own: sums that combine across parts and workers, batch statistics, the record sample."""

from __future__ import annotations

import random

import numpy as np
import pytest
import torch

from agentrl.trainer.batching import Seq
from agentrl.trainer.step import LocalReducer, RecordSampler, StepSums, add_batch_stats, finish_batch_stats


class _TwoWorkers:
    """Reduces against a fixed second worker's values (a SUM / MAX all-reduce seen from one worker)."""

    def __init__(self, other: StepSums) -> None:
        self.other = other

    def sum(self, values):
        o = self.other
        theirs = {**{"n:" + k: v for k, v in o.num.items()}, **{"d:" + k: v for k, v in o.den.items()},
                  **{"t:" + k: v for k, v in o.totals.items()}}
        return {k: values.get(k, 0.0) + theirs.get(k, 0.0) for k in set(values) | set(theirs)}

    def max(self, values):
        return {k: max(values.get(k, -np.inf), self.other.maxima.get(k, -np.inf))
                for k in set(values) | set(self.other.maxima)}


def test_sums_split_across_workers_equal_the_whole() -> None:
    whole, a, b = StepSums(), StepSums(), StepSums()
    rows = [("m", 2.0, 3.0), ("m", 4.0, 1.0), ("only_b", 7.0, 2.0)]
    for i, (k, v, w) in enumerate(rows):
        whole.add_mean(k, v, w)
        (a if i == 0 else b).add_mean(k, v, w)
    for s, part in ((whole, 5.0), (a, 2.0), (b, 3.0)):
        s.add_total("tokens", part)
    for s, vals in ((whole, [1.0, 9.0]), (a, [1.0]), (b, [9.0])):
        for v in vals:
            s.add_max("x_max", v)
            s.add_min("x_min", v)
    expect = whole.result(LocalReducer(), divide={"tokens": 2.0})
    got = a.result(_TwoWorkers(b), divide={"tokens": 2.0})
    assert got == pytest.approx(expect)
    assert expect == pytest.approx({"m": (2 * 3 + 4 * 1) / 4, "only_b": 7.0, "tokens": 2.5, "x_max": 9.0, "x_min": 1.0})


def test_batch_stats_match_numpy() -> None:
    g = random.Random(0)
    seqs = []
    for i in range(7):
        n = g.randrange(3, 9)
        mask = torch.tensor([float(j >= 1) for j in range(n - 1)])
        vers = torch.tensor([g.randrange(0, 3) if m else -1 for m in mask.tolist()])
        seqs.append(Seq(ids=torch.zeros(n, dtype=torch.long), mask=mask, behav=torch.zeros(n - 1), versions=vers,
                        adv=g.gauss(0, 1), reward=g.choice([0.0, 1.0, 0.5])))
    sums = StepSums()
    add_batch_stats(sums, seqs[:3], version=3)
    add_batch_stats(sums, seqs[3:], version=3)  # in two parts, as a streamed step adds them
    out = finish_batch_stats(sums.result(LocalReducer()))
    r = np.array([s.reward for s in seqs])
    assert out["reward/mean"] == pytest.approx(r.mean()) and out["reward/std"] == pytest.approx(r.std())
    assert out["reward/min"] == r.min() and out["adv/max"] == pytest.approx(max(s.adv for s in seqs))
    stale = np.concatenate([3 - s.versions[s.mask > 0].numpy() for s in seqs])
    assert out["staleness/mean"] == pytest.approx(stale.mean()) and out["staleness/max"] == stale.max()
    for k in (1, 2, 3):
        assert out[f"staleness/hist/{k}"] == pytest.approx(float(np.mean(stale == k)))
    assert out["batch/num_seqs"] == 7 and out["batch/loss_tokens"] == stale.size
    assert not any(k.startswith("\0") for k in out)


def test_record_sampler_keeps_a_uniform_sample_of_k() -> None:
    counts = np.zeros(10)
    for trial in range(400):
        s = RecordSampler(3, random.Random(trial))
        for i in range(10):
            slot = s.slot()
            if slot is not None:
                s.put(slot, f"t{i}", 0, torch.tensor([float(i)]))
        recs = s.take()
        assert len(recs) == 3 and len({r["trajectory_id"] for r in recs}) == 3
        for r in recs:
            counts[int(r["trajectory_id"][1:])] += 1
    assert counts.min() > 0.6 * counts.mean()  # each kept with probability 3/10
    assert RecordSampler(0, random.Random(0)).slot() is None
