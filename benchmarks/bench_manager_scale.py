"""Benchmark 1 (scale): thousands of concurrent episodes through 2 Ray env workers.

Each episode is a toy env (:class:`agentrl.testing.manager_envs.SleepEnv`) whose steps take a fixed ``asyncio.sleep``
latency; the policy answers immediately, so the ideal makespan is the env work divided by the concurrency
(``episodes · turns · latency / concurrency``). Reports throughput (env steps/s) and its fraction of the ideal,
the manager's CPU overhead per env step (driver process CPU time / steps, and the workers' CPU / steps), and memory
per env (worker RSS growth at peak / envs hosted; driver RSS growth / concurrent episodes).

    .venv/bin/python benchmarks/bench_manager_scale.py                  # 4,096 concurrent, 2 workers
    .venv/bin/python benchmarks/bench_manager_scale.py --concurrency 1024 --episodes 2048
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import resource
import time

from agentrl.manager import EnvManager, EpisodeSpec, ManagerConfig
from agentrl.testing.manager_envs import EchoPolicy


def _rss() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def _cpu() -> float:
    ru = resource.getrusage(resource.RUSAGE_SELF)
    return ru.ru_utime + ru.ru_stime


async def main(args: argparse.Namespace) -> dict:
    cfg = ManagerConfig(workers=args.workers, ray_num_cpus=2, max_concurrency=args.concurrency,
                        step_timeout_s=60, reset_timeout_s=60)
    policy = EchoPolicy(latency=args.policy_latency)
    async with EnvManager(cfg, policy) as m:
        # warm-up: import the env module in every worker, start their thread pools
        await m.run_episodes([EpisodeSpec("agentrl.testing.manager_envs:SleepEnv", {"turns": 1}) for _ in range(8)])
        base = await m.worker_stats()
        base_rss = {s["name"]: s["rss_bytes"] for s in base}
        base_cpu = {s["name"]: s["cpu_s"] for s in base}
        steps0 = m.metrics()["env_steps"]
        drv_rss0, drv_cpu0 = _rss(), _cpu()
        peak = {"workers": dict(base_rss), "driver": drv_rss0, "running": 0}

        async def sample():
            while True:
                await asyncio.sleep(0.5)
                for s in await m.worker_stats():
                    peak["workers"][s["name"]] = max(peak["workers"].get(s["name"], 0), s["rss_bytes"])
                peak["driver"] = max(peak["driver"], _rss())
                peak["running"] = max(peak["running"], m.running)

        sampler = asyncio.ensure_future(sample())
        specs = [EpisodeSpec("agentrl.testing.manager_envs:SleepEnv",
                             {"turns": args.turns, "step_latency": args.latency}, seed=i) for i in range(args.episodes)]
        t0 = time.perf_counter()
        trajs = await m.run_episodes(specs)
        wall = time.perf_counter() - t0
        sampler.cancel()
        drv_cpu = _cpu() - drv_cpu0
        end = await m.worker_stats()
        met = m.metrics()
    steps = met["env_steps"] - steps0
    ok = sum(t.termination == "terminated" for t in trajs)
    ideal = args.episodes * args.turns * (args.latency + args.policy_latency) / args.concurrency
    worker_cpu = sum(s["cpu_s"] - base_cpu.get(s["name"], 0.0) for s in end)
    envs_per_worker = args.concurrency / max(1, args.workers)
    worker_growth = [peak["workers"][n] - base_rss[n] for n in base_rss]
    res = {
        "episodes": args.episodes, "concurrency": args.concurrency, "workers": args.workers, "turns": args.turns,
        "step_latency_s": args.latency, "terminated": ok, "env_steps": steps, "max_running": met["max_running"],
        "wall_s": round(wall, 2), "ideal_s": round(ideal, 2), "fraction_of_ideal": round(ideal / wall, 3),
        "steps_per_s": round(steps / wall, 1), "ideal_steps_per_s": round(steps / ideal, 1),
        "driver_cpu_ms_per_step": round(1000 * drv_cpu / steps, 3),
        "worker_cpu_ms_per_step": round(1000 * worker_cpu / steps, 3),
        "worker_rss_kib_per_env": round(max(worker_growth) / envs_per_worker / 1024, 1),
        "driver_rss_kib_per_episode": round((peak["driver"] - drv_rss0) / args.concurrency / 1024, 1),
        "step_p50_s": round(met["step_p50_s"], 4), "step_p99_s": round(met["step_p99_s"], 4),
        # per episode: time beyond its own env work once started, and time waiting for a slot
        "episode_overhead_mean_s": round(sum(t.timings["total_s"] - t.timings["queue_s"] for t in trajs) / len(trajs)
                                         - args.turns * args.latency, 3),
        "load_average_1min": round(os.getloadavg()[0], 1),
    }
    return res


if __name__ == "__main__":
    print(f"load average before the run (2-core machine): {os.getloadavg()[0]:.1f}", flush=True)
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--concurrency", type=int, default=4096)
    ap.add_argument("--episodes", type=int, default=8192)
    ap.add_argument("--turns", type=int, default=4)
    ap.add_argument("--latency", type=float, default=2.0, help="env step latency, seconds")
    ap.add_argument("--policy-latency", type=float, default=0.0)
    ap.add_argument("--workers", type=int, default=2)
    res = asyncio.run(main(ap.parse_args()))
    print(json.dumps(res, indent=1))
    print(f"throughput {res['steps_per_s']:.0f} env steps/s = {100 * res['fraction_of_ideal']:.1f}% of ideal "
          f"(target >= 90% and >= 1000 steps/s)")
