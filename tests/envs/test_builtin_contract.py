"""The contract every built-in env keeps: registration, gymnasium's checker, seeding, scripted solver, time
limits and the async path."""

from __future__ import annotations

import math

import gymnasium
import pytest

import agentrl
from agentrl.core import MessagesSpace, TimeLimit, as_messages
from agentrl.envs import BUILTINS, scripted_policy, solver_for
from agentrl.envs.utils import play_episode
from agentrl.policy import EpisodeMeta
from agentrl.registration import description

BUILTIN_IDS = [
    "agentrl/FrozenLake-v0", "agentrl/GuessNumber-v0", "agentrl/Arithmetic-v0", "agentrl/ToolUse-v0",
    "agentrl/ToolLookup-v0",
]


def test_builtins_are_registered_with_descriptions():
    ids = agentrl.registered_ids("agentrl")
    for env_id in BUILTIN_IDS:
        assert env_id in ids
        assert env_id in gymnasium.registry
        assert gymnasium.registry[env_id].entry_point.startswith("agentrl.envs.")
        assert description(env_id) == BUILTINS[env_id]["description"]


@pytest.mark.parametrize("env_id", BUILTIN_IDS)
def test_check_env_raw_made_and_gymnasium_made(env_id, checked):
    cls = agentrl.make(env_id).unwrapped.__class__
    checked(cls())  # no spec at all
    checked(agentrl.make(env_id).unwrapped)
    checked(agentrl.make(env_id))
    gym_env = gymnasium.make(env_id)
    assert isinstance(gym_env.unwrapped, agentrl.Env)
    checked(gym_env)


@pytest.mark.parametrize("env_id", BUILTIN_IDS)
def test_reset_observation_is_system_then_user_and_in_space(env_id):
    env = agentrl.make(env_id)
    obs, info = env.reset(seed=1)
    assert obs in MessagesSpace() and isinstance(info, dict)
    assert [m["role"] for m in obs] == ["system", "user"]
    assert all(m["content"].strip() for m in obs)
    # The prompts are meant for a tiny model with a 512-token context: keep them short.
    assert sum(len(m["content"]) for m in obs) < 400, obs


@pytest.mark.parametrize("env_id", BUILTIN_IDS)
def test_same_seed_same_episode_and_seeds_differ(env_id):
    env = agentrl.make(env_id)
    solve = solver_for(env_id)
    first = play_episode(env, solve, seed=7)
    again = play_episode(agentrl.make(env_id), solve, seed=7)
    assert first.conversation == again.conversation
    assert first.rewards == again.rewards
    episodes = {repr(play_episode(env, solve, seed=s).conversation) for s in range(10)}
    assert len(episodes) >= 5, "ten seeds should give (mostly) different episodes"
    # Unseeded resets after a seeded one continue the same RNG stream.
    env.reset(seed=3)
    a = as_messages(env.reset()[0])
    env.reset(seed=3)
    assert as_messages(env.reset()[0]) == a


@pytest.mark.parametrize("env_id", BUILTIN_IDS)
def test_scripted_solver_wins_every_seed(env_id):
    env = agentrl.make(env_id)
    solve = solver_for(env_id)
    for seed in range(60):
        result = play_episode(env, solve, seed=seed)
        assert result.terminated and not result.truncated, (seed, result.conversation)
        assert result.total_reward == 1.0, (seed, result.conversation)
        assert result.rewards[-1] == 1.0
        for m in result.conversation:
            assert m["role"] in ("system", "user", "assistant", "tool") and isinstance(m["content"], str)


@pytest.mark.parametrize("env_id", BUILTIN_IDS)
def test_env_class_solve_is_the_module_solver(env_id):
    env = agentrl.make(env_id)
    obs, _ = env.reset(seed=0)
    assert env.unwrapped.solve(as_messages(obs)) == solver_for(env_id)(as_messages(obs))


@pytest.mark.parametrize("env_id", BUILTIN_IDS)
async def test_async_path_matches_sync_and_solves(env_id):
    env = agentrl.make(env_id)
    sync_obs, sync_info = env.reset(seed=11)
    obs, info = await env.areset(seed=11)
    assert obs == sync_obs
    policy = scripted_policy(env_id)
    session = policy.session(EpisodeMeta(trajectory_id="t", group_id="g", env_id=env_id, seed=11))
    total, new = 0.0, as_messages(obs)
    for _ in range(30):
        action = await session.act(new)
        obs, reward, terminated, truncated, info = await env.astep(action.text)
        assert math.isfinite(float(reward))
        total += float(reward)
        new = as_messages(obs)
        if terminated or truncated:
            break
    assert terminated and total == 1.0
    await env.aclose()
    await env.aclose()  # closing twice is allowed


# An action that is invalid in every built-in env and never ends an episode except the single-turn one.
_TRUNCATION_CASES = {
    "agentrl/FrozenLake-v0": "jump",
    "agentrl/GuessNumber-v0": "banana",
    "agentrl/ToolUse-v0": "I am thinking.",
    "agentrl/ToolLookup-v0": "I am thinking.",
}


@pytest.mark.parametrize("env_id", sorted(_TRUNCATION_CASES))
async def test_time_limit_truncates_sync_and_async(env_id):
    action = _TRUNCATION_CASES[env_id]
    env = agentrl.make(env_id, max_episode_steps=3)
    assert isinstance(env, TimeLimit) and env.max_episode_steps == 3
    env.reset(seed=0)
    flags = [env.step(action)[2:4] for _ in range(3)]
    assert flags == [(False, False), (False, False), (False, True)]
    await env.areset(seed=0)
    results = [await env.astep(action) for _ in range(3)]
    assert [r[3] for r in results] == [False, False, True]
    assert results[-1][4].get("TimeLimit.truncated") is True
    # gymnasium.make applies the registered limit (or the one given) through gymnasium's own TimeLimit.
    gym_env = gymnasium.make(env_id, max_episode_steps=2)
    gym_env.reset(seed=0)
    assert gym_env.step(action)[3] is False and gym_env.step(action)[3] is True


