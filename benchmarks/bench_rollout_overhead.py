"""Framework overhead of the agent loop: multi-turn rollout through ``AgentLoopPolicy`` against raw engine calls.

Both sides run the same requests on one real vLLM engine with the tiny model: ``--episodes`` concurrent episodes of
``--turns`` turns, each turn generating exactly ``--tokens`` tokens (``ignore_eos``), each env turn adding the same
short user message. The env is a zero-latency in-process env, so what differs is only the agent loop's work
(chat-template rendering and tokenization of env turns, closing tokens, bookkeeping).

- **raw**: per episode, a loop of ``engine.generate(prompt)``, where the next prompt is the previous prompt plus the
  generated ids plus the env turn's token ids (pre-tokenized once, outside the timed region).
- **agent loop**: per episode, ``AgentLoopPolicy`` sessions driven by a bare episode loop in this file (no manager),
  or with ``--manager`` by ``agentrl.manager.EnvManager`` (envs in process).

Runs alternate raw / loop ``--repeats`` times after a warm-up; the figure is generated tokens per second of each,
and their ratio (target: loop >= 0.9x raw).

Run::

    .venv/bin/python benchmarks/bench_rollout_overhead.py
    .venv/bin/python benchmarks/bench_rollout_overhead.py --episodes 16 --turns 3 --repeats 1   # quick
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import time
from typing import Any

from agentrl.core import Env

ENV_REPLY = "Lower than 9. 3 guesses left."


class FixedTurnsEnv(Env):
    """Replies ``ENV_REPLY`` to every action; terminates after ``turns`` steps. Async, zero latency."""

    def __init__(self, turns: int = 4):
        super().__init__()
        self.turns, self.t = turns, 0

    async def areset(self, *, seed=None, options=None):
        self.t = 0
        return [{"role": "system", "content": "Guess my secret integer between 1 and 16."},
                {"role": "user", "content": f"Guess the number. Game {seed}."}], {}

    async def astep(self, action: str):
        self.t += 1
        return [{"role": "user", "content": ENV_REPLY}], 0.0, self.t >= self.turns, False, {}


async def run_episode(
    env: Any, policy: Any, meta: Any, *, options: dict[str, Any] | None = None
) -> tuple[Any, list[dict], list[float], str]:
    """Runs one episode of ``env`` with ``policy`` in this task, with no manager (the bare agent loop).

    Returns ``(session, messages, rewards, termination)``; the session is closed. The framework runs episodes with
    :class:`agentrl.manager.EnvManager` (``--manager``); this measures the agent loop alone.
    """
    from agentrl.core import as_messages

    session = policy.session(meta)
    messages: list[dict] = []
    rewards: list[float] = []
    termination = "terminated"
    try:
        obs, _ = await env.areset(seed=meta.seed, options=options)
        new = as_messages(obs)
        while True:
            messages += new
            action = await session.act(new)
            if action.context_exhausted:
                termination = "truncated"
                break
            messages.append({"role": "assistant", "content": action.text})
            obs, reward, terminated, truncated, _ = await env.astep(action.text)
            rewards.append(float(reward))
            new = as_messages(obs)
            if terminated or truncated:
                messages += new
                termination = "terminated" if terminated else "truncated"
                break
    finally:
        await session.aclose()
    return session, messages, rewards, termination


async def raw_run(engine, tok, args, tag: str) -> dict:
    from agentrl.inference.base import SamplingParams

    params = SamplingParams(temperature=1.0, max_tokens=args.tokens, ignore_eos=True)
    # The env turn's tokens as the template renders them between turns (computed outside the timed region).
    sep = tok("<|im_end|>\n<|im_start|>user\n" + ENV_REPLY + "<|im_end|>\n<|im_start|>assistant\n",
              add_special_tokens=False)["input_ids"]
    prompts = [tok(tok.apply_chat_template(
        [{"role": "system", "content": "Guess my secret integer between 1 and 16."},
         {"role": "user", "content": f"Guess the number. Game {i}."}], add_generation_prompt=True, tokenize=False),
        add_special_tokens=False)["input_ids"] for i in range(args.episodes)]

    async def episode(i: int) -> int:
        ids, n = list(prompts[i]), 0
        for t in range(args.turns):
            g = await engine.generate(ids, params, request_id=f"{tag}-{i}-{t}", session_id=f"{tag}-{i}")
            n += len(g.token_ids)
            ids = ids + g.token_ids + sep
        return n

    t0 = time.perf_counter()
    n = sum(await asyncio.gather(*(episode(i) for i in range(args.episodes))))
    dt = time.perf_counter() - t0
    return {"tokens": n, "wall_s": dt, "tok_per_s": n / dt}


async def loop_run(engine, tok, args, tag: str) -> dict:
    from agentrl.policy import EpisodeMeta
    from agentrl.agent.loop import AgentLoopPolicy, RolloutConfig

    cfg = RolloutConfig(temperature=1.0, max_tokens_per_turn=args.tokens, ignore_eos=True,
                        max_turns=args.turns + 1, max_context_tokens=4096)
    policy = AgentLoopPolicy(engine, tok, cfg)
    t0 = time.perf_counter()
    if args.manager:
        from agentrl.manager import EnvManager, EpisodeSpec, ManagerConfig

        specs = [EpisodeSpec(f"{__name__}:FixedTurnsEnv", env_kwargs={"turns": args.turns}, seed=i)
                 for i in range(args.episodes)]
        async with EnvManager(ManagerConfig(max_concurrency=args.episodes, max_turns=args.turns + 1), policy) as mgr:
            trajs = await mgr.run_episodes(specs)
        bad = [t.error for t in trajs if t.termination != "terminated"]
        if bad:
            raise RuntimeError(f"episodes failed: {bad[:2]}")
        n = sum(t.num_generated for t in trajs)
    else:
        async def episode(i: int) -> int:
            env = FixedTurnsEnv(turns=args.turns)
            s, _, _, term = await run_episode(env, policy, EpisodeMeta(f"{tag}-{i}", f"{tag}-{i}", "fixed", i))
            assert term == "terminated", term
            return sum(s.loss_mask)

        n = sum(await asyncio.gather(*(episode(i) for i in range(args.episodes))))
    dt = time.perf_counter() - t0
    return {"tokens": n, "wall_s": dt, "tok_per_s": n / dt}


async def main_async(args) -> dict:
    from agentrl.chat import load_tokenizer
    from agentrl.inference import EngineConfig, make_engine
    from agentrl.models import ensure_tiny_model

    model = args.model or str(ensure_tiny_model())
    tok = load_tokenizer(model)
    cfg = EngineConfig(model=model, max_model_len=max(1024, 64 + args.turns * (args.tokens + 32)),
                       max_num_seqs=max(args.episodes, 16))
    engine = await asyncio.to_thread(make_engine, cfg)
    try:
        await raw_run(engine, tok, argparse.Namespace(**{**vars(args), "episodes": min(args.episodes, 16), "turns": 2}), "warm")
        runs: dict[str, list[dict[str, Any]]] = {"raw": [], "loop": []}
        for r in range(args.repeats):
            runs["raw"].append(await raw_run(engine, tok, args, f"raw{r}"))
            runs["loop"].append(await loop_run(engine, tok, args, f"loop{r}"))
            print(f"repeat {r}: raw {runs['raw'][-1]['tok_per_s']:.0f} tok/s, loop {runs['loop'][-1]['tok_per_s']:.0f} tok/s",
                  file=sys.stderr)
    finally:
        await engine.close()
    med = {k: statistics.median(x["tok_per_s"] for x in v) for k, v in runs.items()}
    expected = args.episodes * args.turns * args.tokens
    return {"episodes": args.episodes, "turns": args.turns, "tokens_per_turn": args.tokens,
            "manager": args.manager, "runs": runs, "median_tok_per_s": med,
            "all_lengths_exact": all(x["tokens"] == expected for v in runs.values() for x in v),
            "ratio_loop_over_raw": med["loop"] / med["raw"],
            # Less sensitive to a noisy shared machine: all tokens over all wall time of each side.
            "ratio_total_tokens_over_total_time": (sum(x["tokens"] for x in runs["loop"]) / sum(x["wall_s"] for x in runs["loop"]))
            / (sum(x["tokens"] for x in runs["raw"]) / sum(x["wall_s"] for x in runs["raw"]))}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default=None)
    p.add_argument("--episodes", type=int, default=64)
    p.add_argument("--turns", type=int, default=4)
    p.add_argument("--tokens", type=int, default=32, help="generated tokens per turn (exact, ignore_eos)")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--manager", action="store_true", help="drive the agent loop through EnvManager")
    p.add_argument("--json", default=None)
    args = p.parse_args()
    out = asyncio.run(main_async(args))
    text = json.dumps(out, indent=2)
    print(text)
    if args.json:
        with open(args.json, "w") as f:
            f.write(text + "\n")
    print(f"\nagent loop / raw engine: {out['ratio_loop_over_raw']:.3f}x by median tok/s, "
          f"{out['ratio_total_tokens_over_total_time']:.3f}x by total tokens / total time (target >= 0.9)", file=sys.stderr)
    return 0


if __name__ == "__main__":
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "2")
    sys.exit(main())
