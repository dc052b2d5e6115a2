"""The controller's schedulers against each other, in one run: plain synchronous training, sync + tail batching
(RollPacker), sync + streamed trainer steps (AsyncFlow), both, and asynchronous training at α = 2.

Setup (the same for every variant): the real CPU vLLM engine with the quickstart's warm-started tiny model, 3x3
FrozenLake whose every step waits a lognormal latency (median ``--latency`` s, sigma 1, capped at 20x: a stand-in
for a tool call), 8 groups of 8 per step, up to ``--max-turns`` turns of at most 8 tokens. Where the long tail comes
from: the policy itself. Most episodes end in 2-4 turns (goal or hole); some wander (bumping into walls, walking
back and forth) until ``--max-turns``, so an episode's generated tokens and its env time (turns x latency) have a
long tail; the table reports the generated-token percentiles the plain run trained. No length is injected.

For each variant the same number of steps runs from the same model; the table gives the mean seconds per trained
batch, the ratio to plain sync, the trainer's and the engine's idle fractions, tail batching's rounds, the maximum
staleness trained, and the held-out reward (``--eval`` seeds) before and after.

    .venv/bin/python benchmarks/bench_schedulers.py                      # all five variants, ~15-30 min on 2 cores
    .venv/bin/python benchmarks/bench_schedulers.py --variants sync tail --steps 6

Needs a warm-started model (``--model``, default that of ``agentrl train configs/quickstart.yaml``).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import statistics
import sys
import time
from pathlib import Path

import numpy as np

from agentrl.envs.frozenlake import FrozenLakeEnv

ROOT = Path(__file__).resolve().parents[1]
ENV_ID = "bench/LatencyFrozenLake-v0"

VARIANTS = {
    "sync": ["async_ratio=0"],
    "tail": ["async_ratio=0", "tail_batching.enabled=true"],
    "stream": ["async_ratio=0", "streaming=true"],
    "tail+stream": ["async_ratio=0", "tail_batching.enabled=true", "streaming=true"],
    "alpha2": ["async_ratio=2"],
    "alpha2+stream": ["async_ratio=2", "streaming=true"],  # not in the default list
}
DEFAULT = ["sync", "tail", "stream", "tail+stream", "alpha2"]


class LatencyFrozenLake(FrozenLakeEnv):
    """FrozenLake whose every step waits a lognormal latency (median ``latency_s``, sigma 1, at most 20x)."""

    def __init__(self, latency_s: float = 0.1, **kw):
        super().__init__(**kw)
        self.latency_s = latency_s
        self._lat_rng = np.random.default_rng()

    async def astep(self, action: str):
        await asyncio.sleep(float(min(self.latency_s * math.exp(self._lat_rng.normal()), 20 * self.latency_s)))
        return self.step(action)


def _generated(run_dir: Path) -> list[int]:
    """Generated tokens of every trained trajectory in the run's trajectory log."""
    out = []
    p = run_dir / "trajectories.jsonl"
    if p.exists():
        for line in p.read_text().splitlines():
            out.append(int(json.loads(line)["summary"]["generated"]))
    return out


