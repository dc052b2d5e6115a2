"""The global generators kept per owner (``agentrl.envs.bridges.rng``): every draw equals what private generators
would give (owners' and the process's), through cached normals, seeding, raising calls and both ways of copying
states; and every bridge that swaps them holds the one lock."""

from __future__ import annotations

import random

import numpy as np
import pytest

from agentrl.envs.bridges import rng


def _draw(op: str, n: int, py, nr) -> list[float]:
    """``n`` draws of kind ``op`` from ``py`` (a random.Random or the module) and ``nr`` (a RandomState or
    numpy.random)."""
    if op == "py":
        return [py.random() for _ in range(n)]
    if op == "gauss":  # an odd count leaves a normal cached
        return [py.gauss(0, 1) for _ in range(n)]
    if op == "np":
        return list(nr.random_sample(n))
    if op == "normal":  # the legacy generator caches the second normal of each pair
        return [float(nr.standard_normal()) for _ in range(n)]
    return []


@pytest.fixture(params=["raw", "tuples"])
def way(request, monkeypatch):
    if request.param == "tuples":
        monkeypatch.setattr(rng, "_NP_RAW", False)
        monkeypatch.setattr(rng, "_PY_RAW", False)
    else:
        assert rng._NP_RAW and rng._PY_RAW, "the raw ways must pass their check on this interpreter"
    monkeypatch.setattr(rng, "_np_clean", None)
    saved = random.getstate(), np.random.get_state()
    yield request.param
    random.setstate(saved[0])
    np.random.set_state(saved[1])


def test_owners_and_the_process_draw_as_if_each_had_its_own_generators(way):
    script = random.Random(7)
    random.seed(99)
    np.random.seed(99)
    ref_proc = (random.Random(99), np.random.RandomState(99))
    owners = {k: rng.RNGStates.seeded(k) for k in (1, 2, 3)}
    refs = {k: (random.Random(k), np.random.RandomState(k)) for k in owners}
    ops = ["py", "gauss", "np", "normal", "none", "none"]
    for _ in range(300):
        op, n = script.choice(ops), script.choice([0, 1, 2, 3])
        if script.random() < 0.2:  # the process draws between calls
            assert _draw(op, n, random, np.random) == _draw(op, n, *ref_proc)
            continue
        k = script.choice(list(owners))
        got, owners[k] = rng.with_states(owners[k], lambda: _draw(op, n, random, np.random))
        assert got == _draw(op, n, *refs[k]), (op, n, k)
    for op in ("py", "gauss", "np", "normal"):  # the cached normals are the process's own too
        assert _draw(op, 3, random, np.random) == _draw(op, 3, *ref_proc)


def test_a_first_call_without_states_seeds_itself_and_keeps_what_it_left(way):
    random.seed(5)
    np.random.seed(5)
    before = random.random(), float(np.random.random())
    random.seed(5)
    np.random.seed(5)

    def start() -> float:
        random.seed(11)
        np.random.seed(11)
        return random.random()

    first, states = rng.with_states(None, start)
    assert first == random.Random(11).random()
    assert (random.random(), float(np.random.random())) == before  # the process's generators did not move
    again, _ = rng.with_states(states, lambda: (random.random(), float(np.random.random())))
    ref = random.Random(11)
    ref.random()
    assert again == (ref.random(), float(np.random.RandomState(11).random_sample()))


def test_a_call_that_raises_leaves_the_process_generators_as_they_were(way):
    random.seed(3)
    np.random.seed(3)
    np.random.standard_normal()  # a cached normal in the process's state
    expect = random.random(), float(np.random.standard_normal())
    random.seed(3)
    np.random.seed(3)
    np.random.standard_normal()

    def boom():
        random.seed(1)
        np.random.seed(1)
        np.random.standard_normal()
        raise KeyError("inside the library")

    with pytest.raises(KeyError):
        rng.with_states(rng.RNGStates.seeded(4), boom)
    assert (random.random(), float(np.random.standard_normal())) == expect


def test_every_bridge_calls_its_library_under_the_one_lock():
    textarena_env = pytest.importorskip("agentrl.envs.bridges.textarena_env")
    reasoninggym = pytest.importorskip("agentrl.envs.bridges.reasoninggym")
    env = textarena_env.TextArenaEnv("GuessTheNumber-v0")
    env.reset(seed=1)
    assert env._call(rng.LOCK._is_owned)
    with reasoninggym.global_rng("x", 1):
        assert rng.LOCK._is_owned()


