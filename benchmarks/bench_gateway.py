"""Gateway throughput against the native agent loop on the same episodes (target: gateway >= 0.95x native).

Both sides run the same episodes on one real vLLM engine (the tiny CPU model by default) through
``agentrl.manager.EnvManager``: ``--episodes`` episodes at once, ``--turns`` turns each, every turn generating
exactly ``--tokens`` tokens (``ignore_eos``), every env turn adding the same short user message.

- **native**: ``AgentLoopPolicy`` on an in-process env that replies with that message (token-in/token-out loop).
- **gateway**: ``HarnessPolicy``; each episode's harness is a user-style loop that sends the whole conversation
  over HTTP to the gateway each turn, as OpenAI harnesses do, with a bare aiohttp client (``--client aiohttp``,
  default: what is measured is the gateway) or the ``openai`` client (``--client openai``; one connection pool
  shared by all episodes; adds the library's own per-request cost, mostly its request-body transformation). The gateway renders, matches the session, samples, parses, answers
  JSON. Client and gateway share this process's two cores with the engine, so the client's cost counts too.

Runs alternate native / gateway ``--repeats`` times after a warm-up of each; reported: generated tokens per second
of each side (median over repeats), the ratio, the driver process's CPU time per turn (``time.process_time``: the
manager, the agent loop or the gateway and its client, vLLM's front end; not the engine core, its own process), and
the load average before and after (the machine is shared).

``--engine instant``: an engine that returns ``--tokens`` tokens at once instead of vLLM, so only the per-turn CPU
of each side is left (what bounds the driver when the engine is fast, e.g. on a GPU).

Run::

    .venv/bin/python benchmarks/bench_gateway.py                       # 64 episodes x 4 turns x 32 tokens, 3 repeats
    .venv/bin/python benchmarks/bench_gateway.py --episodes 16 --repeats 1   # quick
    .venv/bin/python benchmarks/bench_gateway.py --engine instant            # per-turn CPU, no model
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import os
import statistics
import sys
import time
from typing import Any

from agentrl.core import Env

ENV_REPLY = "Lower than 9. 3 guesses left."


def opening(seed: Any) -> list[dict[str, str]]:
    return [{"role": "system", "content": "Guess my secret integer between 1 and 16."},
            {"role": "user", "content": f"Guess the number. Game {seed}."}]


class FixedTurnsEnv(Env):
    """Replies ``ENV_REPLY`` to every action; terminates after ``turns`` steps. Async, zero latency."""

    def __init__(self, turns: int = 4):
        super().__init__()
        self.turns, self.t = turns, 0

    async def areset(self, *, seed=None, options=None):
        self.t = 0
        return opening(seed), {}

    async def astep(self, action: str):
        self.t += 1
        return [{"role": "user", "content": ENV_REPLY}], 0.0, self.t >= self.turns, False, {}


class InstantEngine:
    """Returns ``max_tokens`` tokens of fixed ordinary text at once (log-prob -0.1, version 0): no model cost."""

    def __init__(self, tok, max_model_len: int):
        ids = tok(" I guess the number is eight, then nine.", add_special_tokens=False)["input_ids"]
        self.ids, self.max_model_len, self.model_path, self.version = ids * 64, max_model_len, None, 0

    async def generate(self, prompt_ids, params, *, request_id, session_id=None):
        from agentrl.inference.base import Generation

        out = self.ids[: params.max_tokens]
        await asyncio.sleep(0)
        return Generation(out, [-0.1] * len(out), [0] * len(out), "length")

    async def abort(self, request_id):
        pass

    async def close(self):
        pass


GC = {"s": 0.0, "full": 0, "t0": 0.0}  # the cyclic garbage collector's time in this process, and its full passes


def _gc_timer(phase: str, info: dict) -> None:
    if phase == "start":
        GC["t0"] = time.perf_counter()
    else:
        GC["s"] += time.perf_counter() - GC["t0"]
        GC["full"] += info["generation"] == 2


LAG: list[tuple[float, float]] = []  # (when, how late) of a 10 ms sleep in this event loop
LATENCY: list[float] = []  # each gateway request's round trip, as the harness sees it


async def lag_sentinel() -> None:
    """Records how late the event loop wakes a 10 ms sleep: the process's own scheduling delay (machine load), to
    tell a slow request caused by it from one caused by the gateway."""
    while True:
        t = time.perf_counter()
        await asyncio.sleep(0.01)
        now = time.perf_counter()
        LAG.append((now, now - t - 0.01))


def stalls(t0: float, t1: float) -> dict[str, float]:
    lags = [x for when, x in LAG if t0 <= when <= t1] or [0.0]
    return {"loop_lag_max_s": max(lags), "request_max_s": max(LATENCY, default=0.0)}


def loadavg() -> str:
    try:
        return " ".join(open("/proc/loadavg").read().split()[:3])
    except OSError:
        return "n/a"


async def run_native(engine, tok, args, tag: str) -> dict:
    from agentrl.manager import EnvManager, EpisodeSpec, ManagerConfig
    from agentrl.agent.loop import AgentLoopPolicy, RolloutConfig

    cfg = RolloutConfig(temperature=1.0, max_tokens_per_turn=args.tokens, ignore_eos=True, max_turns=args.turns + 1,
                        max_context_tokens=4096)
    policy = AgentLoopPolicy(engine, tok, cfg)
    specs = [EpisodeSpec(f"{__name__}:FixedTurnsEnv", env_kwargs={"turns": args.turns}, seed=i)
             for i in range(args.episodes)]
    t0, c0, g0 = time.perf_counter(), time.process_time(), dict(GC)
    async with EnvManager(ManagerConfig(max_concurrency=args.episodes, max_turns=args.turns + 1), policy) as mgr:
        trajs = await mgr.run_episodes(specs)
    dt, cpu = time.perf_counter() - t0, time.process_time() - c0
    bad = [t.error for t in trajs if t.termination != "terminated"]
    if bad:
        raise RuntimeError(f"native episodes failed: {bad[:2]}")
    n = sum(t.num_generated for t in trajs)
    return {"tokens": n, "wall_s": dt, "tok_per_s": n / dt, "cpu_ms_per_turn": 1e3 * cpu / (args.episodes * args.turns),
            **gc_since(g0)}


def gc_since(g0: dict) -> dict[str, float]:
    return {"gc_s": GC["s"] - g0["s"], "gc_full": GC["full"] - g0["full"]}


def make_harness(args):
    shared: list[Any] = []

    async def with_openai(ctx):
        import openai

        # One HTTP connection pool for all episodes (``with_options`` shares it): building an AsyncOpenAI client
        # loads the CA bundle into an SSL context, ~0.15 s of CPU each on this machine, which is the harness's cost,
        # not the gateway's.
        if not shared:
            shared.append(openai.AsyncOpenAI(base_url=ctx.base_url, api_key=ctx.api_key, max_retries=0))
        c = shared[0].with_options(base_url=ctx.base_url, api_key=ctx.api_key)
        msgs = opening(ctx.seed)
        for _ in range(args.turns):
            r = await c.chat.completions.create(model=ctx.model, messages=msgs, max_tokens=args.tokens,
                                                extra_body={"ignore_eos": True})
            msgs += [{"role": "assistant", "content": r.choices[0].message.content},
                     {"role": "user", "content": ENV_REPLY}]
        return 0.0

    async def with_aiohttp(ctx):
        import aiohttp

        msgs = opening(ctx.seed)
        headers = {"Authorization": f"Bearer {ctx.api_key}"}
        async with aiohttp.ClientSession(headers=headers) as http:
            for _ in range(args.turns):
                body = {"model": ctx.model, "messages": msgs, "max_tokens": args.tokens, "ignore_eos": True}
                t = time.perf_counter()
                async with http.post(ctx.base_url + "/chat/completions", json=body) as resp:
                    r = await resp.json()
                    if resp.status != 200:
                        raise RuntimeError(r)
                LATENCY.append(time.perf_counter() - t)
                msgs += [{"role": "assistant", "content": r["choices"][0]["message"]["content"]},
                         {"role": "user", "content": ENV_REPLY}]
        return 0.0

    return with_openai if args.client == "openai" else with_aiohttp


async def run_gateway(engine, tok, args, tag: str) -> dict:
    from agentrl.gateway import HARNESS_ENV_ID, GatewayConfig, HarnessPolicy
    from agentrl.manager import EnvManager, EpisodeSpec, ManagerConfig

    policy = HarnessPolicy(engine, tok, make_harness(args), GatewayConfig(port=0, max_sessions=4 * args.episodes))
    specs = [EpisodeSpec(HARNESS_ENV_ID, seed=i) for i in range(args.episodes)]
    await policy.start()
    LATENCY.clear()
    try:
        t0, c0, g0 = time.perf_counter(), time.process_time(), dict(GC)
        async with EnvManager(ManagerConfig(max_concurrency=args.episodes, max_turns=args.turns + 2), policy) as mgr:
            trajs = await mgr.run_episodes(specs)
        dt, cpu = time.perf_counter() - t0, time.process_time() - c0
    finally:
        await policy.aclose()
    bad = [t.error for t in trajs if t.termination != "terminated"]
    if bad:
        raise RuntimeError(f"gateway episodes failed: {bad[:2]}")
    n = sum(t.num_generated for t in trajs)
    m = policy.metrics()
    return {"tokens": n, "wall_s": dt, "tok_per_s": n / dt, "cpu_ms_per_turn": 1e3 * cpu / (args.episodes * args.turns),
            **stalls(t0, t0 + dt), **gc_since(g0), "drift_rate": m["gateway/drift_rate"],
            "segments_per_session": m["gateway/segments_per_session"]}


async def main_async(args) -> dict:
    from agentrl.chat import load_tokenizer
    from agentrl.inference import EngineConfig, make_engine
    from agentrl.models import ensure_tiny_model

    model = args.model or str(ensure_tiny_model())
    tok = load_tokenizer(model)
    cfg = EngineConfig(model=model, max_model_len=max(1024, 96 + args.turns * (args.tokens + 48)),
                       max_num_seqs=max(args.episodes, 16))
    if args.engine == "instant":
        engine = InstantEngine(tok, cfg.max_model_len)
    else:
        engine = await asyncio.to_thread(make_engine, cfg)
    load_before = loadavg()
    gc.callbacks.append(_gc_timer)
    sentinel = asyncio.ensure_future(lag_sentinel())
    try:
        warm = argparse.Namespace(**{**vars(args), "episodes": min(args.episodes, 8), "turns": 2})
        await run_native(engine, tok, warm, "warm-n")
        await run_gateway(engine, tok, warm, "warm-g")
        runs: dict[str, list[dict[str, Any]]] = {"native": [], "gateway": []}
        for r in range(args.repeats):
            runs["native"].append(await run_native(engine, tok, args, f"n{r}"))
            runs["gateway"].append(await run_gateway(engine, tok, args, f"g{r}"))
            print(f"repeat {r}: native {runs['native'][-1]['tok_per_s']:.0f} tok/s, "
                  f"gateway {runs['gateway'][-1]['tok_per_s']:.0f} tok/s (load {loadavg()})", file=sys.stderr)
    finally:
        sentinel.cancel()
        await engine.close()
    med = {k: statistics.median(x["tok_per_s"] for x in v) for k, v in runs.items()}
    cpu = {k: statistics.median(x["cpu_ms_per_turn"] for x in v) for k, v in runs.items()}
    expected = args.episodes * args.turns * args.tokens
    total = {k: sum(x["tokens"] for x in v) / sum(x["wall_s"] for x in v) for k, v in runs.items()}
    return {"episodes": args.episodes, "turns": args.turns, "tokens_per_turn": args.tokens, "client": args.client,
            "engine": args.engine, "runs": runs, "median_tok_per_s": med, "median_cpu_ms_per_turn": cpu,
            "all_lengths_exact": all(x["tokens"] == expected for v in runs.values() for x in v),
            "ratio_gateway_over_native": med["gateway"] / med["native"],
            "ratio_total_tokens_over_total_time": total["gateway"] / total["native"],
            "loadavg_before": load_before, "loadavg_after": loadavg()}


def table(out: dict) -> str:
    rows = ["| side | median tok/s | runs (tok/s) | driver CPU ms per turn (median) | tokens per run |",
            "| --- | ---: | --- | ---: | ---: |"]
    for k in ("native", "gateway"):
        v = out["runs"][k]
        each = ", ".join(f"{x['tok_per_s']:.0f}" for x in v)
        rows.append(f"| {k} | {out['median_tok_per_s'][k]:.0f} | {each} | {out['median_cpu_ms_per_turn'][k]:.2f} | "
                    f"{v[0]['tokens']} |")
    rows.append("")
    g = out["runs"]["gateway"]
    if g and "request_max_s" in g[0]:
        rows.append("gateway runs, slowest request / event loop's worst scheduling lag (s): " + ", ".join(
            f"{x['request_max_s']:.2f} / {x['loop_lag_max_s']:.2f}" for x in g) + " (a slow request with as much lag is "
            "the machine's load, not the gateway)")
        rows.append("")
    rows.append("garbage collector, seconds (full passes) per run: " + "; ".join(
        f"{k} " + ", ".join(f"{x['gc_s']:.2f} ({x['gc_full']})" for x in out["runs"][k]) for k in ("native", "gateway")))
    rows.append("")
    rows.append(f"gateway / native: **{out['ratio_gateway_over_native']:.3f}x** (median tok/s), "
                f"{out['ratio_total_tokens_over_total_time']:.3f}x (total tokens / total time); "
                f"{out['episodes']} episodes x {out['turns']} turns x {out['tokens_per_turn']} tokens, engine "
                f"{out['engine']}, client {out['client']}; exact lengths: {out['all_lengths_exact']}; gateway drift rate "
                f"{out['runs']['gateway'][-1]['drift_rate']:.2f}; load average {out['loadavg_before']} -> "
                f"{out['loadavg_after']}")
    return "\n".join(rows)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default=None)
    p.add_argument("--episodes", type=int, default=64)
    p.add_argument("--turns", type=int, default=4)
    p.add_argument("--tokens", type=int, default=32, help="generated tokens per turn (exact, ignore_eos)")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--client", choices=("aiohttp", "openai"), default="aiohttp",
                   help="aiohttp: measures the gateway; openai: adds the openai library's own per-request cost")
    p.add_argument("--engine", choices=("vllm", "instant"), default="vllm",
                   help="instant: no model, tokens returned at once (measures each side's per-turn CPU)")
    p.add_argument("--json", default=None)
    args = p.parse_args()
    out = asyncio.run(main_async(args))
    if args.json:
        with open(args.json, "w") as f:
            f.write(json.dumps(out, indent=2) + "\n")
    print(table(out))
    return 0


if __name__ == "__main__":
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "2")
    sys.exit(main())
