"""Fault injection through the env manager: every episode gets exactly one result, faults come back as errors,
dead and stuck workers are replaced, and the driver process still exits.

    .venv/bin/python benchmarks/bench_env_faults.py [--local 200] [--ray 200] [--seed 0]

The run happens in a child process (the driver), in two phases:

- local (``workers: 0``, envs in the driver): sync envs (``SyncSleepEnv``), sync envs that hang forever in
  ``step`` (``SyncHangEnv``: their threads are abandoned; more of them than the ``--sync-threads`` 8 pool threads),
  async envs that raise, return garbage or hang.
- Ray (``workers: 2``): async envs with the same faults; one env blocks its worker's event loop forever
  (``StuckLoopEnv``: found by the heartbeat, the worker is killed and replaced), and the other worker is SIGKILLed
  once 100 steps ran (replaced). Their episodes are rescheduled.

``max_failures_per_group: 0``: an injected fault is the episode's result (``failed``); a worker's death is not a
fault (its episodes are rescheduled). Expected: completed = the fault-free episodes, failed = the faulty ones,
lost = 0 (episodes without a result), duplicated = 0 (results for one episode beyond the first); the driver exits
with code 0 within seconds of its last result although hung sync calls still block threads. Prints a markdown table.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import json
import os
import random
import subprocess
import sys
import tempfile
import time

SLEEP = "agentrl.testing.manager_envs:SleepEnv"
SYNC = "agentrl.testing.manager_envs:SyncSleepEnv"
HANG = "agentrl.testing.faulty_envs:SyncHangEnv"
STUCK = "agentrl.testing.faulty_envs:StuckLoopEnv"


def local_specs(n: int, rng: random.Random):
    from agentrl.manager import EpisodeSpec

    kinds = [("sync", 0.45), ("async", 0.15), ("sync_hang", 0.1), ("raise", 0.1), ("garbage", 0.1), ("hang", 0.1)]
    out = []
    for i in range(n):
        kind = rng.choices([k for k, _ in kinds], [w for _, w in kinds])[0]
        if kind == "sync":
            spec = EpisodeSpec(SYNC, {"turns": 3, "step_latency": 0.02}, seed=i, task=i)
        elif kind == "sync_hang":
            spec = EpisodeSpec(HANG, {"hang_at": 1}, seed=i, task=i)
        elif kind == "async":
            spec = EpisodeSpec(SLEEP, {"turns": 3, "step_latency": 0.02}, seed=i, task=i)
        else:
            spec = EpisodeSpec(SLEEP, {"turns": 3, "step_latency": 0.02, "fault": kind, "fault_at": 1}, seed=i, task=i)
        out.append((kind, spec))
    return out


def ray_specs(n: int, rng: random.Random, once_file: str):
    from agentrl.manager import EpisodeSpec

    kinds = [("async", 0.6), ("raise", 0.1), ("garbage", 0.1), ("hang", 0.1), ("bad_reward", 0.1)]
    out = []
    for i in range(n):
        kind = rng.choices([k for k, _ in kinds], [w for _, w in kinds])[0]
        if i == n // 4:  # this one blocks its worker's event loop (once per run)
            kind, spec = "stuck", EpisodeSpec(STUCK, {"turns": 4, "once_file": once_file}, seed=i, task=i)
        elif kind == "async":
            spec = EpisodeSpec(SLEEP, {"turns": 4, "step_latency": 0.05, "latency_sigma": 0.02}, seed=i, task=i)
        else:
            spec = EpisodeSpec(SLEEP, {"turns": 4, "step_latency": 0.05, "fault": kind, "fault_at": 2}, seed=i,
                               task=i)
        out.append((kind, spec))
    return out


FAULTY = {"sync_hang", "raise", "garbage", "hang", "bad_reward"}


async def run_phase(name: str, specs, cfg, kill_after_steps: int | None = None) -> dict:
    from agentrl.manager import EnvManager
    from agentrl.testing.manager_envs import EchoPolicy

    t0 = time.monotonic()
    results: dict[int, list] = collections.defaultdict(list)
    async with EnvManager(cfg, EchoPolicy()) as m:
        killer = None
        if kill_after_steps is not None:
            async def kill_one():
                while m.metrics()["env_steps"] < kill_after_steps:
                    await asyncio.sleep(0.02)
                victim = m.workers[-1]
                os.kill(await victim.actor.__ray_call__.remote(lambda _self: os.getpid()), 9)

            killer = asyncio.ensure_future(kill_one())
        async for i, traj in m.stream_episodes([s for _, s in specs]):
            results[i].append(traj)
        if killer is not None:
            killer.cancel()
        met = m.metrics()
    wall = time.monotonic() - t0
    completed = failed = wrong = 0
    for i, (kind, _) in enumerate(specs):
        for t in results.get(i, [])[:1]:
            ok = t.termination in ("terminated", "truncated")
            completed += ok
            failed += not ok
            wrong += ok == (kind in FAULTY)  # a faulty episode that completed, or a clean one that failed
    return {
        "phase": name,
        "episodes": len(specs),
        "faulty": sum(k in FAULTY for k, _ in specs),
        "completed": completed,
        "failed": failed,
        "unexpected": wrong,
        "lost": sum(1 for i in range(len(specs)) if not results.get(i)),
        "duplicated": sum(max(0, len(v) - 1) for v in results.values()),
        "rescheduled": met["rescheduled"],
        "worker_deaths": met["worker_deaths"],
        "wall_s": round(wall, 1),
    }


async def driver(args) -> None:
    from agentrl import core
    from agentrl.manager import ManagerConfig
    from agentrl.manager.workers import RayWorker

    rng = random.Random(args.seed)
    RayWorker.heartbeat_interval_s = 1.0
    RayWorker.heartbeat_timeout_s = args.heartbeat_timeout
    phases = []
    if args.local:
        core.set_sync_env_threads(args.sync_threads)  # fewer threads than hung calls: the pool must recover
        cfg = ManagerConfig(workers=0, max_concurrency=64, step_timeout_s=1.0, reset_timeout_s=5.0,
                            max_failures_per_group=0)
        phases.append(await run_phase("local (envs in the driver)", local_specs(args.local, rng), cfg))
    if args.ray:
        import ray
        from agentrl import raystart

        raystart.init(num_cpus=2)
        once = os.path.join(tempfile.mkdtemp(prefix="agentrl-faults-"), "stuck-once")
        cfg = ManagerConfig(workers=2, max_concurrency=64, step_timeout_s=2.0, reset_timeout_s=30.0,
                            max_failures_per_group=0)
        phases.append(await run_phase("Ray, 2 workers (1 stuck, 1 SIGKILLed)", ray_specs(args.ray, rng, once), cfg,
                                      kill_after_steps=100))
        ray.shutdown()
    stats = getattr(core, "sync_pool_stats", None)  # None on trees before the daemon sync pool (for A/B runs)
    print("RESULT " + json.dumps({"phases": phases, "hung_sync_calls": stats()["hung"] if stats else None}),
          flush=True)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--local", type=int, default=200)
    ap.add_argument("--ray", type=int, default=200)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--heartbeat-timeout", type=float, default=5.0)
    ap.add_argument("--sync-threads", type=int, default=8, help="sync env threads of the local phase")
    ap.add_argument("--driver", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.driver:
        asyncio.run(driver(args))
        return
    load0 = open("/proc/loadavg").read().split()[:3]
    cmd = [sys.executable, __file__, "--driver", "--local", str(args.local), "--ray", str(args.ray), "--seed",
           str(args.seed), "--heartbeat-timeout", str(args.heartbeat_timeout), "--sync-threads", str(args.sync_threads)]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True)
    result = None
    for line in proc.stdout:
        if line.startswith("RESULT "):
            result = json.loads(line[7:])
            t_result = time.monotonic()
            break
    try:
        rc = proc.wait(timeout=120)
        exit_s = round(time.monotonic() - t_result, 2) if result else None
    except subprocess.TimeoutExpired:
        proc.kill()
        rc, exit_s = "did not exit within 120 s (killed)", None
    load1 = open("/proc/loadavg").read().split()[:3]
    if result is None:
        raise SystemExit(f"the driver produced no result (exit {rc})")
    print("| phase | episodes | faulty | completed | failed | unexpected | lost | duplicated | rescheduled | "
          "worker deaths | wall |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for p in result["phases"]:
        print(f"| {p['phase']} | {p['episodes']} | {p['faulty']} | {p['completed']} | {p['failed']} | "
              f"{p['unexpected']} | {p['lost']} | {p['duplicated']} | {p['rescheduled']} | {p['worker_deaths']} | "
              f"{p['wall_s']} s |")
    print(f"\ndriver process: exit code {rc}, exited {exit_s} s after its last result, with "
          f"{result['hung_sync_calls']} sync env calls still hung in its threads")
    print(f"load average (1/5/15 min): {' '.join(load0)} before, {' '.join(load1)} after")


if __name__ == "__main__":
    main()
