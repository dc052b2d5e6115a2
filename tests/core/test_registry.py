import asyncio

import gymnasium
import pytest

import agentrl
from agentrl.registration import RegistrationError


class Counter(agentrl.Env):
    """Counts steps; terminates when the action is 'stop'."""

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.n = 0
        return [{"role": "user", "content": f"start {int(self.np_random.integers(100))}"}], {}

    def step(self, action):
        self.n += 1
        return f"step {self.n}", 0.0, action == "stop", False, {"n": self.n}


@pytest.fixture
def counter_id(request):
    env_id = f"test/Counter{abs(hash(request.node.name)) % 10**8}-v0"
    agentrl.register(env_id, entry_point=f"{__name__}:Counter", max_episode_steps=3)
    yield env_id
    gymnasium.registry.pop(env_id, None)


def test_make_and_gymnasium_make(counter_id):
    env = agentrl.make(counter_id)
    obs, _ = env.reset(seed=0)
    assert obs[0]["role"] == "user"
    assert gymnasium.make(counter_id).spec.id == counter_id


def test_duplicate_id_raises(counter_id):
    with pytest.raises(RegistrationError, match="already registered"):
        agentrl.register(counter_id, entry_point=f"{__name__}:Counter")


def test_unknown_id_names_closest(counter_id):
    typo = counter_id.replace("Counter", "Countr")
    with pytest.raises(RegistrationError) as e:
        agentrl.make(typo)
    assert counter_id in str(e.value)


def test_bad_entry_point_is_clear():
    with pytest.raises(RegistrationError, match="package.module:Class"):
        agentrl.register("test/Bad-v0", entry_point="not_a_path")
    agentrl.register("test/Missing-v0", entry_point="no_such_pkg_abc:Env")
    try:
        with pytest.raises(RegistrationError, match="cannot load entry point"):
            agentrl.make("test/Missing-v0")
    finally:
        gymnasium.registry.pop("test/Missing-v0", None)


def test_time_limit_sync_and_async(counter_id):
    env = agentrl.make(counter_id)
    env.reset(seed=0)
    results = [env.step("go") for _ in range(3)]
    assert [r[3] for r in results] == [False, False, True]
    assert results[-1][4]["TimeLimit.truncated"] is True

    async def run():
        env2 = agentrl.make(counter_id, max_episode_steps=2)
        await env2.areset(seed=0)
        a = await env2.astep("go")
        b = await env2.astep("go")
        await env2.aclose()
        return a, b

    a, b = asyncio.run(run())
    assert (a[3], b[3]) == (False, True)


def test_same_seed_same_episode(counter_id):
    env = agentrl.make(counter_id)
    assert env.reset(seed=7)[0] == env.reset(seed=7)[0]


def test_sync_env_runs_off_the_event_loop(counter_id):
    import threading

    seen = []

    class Probe(Counter):
        def step(self, action):
            seen.append(threading.current_thread().name)
            return super().step(action)

    async def run():
        env = Probe()
        await env.areset(seed=0)
        await env.astep("x")

    asyncio.run(run())
    assert seen and seen[0].startswith("agentrl-env")


def test_spaces_accept_text_and_messages():
    s = agentrl.MessagesSpace()
    assert s.contains("hi") and s.contains([{"role": "tool", "content": "3"}])
    assert not s.contains([{"role": "robot", "content": "x"}]) and not s.contains(3)
    t = agentrl.TextSpace(seed=1)
    x = t.sample()
    assert t.contains(x) and not t.contains(b"bytes")
    assert agentrl.TextSpace(seed=5).sample() == agentrl.TextSpace(seed=5).sample()