def test_registered_time_limits():
    assert agentrl.make("agentrl/FrozenLake-v0").max_episode_steps == 20
    assert agentrl.make("agentrl/ToolUse-v0").max_episode_steps == 8
    assert agentrl.make("agentrl/ToolLookup-v0").max_episode_steps == 5
    # These two bound their own episodes (a guess budget; a single turn), so they carry no TimeLimit.
    assert not isinstance(agentrl.make("agentrl/GuessNumber-v0"), TimeLimit)
    assert not isinstance(agentrl.make("agentrl/Arithmetic-v0"), TimeLimit)


def test_single_turn_env_terminates_rather_than_truncates_at_limit():
    env = agentrl.make("agentrl/Arithmetic-v0", max_episode_steps=1)
    env.reset(seed=0)
    _, _, terminated, truncated, _ = env.step("garbage")
    assert terminated and not truncated


def test_make_kwargs_reach_the_env():
    assert agentrl.make("agentrl/FrozenLake-v0", size=6).unwrapped.size == 6
    assert agentrl.make("agentrl/GuessNumber-v0", high=100).unwrapped.high == 100
    assert agentrl.make("agentrl/Arithmetic-v0", difficulty=4).unwrapped.difficulty == 4
    assert agentrl.make("agentrl/ToolUse-v0", num_people=3).unwrapped.num_people == 3
    assert agentrl.make("agentrl/ToolLookup-v0", num_people=3).unwrapped.num_people == 3


def test_solver_for_unknown_or_solverless_env():
    with pytest.raises(agentrl.RegistrationError, match="did you mean"):
        solver_for("agentrl/FrozenLak-v0")
    with pytest.raises(LookupError, match="no scripted solver"):
        solver_for("CartPole-v1")


# Envs whose task is its whole transcript under the scripted solver (the solver reveals every hidden part).
FULLY_REVEALED = ["agentrl/FrozenLake-v0", "agentrl/GuessNumber-v0", "agentrl/Arithmetic-v0"]


@pytest.mark.parametrize("env_id", BUILTIN_IDS)
def test_task_key_names_the_task_content_and_leaves_reset_alone(env_id):
    """Held-out evaluation relies on it (agentrl/controller/heldout.py): equal keys mean the same task (the
    scripted solver plays the same episode); where the solver reveals the whole task, the same task means equal
    keys. Small settings make seeds collide, and the key must see it."""
    kwargs = {"agentrl/FrozenLake-v0": {"size": 3}, "agentrl/GuessNumber-v0": {"high": 8},
              "agentrl/Arithmetic-v0": {"difficulty": 1}}.get(env_id, {})
    env = agentrl.make(env_id, **kwargs)
    solve = solver_for(env_id)
    seeds = range(300)
    keys = [env.unwrapped.task_key(s) for s in seeds]
    assert all(isinstance(k, str) for k in keys)
    plays = [repr(play_episode(agentrl.make(env_id, **kwargs), solve, seed=s).conversation) for s in seeds]
    by_key: dict = {}
    for k, p in zip(keys, plays):
        assert by_key.setdefault(k, p) == p, f"{env_id}: one key for two different tasks"
    if env_id in FULLY_REVEALED:
        assert len(set(plays)) == len(set(keys)) < len(keys)  # seeds collide, and the keys say so
    # task_key on the same instance does not change what a seeded reset draws
    env.reset(seed=5)
    first = as_messages(env.reset(seed=11)[0])
    env.unwrapped.task_key(12)
    assert as_messages(env.reset(seed=11)[0]) == first


def test_dataset_envs_name_the_item_a_seed_selects():
    bfcl = agentrl.make("agentrl/BFCL-simple-python-v0").unwrapped
    assert bfcl.task_key(3) == bfcl.task_key(3 + bfcl.num_tasks) != bfcl.task_key(4)  # seed % num_tasks
    assert bfcl.task_key(3).endswith(bfcl.task_ids()[3])
    swe = agentrl.make("agentrl/SWE-v0").unwrapped  # no sandbox is started for a key
    for s in range(20):
        gymnasium.Env.reset(swe, seed=s)  # what areset draws the instance from
        assert swe.task_key(s) == swe._pick(s, None).instance_id
    assert len({swe.task_key(s) for s in range(40)}) < 40  # 13 instances: seeds collide


@pytest.mark.parametrize("env_id", BUILTIN_IDS + ["reasoning_gym/aiw", "agentrl/SWE-v0"])
def test_a_made_env_refuses_a_step_before_its_first_reset_sync_and_async(env_id):
    """As gymnasium's ``make`` does (``OrderEnforcing``). Stepped from its constructor's state, GuessNumber paid 1.0
    for a guess of 1, and Arithmetic told the answer of no question."""
    import asyncio

    for first in ("step", "astep"):
        env = agentrl.make(env_id)
        try:
            with pytest.raises(gymnasium.error.ResetNeeded):
                if first == "step":
                    env.step("<answer>1</answer>")
                else:
                    asyncio.run(env.astep("<answer>1</answer>"))
        finally:
            env.close()
    env = agentrl.make("agentrl/GuessNumber-v0")
    asyncio.run(env.areset(seed=0))
    assert env.step("<answer>1</answer>")[4]["guesses_left"] >= 0  # after a reset (async here) it steps
