"""SkyRL-Gym envs as agentrl envs (the real skyrl-gym package): made per dataset row from a task file, rewards from
SkyRL's own scorers, ``agentrl envs check`` and 64 episodes at once through the manager."""

from __future__ import annotations

from pathlib import Path

import pytest

import agentrl
from agentrl.cli import main
from agentrl.envs.bridges.skyrl_gym_env import load_rows
from agentrl.manager import EnvManager, EpisodeSpec, ManagerConfig
from agentrl.policy import ScriptedPolicy

import skyrl_gym  # noqa: F401  the skyrl-gym extra (setup.sh installs it)

pytestmark = pytest.mark.timeout(300)

ROWS = str(Path(__file__).parent / "data" / "skyrl_gsm8k_rows.jsonl")
GSM8K, MULTI = "skyrl_gym/gsm8k", "skyrl_gym/gsm8k_multi_turn"


def test_single_turn_gsm8k_is_scored_by_skyrl():
    env = agentrl.make(GSM8K, tasks=ROWS)
    obs, info = env.reset(seed=0)
    assert obs[0]["content"].startswith("Tom has 3 boxes") and info["task_key"].startswith(f"{GSM8K}:")
    assert env.step("36 - 7 = 29\n#### 29")[1:3] == (1.0, True)
    env.reset(seed=0)
    assert env.step("#### 30")[1:3] == (0.0, True)
    assert agentrl.make(GSM8K, tasks=ROWS).reset(seed=4)[1]["task_key"] == info["task_key"]  # 4 rows: seed 4 is row 0
    fresh = agentrl.make(GSM8K, tasks=ROWS).unwrapped
    assert fresh.task_key(8) == info["task_key"] and fresh.sky is None  # task_key(seed) makes no SkyRL env


def test_multi_turn_gsm8k_gives_turn_rewards_and_observations():
    env = agentrl.make(MULTI, tasks=ROWS)
    env.reset(seed=1)
    obs, reward, terminated, _, _ = env.step("about #### 200")
    assert 0 < reward < 1 and not terminated and "#### ANSWER" in obs[0]["content"]  # format credit only
    assert env.step("#### 260")[1:3] == (1.0, True)


def test_bad_task_files_and_ids_say_what_is_wrong(tmp_path):
    bad = tmp_path / "rows.jsonl"
    bad.write_text('{"prompt": "ok", "reward_spec": {"ground_truth": "1"}}\n{"question": "no prompt"}\n')
    with pytest.raises(ValueError, match=r"rows.jsonl:2: a row needs a 'prompt'"):
        agentrl.make(GSM8K, tasks=str(bad))
    with pytest.raises(agentrl.RegistrationError, match="did you mean 'skyrl_gym/gsm8k'"):
        agentrl.make("skyrl_gym/gsm8", tasks=ROWS)


def test_envs_check_with_the_task_file(capsys):
    assert main(["envs", "check", GSM8K, MULTI, f"tasks={ROWS}"]) == 0
    assert capsys.readouterr().out.rstrip().endswith("2 passed, 0 failed")


async def test_64_episodes_at_once_through_the_manager_are_reproducible():
    rows = load_rows(ROWS)

    def answer(conversation, meta):
        return f"so the answer is\n#### {rows[meta.seed % len(rows)]['reward_spec']['ground_truth']}"

    specs = [EpisodeSpec(env_id, {"tasks": ROWS}, seed=s) for env_id in (GSM8K, MULTI) for s in range(32)]
    async with EnvManager(ManagerConfig(max_concurrency=64), ScriptedPolicy(answer)) as m:
        first = await m.run_episodes(specs)
        again = await m.run_episodes(specs[:8])
    assert [t.error for t in first + again] == [None] * 72
    assert all(t.reward == 1.0 and t.num_turns == 1 and t.termination == "terminated" for t in first + again)
    assert [t.messages for t in first[:8]] == [t.messages for t in again]
