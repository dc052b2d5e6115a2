"""Train your own OpenAI-client agent loop with agentrl, unchanged, through the gateway.

Run: .venv/bin/python examples/train_openai_agent.py [--steps 20]

``guess_number_agent`` below is an ordinary agent written against the ``openai`` client: it plays the built-in
GuessNumber game itself (its own env instance, its own message list, its own reward). agentrl runs it as the
episodes of a training run: each run gets a gateway session (``ctx.base_url`` / ``ctx.api_key``), every token the
model samples for it is recorded with its log-prob and policy version, and the returned reward trains the policy
with the same manager (groups of runs on the same seed, async ratio, staleness) and trainer as native episodes.
"""

from __future__ import annotations

import argparse
import asyncio
import json

import openai

import agentrl
from agentrl.config import from_dict
from agentrl.gateway import HARNESS_ENV_ID, HarnessContext, harness_policy
from agentrl.controller.run import TrainConfig, train


async def guess_number_agent(ctx: HarnessContext) -> float:
    """A user's agent loop: nothing in it knows about agentrl except where ``base_url``/``api_key``/``seed`` come
    from. Returns the episode's reward (1 for finding the number)."""
    env = agentrl.make("agentrl/GuessNumber-v0")
    obs, _ = env.reset(seed=ctx.seed)
    messages = list(obs)
    total = 0.0
    async with openai.AsyncOpenAI(base_url=ctx.base_url, api_key=ctx.api_key, max_retries=0) as client:
        for _ in range(8):
            r = await client.chat.completions.create(model=ctx.model, messages=messages, max_tokens=8)
            reply = r.choices[0].message.content or ""
            messages.append({"role": "assistant", "content": reply})
            obs, reward, terminated, truncated, _ = env.step(reply)
            total += float(reward)
            messages += obs
            if terminated or truncated:
                break
    env.close()
    return total


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--run-dir", default="runs/openai-agent")
    args = ap.parse_args()
    cfg = from_dict(TrainConfig, {
        "env": {"id": HARNESS_ENV_ID},  # the harness owns the real env; the seed of each group reaches ctx.seed
        "run_dir": args.run_dir,
        "steps": args.steps,
        "async_ratio": 1,
        "ray_num_cpus": 2,
        "engine": {"model": "tiny", "max_model_len": 512},
        "rollout": {"temperature": 1.0},  # the gateway samples with these, whatever the agent asks
        "manager": {"num_groups": 4, "group_size": 4, "max_turns": 16},  # max_turns bounds requests per run
        "trainer": {"optimizer": {"lr": 3e-4}, "micro_batch_size": 64},
        "eval": {"episodes": 0},  # held-out eval runs the native agent loop; the harness has its own
    }, source="examples/train_openai_agent.py")
    summary = asyncio.run(train(cfg, policy=harness_policy(guess_number_agent)))
    print(json.dumps(summary, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
