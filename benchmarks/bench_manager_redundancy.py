"""Benchmark 3: redundant environments under fail-slow (ROLL Flash), groups × group size 32×8 against 36×9 and 36×12.

Every episode is a :class:`agentrl.testing.manager_envs.SleepEnv` of ``turns`` steps with latency N(μ, σ) (μ = 0.1 s:
ROLL Flash's 10 s scaled down 100×). Fail-slow: with probability ``--slow`` an env runs ``--slow-factor`` × slower,
and with probability ``--hang`` it hangs (its step never returns; the step timeout turns it into an error and the
group gets a replacement). ``collect_groups`` needs 32 groups of 8 finished episodes:

- 32×8: no redundancy; a batch waits for its slowest member (or a timeout and a rerun);
- 36×9 and 36×12: ``extra_groups = 4`` and ``extra_per_group = 1`` / ``4``: the first 8 finished episodes of a group
  and the first 32 finished groups win; every loser is cancelled (env closed in its worker).

After each batch the benchmark checks that nothing is left running: no live episode, no env held by a worker, and
``cancelled + surplus == started − winners − failed``. Envs live in ``--workers`` Ray env workers.

    .venv/bin/python benchmarks/bench_manager_redundancy.py
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import time

from agentrl.manager import EnvManager, EpisodeSpec, ManagerConfig
from agentrl.testing.manager_envs import EchoPolicy


async def run_batch(args: argparse.Namespace, groups: int, size: int, seed: int) -> dict:
    cfg = ManagerConfig(workers=args.workers, ray_num_cpus=2, max_concurrency=4096, num_groups=32, group_size=8,
                        extra_groups=groups - 32, extra_per_group=size - 8, step_timeout_s=args.step_timeout,
                        max_failures_per_group=100)
    kw = {"turns": args.turns, "step_latency": args.mu, "latency_sigma": args.sigma, "slow_prob": args.slow,
          "slow_factor": args.slow_factor, "hang_prob": args.hang}
    specs = (EpisodeSpec("agentrl.testing.manager_envs:SleepEnv", kw, seed=seed * 1000 + i, task=i) for i in range(10**6))
    async with EnvManager(cfg, EchoPolicy()) as m:
        await m.run_episodes([EpisodeSpec("agentrl.testing.manager_envs:SleepEnv", {"turns": 1})] * 8)  # warm-up
        before = m.metrics()
        t0 = time.perf_counter()
        out = await m.collect_groups(specs)
        wall = time.perf_counter() - t0
        met = m.metrics()
        stats = await m.worker_stats()
    d = {k: met[k] - before[k] for k in ("started", "finished", "cancelled", "failed", "surplus")}
    winners = sum(len(g.trajectories) for g in out)
    assert len(out) == 32 and winners == 256, (len(out), winners)
    assert all(t.termination in ("terminated", "truncated") for g in out for t in g.trajectories)
    all_cancelled = (met["running"] == 0 and all(s["live"] == 0 and s["inflight"] == 0 for s in stats)
                     and d["cancelled"] + d["surplus"] == d["started"] - winners - d["failed"])
    return {"config": f"{groups}x{size}", "wall_s": round(wall, 3), "started": d["started"],
            "cancelled": d["cancelled"], "surplus": d["surplus"], "failed": d["failed"],
            "every_loser_cancelled": all_cancelled}


async def main(args: argparse.Namespace) -> dict:
    import ray
    from agentrl import raystart

    if args.workers:
        raystart.init(num_cpus=2)
    res: dict[str, list[dict]] = {}
    try:
        for rep in range(args.repeats):
            for groups, size in ((32, 8), (36, 9), (36, 12)):
                r = await run_batch(args, groups, size, rep)
                res.setdefault(r["config"], []).append(r)
                print(json.dumps(r), flush=True)
    finally:
        if args.workers:
            ray.shutdown()
    return res


if __name__ == "__main__":
    print(f"load average before the run (2-core machine): {os.getloadavg()[0]:.1f}", flush=True)
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--turns", type=int, default=5)
    ap.add_argument("--mu", type=float, default=0.1)
    ap.add_argument("--sigma", type=float, default=0.02)
    ap.add_argument("--slow", type=float, default=0.025, help="probability that an env is slow")
    ap.add_argument("--slow-factor", type=float, default=10.0)
    ap.add_argument("--hang", type=float, default=0.025, help="probability that an env hangs")
    ap.add_argument("--step-timeout", type=float, default=2.0)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=3)
    res = asyncio.run(main(ap.parse_args()))
    base = statistics.mean(r["wall_s"] for r in res["32x8"])
    print("\n| config | mean wall s | speed-up vs 32x8 | every loser cancelled |")
    print("|---|---|---|---|")
    for cfg, rows in res.items():
        w = statistics.mean(r["wall_s"] for r in rows)
        print(f"| {cfg} | {w:.2f} | {base / w:.2f}× | {all(r['every_loser_cancelled'] for r in rows)} |")
