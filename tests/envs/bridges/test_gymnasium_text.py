"""gymnasium envs whose spaces are not text, as agentrl envs (``gymnasium/<id>``): the real gymnasium envs, played
from text, checked by ``agentrl envs check`` and run through the manager."""

from __future__ import annotations

import gymnasium
import numpy as np
import pytest
from gymnasium import spaces

import agentrl
from agentrl.cli import main
from agentrl.manager import EnvManager, EpisodeSpec, ManagerConfig
from agentrl.policy import ScriptedPolicy

LAKE = "gymnasium/FrozenLake-v1"


def test_frozen_lake_is_played_by_action_names_and_an_invalid_answer_never_reaches_it():
    env = agentrl.make(LAKE, env_kwargs={"is_slippery": False})
    obs, info = env.reset(seed=0)
    assert "0 (left), 1 (down), 2 (right), 3 (up)" in obs[0]["content"]
    assert "[S]FFF\nFHFH" in obs[0]["content"] and obs[0]["content"].endswith("Observation: 0")  # the agent, bracketed
    obs, reward, terminated, truncated, info = env.step("<answer>jump</answer>")
    assert (reward, terminated, truncated, info) == (0.0, False, False, {"invalid_action": True})
    assert "'jump' is not one of the actions" in obs[0]["content"]
    total = 0.0
    for move in ["right", "<answer>RIGHT</answer>", "1", "I go down: <answer>down</answer>", "<answer>1</answer>"]:
        obs, reward, terminated, _, _ = env.step(move)
        total += reward
        assert not terminated
    assert "Observation: 14" in obs[0]["content"]  # the invalid answer did not move the agent
    assert env.step("<answer>2</answer>")[1:3] == (1.0, True)


def test_task_keys_are_the_first_observation_so_a_fixed_start_is_one_task():
    lake, cart = agentrl.make(LAKE).unwrapped, agentrl.make("gymnasium/CartPole-v1").unwrapped
    assert len({lake.task_key(s) for s in range(5)}) == 1  # FrozenLake always starts at S
    assert len({cart.task_key(s) for s in range(5)}) == 5
    env = agentrl.make("gymnasium/CartPole-v1")
    assert env.reset(seed=3)[1]["task_key"] == cart.task_key(3)
    env.step("1")
    assert env.reset(seed=3)[1]["task_key"] == cart.task_key(3)  # task_key's env of its own leaves episodes alone


def test_box_actions_are_clipped_and_numbers_that_do_not_fit_are_refused():
    env = agentrl.make("gymnasium/Pendulum-v1")
    env.reset(seed=0)
    inner = env.unwrapped.inner.unwrapped
    env.step("<answer>[5]</answer>")
    assert inner.last_u == pytest.approx(2.0)  # clipped to the space's high
    env.step("-0.5")
    assert inner.last_u == pytest.approx(-0.5)
    for bad in ("[1, 2]", "nan", "1e400", "", "x" * 100_000):
        obs, reward, _, _, info = env.step(bad)
        assert info == {"invalid_action": True} and reward == 0.0 and "Invalid action" in obs[0]["content"]
    assert inner.last_u == pytest.approx(-0.5)


class _Multi(gymnasium.Env):
    """A third-party env registered without a namespace, with integer vector actions."""

    observation_space = spaces.Dict({"pos": spaces.MultiDiscrete([3, 3]), "t": spaces.Box(0, 1, (1,))})

    def __init__(self, binary: bool = False):
        self.action_space = spaces.MultiBinary(3) if binary else spaces.MultiDiscrete([2, 5])
        self.last = None

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        return {"pos": np.array([1, 2]), "t": np.array([0.123456], dtype=np.float32)}, {"note": "hi", "arr": [1]}

    def step(self, action):
        self.last = action
        return self.reset()[0], 1.0, True, False, {}


class _DictActions(_Multi):
    action_space = spaces.Dict({"a": spaces.Discrete(2)})

    def __init__(self):
        self.last = None


@pytest.fixture
def third_party_ids():
    names = {"AgentrlTestMulti-v0": _Multi, "AgentrlTestDictActions-v0": _DictActions}
    for name, cls in names.items():
        gymnasium.register(name, entry_point=cls)
    yield
    for name in names:  # the other tests' registries stay as they were
        gymnasium.registry.pop(name, None)
        gymnasium.registry.pop(f"gymnasium/{name}", None)


def test_integer_vector_actions_and_other_packages_ids(third_party_ids):
    env = agentrl.make("gymnasium/AgentrlTestMulti-v0")
    obs, info = env.reset(seed=0)
    assert obs[0]["content"].endswith('Observation: {"pos": [1, 2], "t": [0.1235]}') and info["note"] == "hi"
    assert "arr" not in info  # only JSON scalars pass into info
    assert env.step("[2, 0]")[3:] == (False, {"invalid_action": True})  # 2 is outside [0, 2)
    assert env.step("[1.5, 0]")[4] == {"invalid_action": True}
    assert env.step("<answer>[1, 4]</answer>")[1:3] == (1.0, True)
    assert env.unwrapped.inner.unwrapped.last.tolist() == [1, 4]
    binary = agentrl.make("gymnasium/AgentrlTestMulti-v0", env_kwargs={"binary": True})
    binary.reset(seed=0)
    assert binary.step("1 0 1")[1] == 1.0 and binary.unwrapped.inner.unwrapped.last.tolist() == [1, 0, 1]
    with pytest.raises(ValueError, match=r"gymnasium/AgentrlTestDictActions-v0: action space Dict"):
        agentrl.make("gymnasium/AgentrlTestDictActions-v0")
    with pytest.raises(ValueError, match="action_names has 2 names for 4 actions"):
        agentrl.make(LAKE, action_names=["a", "b"])


def test_envs_check_of_the_bare_id_names_the_family(capsys):
    assert main(["envs", "check", "CartPole-v1"]) == 1
    assert "make it as 'gymnasium/CartPole-v1', which puts both into text" in capsys.readouterr().out


def test_envs_check_passes_the_classic_envs(capsys):
    ids = [LAKE, "gymnasium/CartPole-v1", "gymnasium/Taxi-v4", "gymnasium/Blackjack-v1", "gymnasium/Pendulum-v1",
           "gymnasium/MountainCarContinuous-v0", "gymnasium/CliffWalking-v1"]
    assert main(["envs", "check", *ids]) == 0
    assert capsys.readouterr().out.rstrip().endswith(f"{len(ids)} passed, 0 failed")


async def test_cartpole_episodes_through_the_manager_are_reproducible():
    def balance(conversation, meta):  # push toward the side the pole falls to
        _, _, angle, turning = (float(x) for x in conversation[-1]["content"].rsplit("[", 1)[1].strip("]").split(","))
        return f"<answer>{int(angle + 0.5 * turning > 0)}</answer>"

    specs = [EpisodeSpec("gymnasium/CartPole-v1", seed=s) for s in range(16)]
    async with EnvManager(ManagerConfig(max_concurrency=16, max_turns=60), ScriptedPolicy(balance)) as m:
        first = await m.run_episodes(specs)
        again = await m.run_episodes(specs[:4])
    assert [t.error for t in first + again] == [None] * 20
    assert all(t.reward == 60 for t in first), [t.reward for t in first]  # balanced to the turn limit
    assert [t.messages for t in first[:4]] == [t.messages for t in again]
