"""Train on your own environment with your own reward, through the Python API (no YAML needed).

Run: .venv/bin/python examples/train_custom_env.py [--steps 20]

The env is a two-turn "move the token" game on a line of five cells; the reward is shaped by the user's own rule
(1 for reaching the target, minus 0.1 per extra move, 0 for leaving the line). A scripted solver lets the warm start
imitate a noisy expert, exactly as the CPU quickstart does; RL then has to improve on it.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import re
from typing import Any

import agentrl
from agentrl.config import apply_overrides, from_dict
from agentrl.controller.run import TrainConfig, train

SIZE = 5


class LineWalkEnv(agentrl.Env):
    """Walk the token ``P`` to the target ``T`` on a line of five cells.

    Observation: the line, e.g. ``. P . T .``. Action: ``<answer>left</answer>`` or ``<answer>right</answer>``.
    Reward (the custom rule): on reaching T, ``1 - 0.1 * (moves - shortest)``; stepping off the line ends the
    episode with 0; an unreadable action is a wasted move (reward 0, the episode goes on).
    Termination: on T or off the line. Truncation: the registered TimeLimit (6 moves).
    """

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        super().reset(seed=seed)
        self.pos, self.target = (int(x) for x in self.np_random.choice(SIZE, size=2, replace=False))
        self.moves, self.shortest = 0, abs(self.target - self.pos)
        system = "Move P to T. Reply with one move, like <answer>left</answer> or <answer>right</answer>."
        return [{"role": "system", "content": system}, {"role": "user", "content": self.render()}], {}

    def render(self) -> str:
        return " ".join("P" if i == self.pos else "T" if i == self.target else "." for i in range(SIZE))

    def step(self, action: str):
        self.moves += 1
        m = re.search(r"(left|right)", action.lower())
        if m is None:
            return [{"role": "user", "content": "Say left or right.\n" + self.render()}], 0.0, False, False, {}
        self.pos += -1 if m.group(1) == "left" else 1
        if not 0 <= self.pos < SIZE:
            return [{"role": "user", "content": "You fell off the line."}], 0.0, True, False, {}
        if self.pos == self.target:
            reward = max(0.0, 1.0 - 0.1 * (self.moves - self.shortest))
            return [{"role": "user", "content": "You reached T!"}], reward, True, False, {}
        return [{"role": "user", "content": self.render()}], 0.0, False, False, {}

    @staticmethod
    def solve(conversation: list[dict[str, Any]]) -> str:
        """The expert: move towards T on the last line shown."""
        cells = conversation[-1]["content"].split("\n")[-1].split()
        return "<answer>left</answer>" if cells.index("T") < cells.index("P") else "<answer>right</answer>"


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--run-dir", default="runs/linewalk")
    ap.add_argument("overrides", nargs="*", help="key.sub=value, as for `agentrl train` (e.g. eval.episodes=16)")
    args = ap.parse_args()
    agentrl.register("example/LineWalk-v0", entry_point=LineWalkEnv, max_episode_steps=6)
    cfg = from_dict(TrainConfig, apply_overrides({
        "env": {"id": "example/LineWalk-v0"},
        "run_dir": args.run_dir,
        "steps": args.steps,
        "async_ratio": 1,
        "ray_num_cpus": 2,
        "engine": {"model": "tiny", "max_model_len": 512},
        "rollout": {"temperature": 1.0, "max_tokens_per_turn": 8, "max_turns": 6, "max_context_tokens": 512},
        "manager": {"num_groups": 8, "group_size": 8, "max_turns": 6},
        "trainer": {"optimizer": {"lr": 3e-4}, "micro_batch_size": 64},
        "warm_start": {"episodes": 500, "noise": 0.5, "steps": 60, "batch_size": 32, "lr": 3e-3,
                       "noise_actions": ["<answer>left</answer>", "<answer>right</answer>"]},
        "eval": {"episodes": 128},
    }, args.overrides), source="examples/train_custom_env.py")
    summary = asyncio.run(train(cfg))
    print(json.dumps(summary, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
