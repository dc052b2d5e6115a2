"""The held-out evaluation's success: an episode succeeds when its reward is above 0, or at least
``eval.success_reward`` when that is set (an env that pays partial credit for a loss)."""

from __future__ import annotations

import asyncio

import pytest

from agentrl.controller.heldout import HeldOut
from agentrl.controller.run import ConfigError, evaluate, load_config
from agentrl.inference.base import Generation, InferenceEngine

pytest.importorskip("textarena", reason="the textarena extra: pip install 'agentrl[textarena]'")


class AlwaysDown(InferenceEngine):
    """Answers every turn with ``[down]``: on TextArena's 4x4 FrozenLake the player walks down the left column, so it
    either falls in a hole there or hits the bottom wall twice; it is paid a share of the way, never the goal."""

    def __init__(self, tokenizer):
        self.ids = tokenizer("[down]", add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]

    async def generate(self, prompt_ids, params, *, request_id, session_id=None):
        return Generation(list(self.ids), [-0.1] * len(self.ids), [0] * len(self.ids), "stop")

    async def update_weights(self, state_dict, version):
        return version

    @property
    def version(self) -> int:
        return 0


def _config(tmp_path, *overrides):
    (tmp_path / "c.yaml").write_text("env: {id: textarena/FrozenLake-v0}\nrollout: {max_turns: 10}\n"
                                     "manager: {max_turns: 10}\neval: {episodes: 12}\n")
    return load_config(tmp_path / "c.yaml", list(overrides))


def test_success_is_a_reward_above_0_or_at_least_success_reward(tmp_path, tiny_model_dir):
    from agentrl.chat import load_tokenizer

    tok = load_tokenizer(tiny_model_dir)
    loose, strict = _config(tmp_path), _config(tmp_path, "eval.success_reward=1.0")
    held = HeldOut(loose.env, loose.eval.episodes)
    by_share = asyncio.run(evaluate(AlwaysDown(tok), tok, loose, held))
    by_goal = asyncio.run(evaluate(AlwaysDown(tok), tok, strict, held))
    assert by_share["episodes"] == by_goal["episodes"] == 12
    assert by_share["reward"] == by_goal["reward"] and 0 < by_share["reward"] < 1
    assert by_share["success"] == 1.0 and by_goal["success"] == 0.0


def test_success_reward_must_be_a_number(tmp_path):
    with pytest.raises(ConfigError, match="success_reward"):
        _config(tmp_path, "eval.success_reward=nan")
