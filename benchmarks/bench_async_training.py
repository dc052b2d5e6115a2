"""Asynchronous against synchronous training on one config whose env steps have latency, in one run.

The env is the quickstart's 3x3 FrozenLake with an async step latency drawn from a long-tailed lognormal (a stand-in
for a tool call or a sandboxed command). For each async ratio α the same training runs from the same warm-started
model; the script reports wall-clock per training step, the step at which the batch reward first reaches a
threshold, and the held-out reward at the end. With ``--compare-losses`` it also trains at α = 4 with decoupled PPO
and with plain PPO-clip on the behavior log-probs, and reports both reward curves.

    .venv/bin/python benchmarks/bench_async_training.py --steps 12 --alphas 0 1 2 4
    .venv/bin/python benchmarks/bench_async_training.py --steps 30 --alphas --compare-losses

Needs the warm-started model of a quickstart run (``--model runs/quickstart/warmstart/model``), so that every run
starts from a policy that can act.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import sys
import time
from pathlib import Path

import numpy as np

from agentrl.envs.frozenlake import FrozenLakeEnv

ROOT = Path(__file__).resolve().parents[1]


class SlowFrozenLake(FrozenLakeEnv):
    """FrozenLake whose every step waits a lognormal latency (median ``latency_s``, sigma 1) before answering."""

    def __init__(self, latency_s: float = 0.2, **kw):
        super().__init__(**kw)
        self.latency_s = latency_s
        self._lat_rng = np.random.default_rng()

    async def astep(self, action: str):
        await asyncio.sleep(float(min(self.latency_s * math.exp(self._lat_rng.normal()), 20 * self.latency_s)))
        return self.step(action)


def run_one(args, name: str, overrides: list[str]) -> dict:
    import agentrl
    from agentrl.controller.run import load_config, train

    if "bench/SlowFrozenLake-v0" not in agentrl.registered_ids():
        agentrl.register("bench/SlowFrozenLake-v0", entry_point=SlowFrozenLake, max_episode_steps=20)
    run_dir = Path(args.out) / name
    if run_dir.exists():
        import shutil

        shutil.rmtree(run_dir)
    cfg = load_config(ROOT / "configs" / "quickstart.yaml", [
        "env.id=bench/SlowFrozenLake-v0", f"env.kwargs.latency_s={args.latency}", f"run_dir={run_dir}",
        f"steps={args.steps}", f"engine.model={args.model}", "warm_start.episodes=0", f"eval.episodes={args.eval}",
        f"checkpoint_every={args.steps}", "progress=false", "tensorboard=false", *overrides])
    t0 = time.perf_counter()
    summary = asyncio.run(train(cfg))
    wall = time.perf_counter() - t0
    rows = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    step_s = [r["time/step_s"] for r in rows]
    rewards = [r["reward"] for r in rows]
    reach = next((r["step"] for r in rows if r["reward"] >= args.threshold), None)
    t_reach = None
    if reach is not None:
        t_reach = sum(s for r, s in zip(rows, step_s) if r["step"] <= reach)
    return {"name": name, "wall_s": wall, "train_s": sum(step_s), "mean_step_s": sum(step_s) / len(step_s),
            "rewards": rewards, "threshold_step": reach, "time_to_threshold_s": t_reach,
            "staleness_max": max(r.get("train/staleness/max", 0) for r in rows),
            "eval_before": summary.get("eval_before", {}).get("reward"),
            "eval_after": summary.get("eval_after", {}).get("reward")}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="runs/quickstart/warmstart/model")
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--alphas", type=int, nargs="*", default=[0, 1, 2, 4])
    ap.add_argument("--compare-losses", action="store_true")
    ap.add_argument("--latency", type=float, default=0.2, help="median env step latency, seconds")
    ap.add_argument("--threshold", type=float, default=0.6, help="batch reward that counts as reached")
    ap.add_argument("--eval", type=int, default=64, help="held-out episodes before and after")
    ap.add_argument("--out", default="/tmp/agentrl-bench-async")
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    if not Path(args.model).is_dir():
        print(f"no model at {args.model}: run `agentrl train configs/quickstart.yaml` first", file=sys.stderr)
        return 2
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
    print(f"load average at start: {os.getloadavg()[0]:.1f}", flush=True)
    results = []
    for a in args.alphas:
        results.append(run_one(args, f"alpha{a}", [f"async_ratio={a}"]))
        print(json.dumps(results[-1]), flush=True)
    if args.compare_losses:
        for loss in ("decoupled_ppo", "ppo"):
            extra = [f"async_ratio=4", f"trainer.loss.name={loss}"]
            if loss == "ppo":
                extra.append("trainer.loss.ratio_base=behavior")
            results.append(run_one(args, f"alpha4-{loss}", extra))
            print(json.dumps(results[-1]), flush=True)
    base = next((r for r in results if r["name"] == "alpha0"), None)
    print("\n| run | mean s/step | speed-up vs α=0 | step reaching reward ≥ %.2f | time to it s | max staleness | held-out before → after |" % args.threshold)
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for r in results:
        sp = f"{base['mean_step_s'] / r['mean_step_s']:.2f}×" if base else "-"
        print(f"| {r['name']} | {r['mean_step_s']:.2f} | {sp} | {r['threshold_step']} | "
              f"{r['time_to_threshold_s'] and round(r['time_to_threshold_s'], 1)} | {r['staleness_max']:.0f} | "
              f"{r['eval_before']:.3f} → {r['eval_after']:.3f} |")
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
