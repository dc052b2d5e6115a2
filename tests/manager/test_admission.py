"""The admission policy (agentrl/manager/admission.py) on its own: the rules, and its invariants driven through a
discrete-event model of a training run (long-tailed episodes, lagging engines, redundancy, resume) without the
manager."""

from __future__ import annotations

import collections
import heapq
import itertools
import random
from dataclasses import dataclass, field

import pytest
from scipy.stats import ks_2samp

from agentrl.manager.admission import Admission


def test_ceiling_counts_the_engine_version_when_it_lags():
    adm = Admission(alpha=1, batch_size=4)
    assert adm.ceiling(engine_version=0) == 8 and adm.version(0) == 0  # no trainer version: follow the engine
    adm.set_version(3)
    assert adm.admit_version(engine_version=2) == 2  # sync_every = 2: the engine still serves 2
    assert adm.ceiling(engine_version=2) == (1 + 2 + 1) * 4
    assert adm.ceiling(engine_version=3) == (1 + 3 + 1) * 4
    assert adm.fits(reserved=12, group_size=4, engine_version=2) and not adm.fits(reserved=13, group_size=4, engine_version=2)
    assert Admission(alpha=None, batch_size=4).fits(10**9, 4, 0)


def test_restore_after_resume_admits_one_fresh_batch_not_a_burst():
    alpha, B, k = 0, 4, 10
    restored = Admission(alpha, B)
    restored.restore(version=k, accepted=k * B)
    assert restored.ceiling(k) - restored.accepted == (alpha + 1) * B  # as a fresh run at step 0
    # The defect it replaces: a fresh counter with only the version moved admits (alpha + k + 1) * B at once.
    fresh = Admission(alpha, B)
    fresh.set_version(k)
    assert fresh.ceiling(k) - fresh.accepted == (alpha + k + 1) * B == 44
    with pytest.raises(ValueError, match="restore"):
        restored.restore(version=-1, accepted=0)


def test_staleness_rule_and_its_suspension_while_the_engine_lags():
    adm = Admission(alpha=2, batch_size=8)
    adm.set_version(5)
    assert adm.is_stale(2, engine_version=5) and not adm.is_stale(3, engine_version=5)
    assert not adm.is_stale(None, engine_version=5)  # no tokens yet
    assert not adm.staleness_applies(engine_version=2)  # e < v - alpha: a restart would not be fresher
    assert not adm.is_stale(0, engine_version=2)
    assert "v - alpha = 3" in adm.stale_reason(2, 5)
    assert not Admission(alpha=None, batch_size=8).is_stale(0, 10)


def test_select_batch_is_earliest_deadline_first_and_waits_only_when_it_must():
    adm = Admission(alpha=1, batch_size=4)  # n = 2 groups per step
    key = {"a0": (0, 0), "b0": (0, 1), "c1": (1, 2), "d1": (1, 3), "e2": (2, 4)}
    admitted = key.__getitem__
    # step 1: groups admitted at 0 are due. One of them still runs: wait even though 2 groups are ready.
    assert adm.select_batch(["c1", "a0"], {0: 1}, 2, 1, admitted) is None
    # both due groups ready: they come first (oldest first), whatever the completion order
    assert adm.select_batch(["c1", "d1", "b0", "a0"], {}, 2, 1, admitted) == ["a0", "b0"]
    # one due group ready, none running: it first, then completion order
    assert adm.select_batch(["d1", "c1", "b0"], {}, 2, 1, admitted) == ["b0", "d1"]
    # step 0: nothing due now, but 3 groups are due by step 1 and a batch holds 2: one of them must go now; a
    # finished one does (no waiting for the running ones), then completion order fills up
    assert adm.select_batch(["e2", "b0"], {0: 2}, 2, 0, admitted) == ["b0", "e2"]
    # ... and when none of them has finished, the batch waits for one
    assert adm.select_batch(["e2", "c1"], {0: 3}, 2, 0, admitted) is None
    # not enough ready: wait, unless nothing more can finish
    assert adm.select_batch(["c1"], {}, 2, 1, admitted) is None
    assert adm.select_batch(["c1"], {}, 2, 1, admitted, ended=True) == ["c1"]
    assert adm.select_batch([], {}, 2, 1, admitted, ended=True) is None
    # without alpha nothing is ever due: completion order
    assert Admission(None, 4).select_batch(["d1", "a0"], {0: 1}, 1, 9, admitted) == ["d1"]