def run_one(args: argparse.Namespace, name: str, overrides: list[str]) -> dict:
    import agentrl
    from agentrl.controller.run import load_config, train

    if ENV_ID not in agentrl.registered_ids():
        agentrl.register(ENV_ID, entry_point=LatencyFrozenLake, max_episode_steps=args.max_turns)
    run_dir = Path(args.out) / name
    if run_dir.exists():
        import shutil

        shutil.rmtree(run_dir)
    cfg = load_config(ROOT / "configs" / "quickstart.yaml", [
        f"env.id={ENV_ID}", f"env.kwargs.latency_s={args.latency}", f"run_dir={run_dir}", f"steps={args.steps}",
        f"engine.model={args.model}", "warm_start.episodes=0", f"eval.episodes={args.eval}",
        f"checkpoint_every={args.steps}", "progress=false", "tensorboard=false", "trajectory_log.per_step=null",
        f"rollout.max_turns={args.max_turns}", f"manager.max_turns={args.max_turns}", "trainer.record_logprobs=0",
        f"tail_batching.length_budget={args.budget}", f"tail_batching.extra_prompts={args.extra}", f"seed={args.seed}",
        *overrides])
    load0 = os.getloadavg()[0]
    t0 = time.perf_counter()
    summary = asyncio.run(train(cfg))
    wall = time.perf_counter() - t0
    rows = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    gen = sorted(_generated(run_dir))

    def mean(k: str) -> float:
        return statistics.fmean(r.get(k, 0.0) for r in rows)

    return {"name": name, "overrides": overrides, "wall_s": wall, "mean_step_s": mean("time/step_s"),
            "step_s": [r["time/step_s"] for r in rows], "trainer_idle": mean("time/trainer_idle_frac"),
            "rollout_idle": mean("time/rollout_idle_frac"), "wait_rollout_s": mean("time/wait_rollout_s"),
            "train_s": mean("time/train_s"),
            "long_rounds": rows[-1].get("tail/long_rounds"), "short_rounds": rows[-1].get("tail/short_rounds"),
            "deferred_total": rows[-1].get("tail/deferred_total"),
            "staleness_max": max(r.get("train/staleness/max", 0.0) for r in rows),
            "rewards": [r["reward"] for r in rows],
            "gen_p50": gen[len(gen) // 2] if gen else None, "gen_p90": gen[int(len(gen) * 0.9)] if gen else None,
            "gen_max": gen[-1] if gen else None,
            "eval_before": summary.get("eval_before", {}).get("reward"),
            "eval_after": summary.get("eval_after", {}).get("reward"),
            "load_start": load0, "load_end": os.getloadavg()[0]}


def _reward(x: float | None) -> str:
    return "-" if x is None else f"{x:.3f}"  # None: no held-out evaluation (--eval 0)


def table(results: list[dict]) -> str:
    base = next((r for r in results if r["name"] == "sync"), None)
    lines = ["| variant | mean s / trained batch | vs sync | trainer idle | engine idle | short / long rounds "
             "(deferred) | max staleness | trained gen. tokens p50 / p90 / max | held-out reward before → after | "
             "load start / end |",
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for r in results:
        sp = f"{base['mean_step_s'] / r['mean_step_s']:.2f}×" if base else "-"
        rounds = (f"{r['short_rounds']:.0f} / {r['long_rounds']:.0f} ({r['deferred_total']:.0f})"
                  if r["long_rounds"] is not None else "-")
        lines.append(f"| {r['name']} | {r['mean_step_s']:.2f} | {sp} | {r['trainer_idle']:.2f} | "
                     f"{r['rollout_idle']:.2f} | {rounds} | {r['staleness_max']:.0f} | "
                     f"{r['gen_p50']} / {r['gen_p90']} / {r['gen_max']} | "
                     f"{_reward(r['eval_before'])} → {_reward(r['eval_after'])} | "
                     f"{r['load_start']:.1f} / {r['load_end']:.1f} |")
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="runs/quickstart/warmstart/model")
    ap.add_argument("--variants", nargs="*", default=DEFAULT, choices=list(VARIANTS))
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--latency", type=float, default=0.1, help="median env step latency, seconds")
    ap.add_argument("--max-turns", type=int, default=16)
    ap.add_argument("--budget", type=int, default=48, help="tail batching's length budget, generated tokens")
    ap.add_argument("--extra", type=int, default=4, help="tail batching's extra prompts per short round")
    ap.add_argument("--eval", type=int, default=64, help="held-out episodes before and after")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default="/tmp/agentrl-bench-schedulers")
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    if not Path(args.model).is_dir():
        print(f"no model at {args.model}: run `agentrl train configs/quickstart.yaml` first", file=sys.stderr)
        return 2
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
    print(f"load average at start: {open('/proc/loadavg').read().strip()}", flush=True)
    results = []
    for name in args.variants:
        results.append(run_one(args, name, VARIANTS[name]))
        print(json.dumps(results[-1]), flush=True)
        if args.json:
            Path(args.json).write_text(json.dumps(results, indent=2))
    print(f"load average at end: {open('/proc/loadavg').read().strip()}", flush=True)
    print()
    print(table(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
