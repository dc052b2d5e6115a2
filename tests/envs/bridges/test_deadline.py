"""The time bound on in-process library calls (:mod:`agentrl.envs.bridges.deadline`): an endless Python loop is
interrupted, also one that swallows ``Exception``, the bridges' lock is free afterwards, and a call that ends in
time is never interrupted later."""

from __future__ import annotations

import random
import threading
import time

import pytest

from agentrl.envs.bridges import rng
from agentrl.envs.bridges.deadline import LibraryTimeout, bounded, timeout_arg


def _spin_forever() -> None:
    while True:
        try:
            sum(range(100))
        except Exception:  # a library that swallows errors in its loop
            pass


def test_an_endless_loop_is_interrupted_and_frees_the_lock():
    before = random.getstate()
    t0 = time.monotonic()
    with pytest.raises(LibraryTimeout, match=r"the spinner did not return within 0.2 s"):
        rng.with_states(rng.RNGStates.seeded(1), _spin_forever, 0.2, "the spinner")
    assert time.monotonic() - t0 < 30
    assert random.getstate() == before  # the process's generators are back
    took = []

    def take() -> None:
        took.append(rng.LOCK.acquire(timeout=10))
        if took[-1]:
            rng.LOCK.release()

    other = threading.Thread(target=take)
    other.start()
    other.join()
    assert took == [True]  # another thread gets the lock: the stuck call no longer holds it


def test_a_call_that_ends_in_time_is_never_interrupted_afterwards():
    """Bodies that end before, around and after their bound: each call either ends with LibraryTimeout inside
    ``bounded`` or not at all; no interrupt lands after it (the loop after each call runs Python bytecodes, where a
    stray one would)."""
    ended = timed_out = 0
    for k in range(60):
        try:
            with bounded(0.02, "quick"):
                t_end = time.monotonic() + 0.01 * (k % 6)
                while time.monotonic() < t_end:
                    pass
            ended += 1
        except LibraryTimeout:
            timed_out += 1
        t_end = time.monotonic() + 0.02
        while time.monotonic() < t_end:
            pass
    assert ended + timed_out == 60 and ended > 0 and timed_out > 0
    with bounded(None, "unbounded"):
        pass


def test_other_errors_pass_through_unchanged():
    with pytest.raises(KeyError):
        with bounded(5, "raises"):
            raise KeyError("k")


@pytest.mark.parametrize("bad", [0, -1, float("nan"), "5", True, None])
def test_both_bridges_refuse_a_bound_that_is_not_a_positive_number(bad):
    with pytest.raises(ValueError, match="Owner: call_timeout_s must be a positive number"):
        timeout_arg(bad, "Owner")
    import agentrl

    for env_id in ("textarena/GuessTheNumber-v0", "reasoning_gym/leg_counting"):
        with pytest.raises(ValueError, match="call_timeout_s must be a positive number"):
            agentrl.make(env_id, call_timeout_s=bad)
    assert timeout_arg(2, "Owner") == 2.0