def test_a_streamed_step_plans_with_the_steps_capacity_and_waits_only_where_the_whole_batch_would():
    """A streamed step takes its n groups one at a time; deadlines are still planned with n per step (a plan with
    one group per step made it wait for stragglers that the whole-batch step leaves for the next step)."""
    adm = Admission(alpha=2, batch_size=4)  # n = 2 groups per step
    key = {"a0": (0, 0), "b0": (0, 1), "c1": (1, 2), "d1": (1, 3), "e1": (1, 4)}
    admitted = key.__getitem__
    # step 1: two groups admitted at 0 still run (due at 2), c1 and d1 finished (due at 3). This step and the next
    # hold 4 groups: nothing has to wait, the whole batch is c1, d1 ...
    assert adm.select_batch(["c1", "d1"], {0: 2}, 2, 1, admitted) == ["c1", "d1"]
    # ... and so are the two parts of the streamed step, without waiting
    assert adm.select_batch(["c1", "d1"], {0: 2}, 2, 1, admitted, want=1) == ["c1"]
    assert adm.select_batch(["d1"], {0: 2}, 2, 1, admitted, taken=1, want=1) == ["d1"]
    # where the whole batch waits, so does the streamed step: three running groups due at 2 need one slot now
    assert adm.select_batch(["c1", "d1"], {0: 3}, 2, 1, admitted) is None
    assert adm.select_batch(["c1", "d1"], {0: 3}, 2, 1, admitted, want=1) == ["c1"]  # a part that leaves room
    assert adm.select_batch(["d1"], {0: 3}, 2, 1, admitted, taken=1, want=1) is None  # the last slot: wait
    # a finished due group is taken first, whatever its place in completion order
    assert adm.select_batch(["c1", "e1", "a0"], {0: 1}, 2, 2, admitted, want=1) == ["a0"]
    # the step is full: nothing more
    assert adm.select_batch(["c1"], {}, 2, 1, admitted, taken=2, want=1) is None


# ------------------------------------------------------------------------------------------------ the model
@dataclass
class _G:
    index: int
    admit: int  # admission version a
    oldest: int  # engine version when its members started (their oldest token)
    lengths: list[float] = field(default_factory=list)  # members' durations, in finishing order
    finished: int = 0
    running: int = 0
    state: str = "open"


@dataclass
class _Run:
    trained_lengths: list[float] = field(default_factory=list)
    generated_lengths: list[float] = field(default_factory=list)  # every member started
    max_staleness: int = 0
    max_due: int = 0
    steps: int = 0
    started: int = 0
    dropped_stale: int = 0
    first_admission: int = 0  # trajectories admitted before the first step


