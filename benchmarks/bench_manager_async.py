"""Benchmark 2: env-level async (EnvManager) against lock-step (gymnasium AsyncVectorEnv) and a batch-synchronous loop.

The same episodes, in one run: ``episodes`` multi-turn episodes of ``turns`` steps whose step latencies are drawn
once from N(μ, σ) clipped at ``--min-latency`` (ROLL Flash's μ = 10 s, σ ∈ {1, 5, 10} scaled down 100×:
μ = 0.1 s, σ ∈ {0.01, 0.05, 0.1}), run with ``slots`` envs at a time by

- lock-step: a real ``gymnasium.vector.AsyncVectorEnv`` with ``slots`` subprocess envs (``time.sleep`` in ``step``);
  env i plays episodes i, i+slots, ...; every vector step waits for its slowest env;
- batch-synchronous: EnvManager.run_episodes on one batch of ``slots`` episodes at a time (no per-step barrier, but
  each batch waits for its slowest episode);
- env-level async: EnvManager.run_episodes on all episodes with ``max_concurrency = slots`` (an episode starts the
  moment a slot frees; each env steps the moment its action arrives), envs in ``--workers`` Ray env workers.

The ideal makespan bound is ``max(total step time / slots, longest episode)``: no schedule with ``slots`` envs can
beat it. Also reported: ``greedy_s``, the makespan of a zero-overhead simulation of the same first-come slot
assignment (what env-level async would take with free stepping). Reports wall-clock ratios lock-step / async and
batch / async, and async / ideal.

    .venv/bin/python benchmarks/bench_manager_async.py
"""

from __future__ import annotations

import argparse
import asyncio
import heapq
import json
import os
import time

import gymnasium
import numpy as np
from gymnasium import spaces


class LockstepSleepEnv(gymnasium.Env):
    """Plays a fixed schedule of episodes: ``schedule[k][t]`` is the latency of step t of this env's k-th episode."""

    observation_space = spaces.Box(0.0, 1.0, (1,), np.float32)
    action_space = spaces.Discrete(2)

    def __init__(self) -> None:
        self.schedule: list[list[float]] = []
        self.k, self.t = -1, 0

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.k, self.t = self.k + 1, 0
        return np.zeros(1, np.float32), {}

    def step(self, action):
        time.sleep(self.schedule[self.k][self.t])
        self.t += 1
        return np.zeros(1, np.float32), 1.0, self.t >= len(self.schedule[self.k]), False, {}


def latencies(episodes: int, turns: int, mu: float, sigma: float, lo: float, seed: int) -> np.ndarray:
    """Returns the step latencies, shape (episodes, turns), from N(mu, sigma) clipped at lo."""
    rng = np.random.default_rng(seed)
    return np.maximum(rng.normal(mu, sigma, size=(episodes, turns)), lo)


def run_lockstep(venv: gymnasium.vector.AsyncVectorEnv, lat: np.ndarray, slots: int) -> float:
    episodes, turns = lat.shape
    venv.set_attr("schedule", [lat[i::slots].tolist() for i in range(slots)])
    venv.set_attr("k", [-1] * slots)
    t0 = time.perf_counter()
    for _ in range(episodes // slots):
        venv.reset()
        for _ in range(turns):
            venv.step(np.zeros(slots, dtype=np.int64))
    return time.perf_counter() - t0


async def run_manager(lat: np.ndarray, slots: int, workers: int, batch_sync: bool, rpc_window: float) -> float:
    from agentrl.manager import EnvManager, EpisodeSpec, ManagerConfig
    from agentrl.testing.manager_envs import EchoPolicy

    specs = [EpisodeSpec("agentrl.testing.manager_envs:SleepEnv", {"turns": lat.shape[1], "step_latency": row.tolist(),
                                                              "min_latency": 0.0}, seed=i)
             for i, row in enumerate(lat)]
    cfg = ManagerConfig(workers=workers, max_concurrency=slots, step_timeout_s=60, rpc_batch_window_s=rpc_window)
    async with EnvManager(cfg, EchoPolicy()) as m:
        await m.run_episodes(specs[:slots])  # warm-up (workers import the env module)
        t0 = time.perf_counter()
        if batch_sync:
            trajs = []
            for b in range(0, len(specs), slots):
                trajs += await m.run_episodes(specs[b:b + slots])
        else:
            trajs = await m.run_episodes(specs)
        wall = time.perf_counter() - t0
    assert all(t.termination == "terminated" for t in trajs), "an episode did not terminate"
    return wall


def main(args: argparse.Namespace) -> list[dict]:
    import ray
    from agentrl import raystart

    assert args.episodes % args.slots == 0, "episodes must be a multiple of slots"
    venv = gymnasium.vector.AsyncVectorEnv([LockstepSleepEnv] * args.slots, context="spawn")
    if args.workers:
        raystart.init(num_cpus=2)
    rows = []
    try:
        for sigma in args.sigmas:
            lat = latencies(args.episodes, args.turns, args.mu, sigma, args.min_latency, args.seed)
            ideal = max(lat.sum() / args.slots, lat.sum(axis=1).max())
            slots_free = [0.0] * args.slots
            for d in lat.sum(axis=1):  # first-come assignment of episodes to the slot that frees first
                heapq.heappush(slots_free, heapq.heappop(slots_free) + d)
            greedy = max(slots_free)
            lock = run_lockstep(venv, lat, args.slots)
            batch = asyncio.run(run_manager(lat, args.slots, args.workers, True, args.rpc_window))
            asyn = asyncio.run(run_manager(lat, args.slots, args.workers, False, args.rpc_window))
            row = {"sigma_s": sigma, "sigma_rollflash_s": round(sigma * 100, 1), "ideal_s": round(ideal, 2), "greedy_s": round(greedy, 2),
                   "lockstep_s": round(lock, 2), "batch_sync_s": round(batch, 2), "env_async_s": round(asyn, 2),
                   "lockstep_over_async": round(lock / asyn, 2), "batch_over_async": round(batch / asyn, 2),
                   "async_over_ideal": round(asyn / ideal, 3)}
            rows.append(row)
            print(json.dumps(row), flush=True)
    finally:
        venv.close()
        if args.workers:
            ray.shutdown()
    return rows


if __name__ == "__main__":
    print(f"load average before the run (2-core machine): {os.getloadavg()[0]:.1f}", flush=True)
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--slots", type=int, default=32, help="envs running at a time (vector size / max_concurrency)")
    ap.add_argument("--episodes", type=int, default=512)
    ap.add_argument("--turns", type=int, default=5)
    ap.add_argument("--mu", type=float, default=0.1)
    ap.add_argument("--sigmas", type=float, nargs="+", default=[0.01, 0.05, 0.1])
    ap.add_argument("--min-latency", type=float, default=0.005)
    ap.add_argument("--workers", type=int, default=2, help="Ray env workers for EnvManager (0: in-process)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--rpc-window", type=float, default=0.0, help="ManagerConfig.rpc_batch_window_s")
    rows = main(ap.parse_args())
    print("\n| σ (ROLL Flash scale) | lock-step s | batch-sync s | env-async s | ideal s | lock-step/async | "
          "batch/async | async/ideal |")
    print("|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['sigma_s']} ({r['sigma_rollflash_s']}) | {r['lockstep_s']} | {r['batch_sync_s']} | "
              f"{r['env_async_s']} | {r['ideal_s']} | {r['lockstep_over_async']}× | {r['batch_over_async']}× | "
              f"{r['async_over_ideal']} |")
