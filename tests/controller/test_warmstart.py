"""The warm start's scripted play: an env whose right action needs the episode (reasoning-gym: the gold answer is in
the dataset entry that the seed picks, not in the conversation) warm-starts from its oracle; an env with neither a
solver nor an oracle is an error that names it."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

import agentrl
from agentrl.controller.heldout import HeldOut
from agentrl.controller.run import load_config, warm_start
from agentrl.controller.warmstart import noisy_actor, scripted_actor

pytest.importorskip("reasoning_gym", reason="the reasoning-gym extra: pip install 'agentrl[reasoning-gym]'")

ROOT = Path(__file__).resolve().parents[2]
CONFIG = ROOT / "configs" / "reasoning_gym.yaml"


def test_a_reasoning_gym_env_warm_starts_on_its_gold_answers(tmp_path, tiny_model_dir):
    from agentrl.chat import load_tokenizer

    # noise 0: every demonstration is the oracle's answer, so each one scores 1.0 (the gold answer of its own seed).
    cfg = load_config(CONFIG, ["warm_start.episodes=6", "warm_start.steps=1", "warm_start.batch_size=2",
                               "warm_start.noise=0", "eval.episodes=2"])
    held = HeldOut(cfg.env, cfg.eval.episodes)
    out = asyncio.run(warm_start(cfg, tiny_model_dir, tmp_path / "ws", load_tokenizer(tiny_model_dir), held))
    stats = json.loads((tmp_path / "ws" / "warmstart.json").read_text())
    assert out == tmp_path / "ws" / "model" and out.is_dir()
    assert stats["demonstrations"] == 6 and stats["demo_reward"] == 1.0


def test_noisy_oracle_answers_by_seed_and_plays_the_noise_actions():
    cfg = load_config(CONFIG)
    env = agentrl.make(cfg.env.id, **dict(cfg.env.kwargs))
    act = scripted_actor(cfg.env.id, dict(cfg.env.kwargs))
    always_wrong = noisy_actor(act, ["<answer>nobody</answer>"], 1.0, seed=0)
    for seed in (3, 4):
        obs, _ = env.reset(seed=seed)
        meta = type("Meta", (), {"trajectory_id": f"t{seed}", "env_id": cfg.env.id, "seed": seed})()
        assert env.step(act(obs, meta))[1] == 1.0
        assert always_wrong(obs, meta) == "<answer>nobody</answer>"


def test_an_env_without_solver_or_oracle_is_named():
    agentrl.register("test/NoScript-v0", entry_point="agentrl.testing.manager_envs:SleepEnv")
    with pytest.raises(LookupError, match=r"warm start: env 'test/NoScript-v0' has no scripted play"):
        scripted_actor("test/NoScript-v0")


@pytest.mark.parametrize("name", ["reasoning_gym_aiw", "textarena_frozenlake"])
def test_the_bridged_training_configs_load_and_their_scripted_play_wins(name):
    # The configs BENCHMARKS.md's learning runs use: each loads, and its warm start's play solves the env.
    pytest.importorskip("textarena", reason="the textarena extra: pip install 'agentrl[textarena]'")
    cfg = load_config(ROOT / "configs" / f"{name}.yaml")
    act = scripted_actor(cfg.env.id, dict(cfg.env.kwargs))
    env = agentrl.make(cfg.env.id, **dict(cfg.env.kwargs))
    for seed in range(5):
        conversation, _ = env.reset(seed=seed)
        conversation = list(conversation)
        meta = type("Meta", (), {"trajectory_id": f"t{seed}", "env_id": cfg.env.id, "seed": seed})()
        for _ in range(cfg.rollout.max_turns):
            action = act(conversation, meta)
            obs, reward, done, _, _ = env.step(action)
            conversation += [{"role": "assistant", "content": action}, *obs]
            if done:
                break
        assert done and reward >= (cfg.eval.success_reward or 1.0), (name, seed, conversation[-1])