def simulate(alpha: int, num_groups: int, group_size: int, steps: int, *, sync_every: int = 1, extra: int = 0,
             seed: int = 0, train_time: float = 0.3, tail: float = 1.1, restore_at: int = 0,
             rule: str = "deadline") -> _Run:
    """A training run as the manager and controller play it, with the admission policy deciding: episodes take
    Pareto-tailed times, the trainer takes ``num_groups`` groups per step for ``train_time``, weights reach the
    engine every ``sync_every`` steps. ``rule="deadline"`` is the policy under test; ``rule="cancel"`` is the one
    it replaced (completion order, stale episodes cancelled and restarted)."""
    rng = random.Random(seed)
    B, L = num_groups * group_size, group_size + extra
    adm = Admission(alpha, B)
    if restore_at:
        adm.restore(restore_at, restore_at * B)
    else:
        adm.set_version(0)
    v = engine = restore_at
    t, seq = 0.0, itertools.count()
    heap: list = []
    open_groups: dict[int, _G] = {}
    ready: list[_G] = []
    count = itertools.count()
    running = held = 0
    busy = False
    out = _Run()

    def start_member(g: _G) -> None:
        nonlocal running
        d = rng.paretovariate(tail) * 0.1
        out.generated_lengths.append(d)
        out.started += 1
        g.running += 1
        running += 1
        heapq.heappush(heap, (t + d, next(seq), "finish", (g, d, g.oldest)))

    def admit() -> None:
        while True:
            reserved = adm.accepted + group_size * len(open_groups)
            if not adm.fits(reserved, group_size, engine):
                return
            assert reserved + group_size <= (alpha + adm.version(engine) + 1) * B  # I1
            if extra == 0:  # AReaL's count: accepted + running + held within the bound
                assert adm.accepted + running + held + L <= (alpha + adm.version(engine) + 1) * B
            g = _G(next(count), adm.admit_version(engine), engine)
            open_groups[g.index] = g
            for _ in range(L):
                start_member(g)

    while out.steps < steps:
        admit()
        if out.steps == 0 and not busy and t == 0.0:
            out.first_admission = running
        if not busy:
            due = sum(g.admit + alpha <= v for g in [*open_groups.values(), *ready])
            out.max_due = max(out.max_due, due)
            if rule == "deadline":
                by_version = collections.Counter(g.admit for g in open_groups.values())
                chosen = adm.select_batch(ready, by_version, num_groups, v, lambda g: (g.admit, g.index))
            else:
                chosen = ready[:num_groups] if len(ready) >= num_groups else None
            if chosen:
                for g in chosen:
                    ready.remove(g)
                    out.max_staleness = max(out.max_staleness, v - g.oldest)
                    out.trained_lengths += g.lengths[:group_size]
                busy = True
                heapq.heappush(heap, (t + train_time, next(seq), "trained", None))
        t, _, kind, data = heapq.heappop(heap)
        if kind == "trained":
            busy = False
            v += 1
            out.steps += 1
            if v % sync_every == 0:
                engine = v
            adm.set_version(v)
            if rule == "cancel" and adm.staleness_applies(engine):  # the replaced rule: restart stale members
                for g in list(open_groups.values()):
                    if adm.is_stale(g.oldest, engine):
                        out.dropped_stale += g.running
                        running -= g.running
                        n, g.running, g.oldest = g.running, 0, engine
                        for _ in range(n):
                            start_member(g)
                        # the cancelled members' finish events no longer count
                        heap[:] = [h for h in heap if not (h[2] == "finish" and h[3][0] is g and h[3][2] < g.oldest)]
                        heapq.heapify(heap)
            continue
        g, d, _ = data
        if g.state != "open":
            continue  # a cancelled loser (its running count was released when the group completed)
        g.running -= 1
        running -= 1
        g.finished += 1
        g.lengths.append(d)
        held += 1
        if g.finished == group_size:
            g.state = "ready"
            held -= group_size
            running -= g.running  # losers cancelled
            g.running = 0
            del open_groups[g.index]
            adm.accept(group_size)
            ready.append(g)
    return out


@pytest.mark.parametrize("alpha, sync_every, extra", [(0, 1, 0), (1, 1, 0), (1, 2, 0), (2, 3, 0), (4, 1, 0),
                                                      (2, 1, 1), (4, 5, 2)])
@pytest.mark.parametrize("tail, train_time", [(1.1, 0.3), (0.5, 0.05), (0.5, 0.01)])
def test_invariants_hold_through_long_tails_lagging_engines_and_redundancy(alpha, sync_every, extra, tail, train_time):
    for seed in range(3):
        run = simulate(alpha, num_groups=3, group_size=2, steps=150, sync_every=sync_every, extra=extra, seed=seed,
                       tail=tail, train_time=train_time)
        assert run.steps == 150
        assert run.max_due <= 3  # I2: the due groups always fit one batch
        assert run.max_staleness <= alpha  # I3: bounded staleness, and nothing was cancelled to get it
        assert run.dropped_stale == 0
        if extra == 0:  # every started episode is trained or still in flight at the end: no work wasted
            assert run.started <= 150 * 6 + (alpha + 1) * 6


def test_resume_admits_what_a_fresh_run_admits():
    fresh = simulate(2, num_groups=2, group_size=2, steps=5)
    resumed = simulate(2, num_groups=2, group_size=2, steps=5, restore_at=10)
    assert fresh.first_admission == resumed.first_admission == (2 + 1) * 4
    assert resumed.max_staleness <= 2 and resumed.max_due <= 2


def test_deadline_rule_trains_an_unbiased_sample_where_cancelling_stale_episodes_does_not():
    new = simulate(2, num_groups=2, group_size=2, steps=400, seed=7)
    old = simulate(2, num_groups=2, group_size=2, steps=400, seed=7, rule="cancel")
    assert new.max_staleness <= 2 and new.dropped_stale == 0
    p_new = ks_2samp(new.trained_lengths, new.generated_lengths).pvalue
    p_old = ks_2samp(old.trained_lengths, old.generated_lengths).pvalue
    assert old.dropped_stale > 0 and p_old < 0.01, (old.dropped_stale, p_old)  # the model can see the bias
    assert p_new > 0.05, p_new
