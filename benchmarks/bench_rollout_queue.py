"""Queue scheduling against batch generation, on the real vLLM engine with the tiny model (ROLL Flash's setting).

N requests (default 256) whose max tokens follow a long-tailed distribution (lognormal, clipped to [8, 256], with
``ignore_eos`` so every request generates exactly its length), each scored by a reward function that behaves like a
remote checker or a sandbox pool: a call holds one of W slots (or none: unbounded) for L seconds (an
``asyncio.sleep``: wall-clock time, not CPU). For each reward setting in ``--rewards``, three schedules run on one
engine, in one run:

- **batch**: all N requests go to the engine at once; rewards are computed after the whole batch has finished
  (the batch waits for its slowest request, then the reward workers drain the queue).
- **queue**: every request is its own task; its reward is computed as soon as it finishes, overlapping with the
  generation of the others.
- **queue+redundant**: N * (1 + extra) requests (the N above plus extra ones from the same distribution) as in
  *queue*; the first N finished (generated and scored) are kept and the rest are aborted.

The engine itself batches continuously in every schedule: what the ratios measure is the overlap of reward work
with generation (queue) and cutting the length tail (redundant), not a difference in how vLLM batches.

Run::

    .venv/bin/python benchmarks/bench_rollout_queue.py            # builds the tiny model if missing
    .venv/bin/python benchmarks/bench_rollout_queue.py --n 64 --reward-s 0.05   # quick smoke run
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import time

import numpy as np


def lengths(rng: np.random.Generator, n: int, median: float, sigma: float, lo: int, hi: int) -> list[int]:
    """Returns ``n`` lognormal lengths with the given median, clipped to ``[lo, hi]``."""
    return [int(x) for x in np.clip(np.round(rng.lognormal(np.log(median), sigma, n)), lo, hi)]


class Reward:
    """A sandbox-like reward: ``workers`` concurrent slots (0: unbounded), each busy ``latency_s`` per call."""

    def __init__(self, workers: int, latency_s: float):
        self.sem = asyncio.Semaphore(workers) if workers > 0 else None
        self.latency_s = latency_s
        self.calls = 0

    async def __call__(self, token_ids: list[int]) -> float:
        if self.sem is not None:
            async with self.sem:
                await asyncio.sleep(self.latency_s)
        elif self.latency_s > 0:
            await asyncio.sleep(self.latency_s)
        self.calls += 1
        return float(len(token_ids) % 2)


def parse_rewards(spec: str) -> list[tuple[int, float]]:
    """``"16x0.25,0x0.5"`` -> [(16, 0.25), (0, 0.5)]: WORKERSxSECONDS per reward setting, 0 workers = unbounded."""
    out = []
    for item in spec.split(","):
        w, _, sec = item.strip().partition("x")
        out.append((int(w), float(sec)))
    return out


async def run_batch(engine, prompts, lens, params_for, reward: Reward) -> dict:
    t0 = time.perf_counter()
    finish: list[float] = []

    async def gen(i: int):
        g = await engine.generate(prompts[i], params_for(lens[i]), request_id=f"b{i}")
        finish.append(time.perf_counter() - t0)
        return g

    gens = await asyncio.gather(*(gen(i) for i in range(len(prompts))))
    t_gen = time.perf_counter() - t0
    await asyncio.gather(*(reward(g.token_ids) for g in gens))
    return {"wall_s": time.perf_counter() - t0, "generation_s": t_gen, "kept": len(gens),
            # When requests finished generating: the gap between p90 and max is the long tail the batch waits for.
            "finished_p50_s": float(np.percentile(finish, 50)), "finished_p90_s": float(np.percentile(finish, 90)),
            "tokens": sum(len(g.token_ids) for g in gens), "exact_lengths": all(len(g.token_ids) == n for g, n in zip(gens, lens))}


async def run_queue(engine, prompts, lens, params_for, reward: Reward, keep: int, tag: str) -> dict:
    t0 = time.perf_counter()
    done: list[tuple[int, float]] = []
    finished = asyncio.Event()
    tokens = 0
    exact = True

    async def one(i: int) -> None:
        nonlocal tokens, exact
        g = await engine.generate(prompts[i], params_for(lens[i]), request_id=f"{tag}{i}")
        if g.finish_reason == "abort":
            return
        await reward(g.token_ids)
        if len(done) < keep:
            done.append((i, time.perf_counter() - t0))
            tokens += len(g.token_ids)
            exact &= len(g.token_ids) == lens[i]
            if len(done) == keep:
                finished.set()

    tasks = [asyncio.create_task(one(i)) for i in range(len(prompts))]
    await finished.wait()
    wall = time.perf_counter() - t0
    kept = {i for i, _ in done}
    losers = [i for i in range(len(prompts)) if i not in kept and not tasks[i].done()]
    for i in losers:
        await engine.abort(f"{tag}{i}")
        tasks[i].cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    return {"wall_s": wall, "kept": len(kept), "cancelled": len(losers), "tokens": tokens, "exact_lengths": exact,
            "kept_mean_len": float(np.mean([lens[i] for i in kept])), "kept_max_len": max(lens[i] for i in kept)}


async def main_async(args) -> dict:
    from agentrl.inference.base import SamplingParams
    from agentrl.inference import EngineConfig, make_engine
    from agentrl.models import ensure_tiny_model
    from agentrl.chat import load_tokenizer

    model = args.model or str(ensure_tiny_model())
    tok = load_tokenizer(model)
    rng = np.random.default_rng(args.seed)
    n_extra = int(round(args.n * args.extra))
    lens_all = lengths(rng, args.n + n_extra, args.median, args.sigma, args.min_len, args.max_len)
    lens = lens_all[: args.n]
    prompts_all = [
        tok.apply_chat_template([{"role": "user", "content": f"Question {i}: what is {i} plus {i % 7}?"}],
                                add_generation_prompt=True, tokenize=False)
        for i in range(args.n + n_extra)
    ]
    prompts_all = [tok(p, add_special_tokens=False)["input_ids"] for p in prompts_all]
    prompts = prompts_all[: args.n]

    def params_for(n: int) -> SamplingParams:
        return SamplingParams(temperature=1.0, max_tokens=n, ignore_eos=True)

    cfg = EngineConfig(model=model, max_model_len=max(512, args.max_len + 64), max_num_seqs=args.max_num_seqs)
    t0 = time.perf_counter()
    engine = await asyncio.to_thread(make_engine, cfg)
    startup = time.perf_counter() - t0
    try:
        # Warm-up: compile/caches for every batch size the runs will see.
        await run_batch(engine, prompts[:64], [16] * 64, params_for, Reward(64, 0.0))
        settings = []
        names = ("batch", "queue", "queue+redundant")
        for k, (workers, latency) in enumerate(parse_rewards(args.rewards)):
            runs: dict[str, list[dict]] = {name: [] for name in names}
            for r in range(args.repeats):
                for j in range(len(names)):  # rotate the order so slow drifts of a shared machine hit all three
                    name = names[(j + r) % len(names)]
                    reward = Reward(workers, latency)
                    if name == "batch":
                        res = await run_batch(engine, prompts, lens, params_for, reward)
                    elif name == "queue":
                        res = await run_queue(engine, prompts, lens, params_for, reward, args.n, f"q{k}.{r}-")
                    else:
                        res = await run_queue(engine, prompts_all, lens_all, params_for, reward, args.n, f"r{k}.{r}-")
                    runs[name].append(res)
            med = {name: float(np.median([x["wall_s"] for x in runs[name]])) for name in names}
            settings.append({
                "reward_workers": workers or "unbounded", "reward_latency_s": latency,
                "reward_work_s": (args.n * latency / workers) if workers else latency,
                "median_wall_s": med, "runs": runs,
                "speedup_queue": med["batch"] / med["queue"],
                "speedup_queue_redundant": med["batch"] / med["queue+redundant"],
            })
            print(f"reward {workers or 'unbounded'} x {latency}s (median of {args.repeats}): batch {med['batch']:.2f}s | "
                  f"queue {med['queue']:.2f}s ({settings[-1]['speedup_queue']:.2f}x) | queue+redundant "
                  f"{med['queue+redundant']:.2f}s ({settings[-1]['speedup_queue_redundant']:.2f}x)", file=sys.stderr)
    finally:
        await engine.close()
    return {
        "n": args.n, "extra": n_extra, "lengths": {"mean": float(np.mean(lens)), "p50": float(np.median(lens)),
                                                  "p90": float(np.percentile(lens, 90)), "max": max(lens)},
        "engine_startup_s": startup, "load_avg_1m_at_end": os.getloadavg()[0],
        "settings": settings,
    }


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default=None, help="model directory (default: the tiny model, built if missing)")
    p.add_argument("--n", type=int, default=256)
    p.add_argument("--extra", type=float, default=0.25, help="over-provisioned fraction for queue+redundant")
    p.add_argument("--median", type=float, default=32.0)
    p.add_argument("--sigma", type=float, default=1.0)
    p.add_argument("--min-len", type=int, default=8)
    p.add_argument("--max-len", type=int, default=256)
    p.add_argument("--rewards", default="0x0,0x0.5,16x0.25",
                   help="reward settings WORKERSxSECONDS, comma-separated (0 workers = unbounded concurrency)")
    p.add_argument("--max-num-seqs", type=int, default=320)
    p.add_argument("--repeats", type=int, default=3, help="runs of each schedule per reward setting (median)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", default=None, help="also write the summary here")
    args = p.parse_args()
    summary = asyncio.run(main_async(args))
    text = json.dumps(summary, indent=2)
    print(text)
    if args.json:
        with open(args.json, "w") as f:
            f.write(text + "\n")
    return 0


if __name__ == "__main__":
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "2")
    sys.exit(main())