@pytest.mark.filterwarnings("error::RuntimeWarning")  # numpy's, at every legacy get_state of a PCG64: not per call
def test_a_global_generator_other_than_mt19937_is_swapped_the_slow_exact_way():
    saved = np.random.get_bit_generator()
    np.random.set_bit_generator(np.random.PCG64(5))
    try:
        owner = rng.RNGStates.seeded(8)  # numpy.random.seed on a PCG64 global reseeds that PCG64
        ref = np.random.RandomState(np.random.PCG64(0))
        ref.set_state(np.random.get_state(legacy=False))
        got, owner = rng.with_states(owner, lambda: list(np.random.random_sample(3)))
        assert list(np.random.random_sample(2)) == list(ref.random_sample(2))  # the process's stream, untouched
        again, _ = rng.with_states(owner, lambda: list(np.random.random_sample(3)))
        assert again != got and len(set(got + again)) == 6
    finally:
        np.random.set_bit_generator(saved)


def test_a_new_mt19937_put_in_place_is_the_one_swapped():
    """The byte view of numpy's state follows the bit generator in place: after ``set_bit_generator`` with another
    MT19937, an owner's draws and the process's are those of the new one, not of memory the old one holds."""
    saved = np.random.get_bit_generator()
    rng.with_states(rng.RNGStates.seeded(1), lambda: None)  # the view of the generator in place now is made
    np.random.set_bit_generator(np.random.MT19937(11))
    try:
        ref = np.random.RandomState(np.random.MT19937(11))
        owner = rng.RNGStates.seeded(3)
        got, owner = rng.with_states(owner, lambda: list(np.random.random_sample(3)))
        assert got == list(np.random.RandomState(3).random_sample(3))
        assert list(np.random.random_sample(2)) == list(ref.random_sample(2))  # the new generator's own stream
    finally:
        np.random.set_bit_generator(saved)


def _same(a, b) -> bool:
    """Whether two (random.getstate(), numpy.random.get_state()) pairs are equal, cached normals included."""
    return a[0] == b[0] and (a[1][1] == b[1][1]).all() and a[1][2:] == b[1][2:]


def _seeded_result(seed: int, fn):
    with rng.seeded(seed):
        return fn()


@pytest.mark.parametrize("draw", ["none", "py", "np", "cached_gauss", "cached_normal", "seeds_np"])
def test_a_replayable_call_gives_the_seeded_result_and_runs_unseeded_only_when_it_draws_nothing(draw, monkeypatch):
    """``replayable`` must give what ``seeded`` gives for every kind of draw, including a draw that only takes a
    cached normal (which moves no state bytes), leave the process's generators as they were, and run ``fn`` once
    unless it drew."""
    monkeypatch.setattr(rng, "_DRAWS", set())
    monkeypatch.setattr(rng, "_np_clean", None)
    saved = random.getstate(), np.random.get_state()
    random.seed(21)
    np.random.seed(21)
    if draw == "cached_gauss":
        random.gauss(0, 1)  # leaves the pair's second normal cached in the process's generator
    if draw == "cached_normal":
        np.random.standard_normal()
    ops = {"none": lambda: 7, "py": lambda: random.random(), "np": lambda: float(np.random.random_sample()),
           "cached_gauss": lambda: random.gauss(0, 1), "cached_normal": lambda: float(np.random.standard_normal()),
           "seeds_np": lambda: (np.random.seed(3), float(np.random.random_sample()))[1]}
    calls = []

    def fn():
        calls.append(1)
        return ops[draw]()

    before = random.getstate(), np.random.get_state()
    try:
        want = _seeded_result(99, ops[draw])
        assert _same(before, (random.getstate(), np.random.get_state()))
        for attempt in range(2):
            calls.clear()
            assert rng.replayable("kind", lambda: 99, fn) == want
            assert _same(before, (random.getstate(), np.random.get_state()))
            # no draw: once, unseeded; a draw seen: twice the first time, then straight to seeded; a normal
            # cached in the process's numpy state: always seeded (its use would move no bytes)
            expect = 1 if draw in ("none", "cached_normal") or attempt else 2
            assert len(calls) == expect, (draw, attempt, calls)
        assert ("kind" in rng._DRAWS) == (draw not in ("none", "cached_normal"))
    finally:
        random.setstate(saved[0])
        np.random.set_state(saved[1])


def test_a_replayable_call_that_raises_raises_as_seeded_and_one_interrupted_leaves_the_generators(monkeypatch):
    monkeypatch.setattr(rng, "_DRAWS", set())
    random.seed(4)
    before = random.getstate()
    runs = []

    def boom():
        runs.append(random.random() if len(runs) == 0 else None)
        raise KeyError("scorer")

    with pytest.raises(KeyError):
        rng.replayable("boom", lambda: 1, boom)
    assert len(runs) == 2 and random.getstate() == before  # it drew: put back, and raised again seeded

    def spin():
        random.random()
        while True:
            pass

    from agentrl.envs.bridges.deadline import LibraryTimeout
    with pytest.raises(LibraryTimeout, match="the spinner"):
        rng.replayable("spin", lambda: 1, spin, 0.2, "the spinner")
    assert random.getstate() == before and "spin" not in rng._DRAWS

    def stopped():
        random.random()
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        rng.replayable("stopped", lambda: 1, stopped)
    assert random.getstate() == before and "stopped" not in rng._DRAWS  # put back, and not run again
