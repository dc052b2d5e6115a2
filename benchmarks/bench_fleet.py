"""Fleet benchmark: N sandboxes alive at once, each running an episode of K real commands, through one SandboxPool.

    PYTHONPATH=. .venv/bin/python benchmarks/bench_fleet.py --backend bwrap --count 8 [--steps 5] [--warm 8]
        [--kill-frac 0.05] [--snapshot-iters 5] [--create-rate 100] [--memory-mb 64 --pids 32 --overcommit 4]

Flow: a pool with ``max_alive=count`` (its host guard refuses a count the host cannot hold, before anything starts);
``--warm W`` fills a warm pool of W fresh sandboxes first (timed: warm_fill_s). Then ``count`` episodes start at
once: each acquires a sandbox (start latency: from asking to holding it), waits until the whole fleet is alive
(bring_up_s: from the first ask to the last sandbox held), then runs ``--steps`` commands (step latency per command).
``--kill-frac`` kills that share of the sandboxes from outside while their first step runs (bwrap: every process of
the sandbox's cgroup; docker: ``docker kill``); an episode whose sandbox fails is an infrastructure failure with its
cause and is retried from its first step in a fresh sandbox, at most ``--retries`` times. At the end: episodes
completed / lost / run twice (must be count / 0 / 0), env steps per second over the stepping phase, driver peak RSS,
mean per-sandbox memory (bwrap: the sandbox's cgroup), and after the pool is closed the run's leftovers
(containers, state dirs, cgroups: must be 0). ``--snapshot-iters``: p50 of a rebuild (fresh create + prepare) vs a
snapshot restore of the prepared work dir, and their ratio. Prints one JSON object.

Timings are only meaningful on a quiet machine; the load average is printed beside them.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import resource
import secrets
import signal
import sys
import time

RUN = os.environ.setdefault("AGENTRL_RUN_ID", f"bench-fleet-{os.getpid()}-{secrets.token_hex(3)}")
os.environ.setdefault("AGENTRL_SANDBOX_THREADS", "600")

from agentrl.sandboxes import (HostGuard, SandboxError, SandboxPool, SandboxSpec, create_sandbox,  # noqa: E402
                               restore_snapshot, sweep, take_snapshot)
from agentrl.sandboxes.base import LABEL_RUN, state_root  # noqa: E402

# The prepared state of the snapshot comparison (a stand-in for a repo checkout and its set-up).
PREPARE = "mkdir -p src && for i in $(seq 1 64); do echo $i > src/f$i; done"
STEP = "i=0; while [ $i -lt {n} ]; do i=$((i+1)); done; echo step-{k}"  # a shell loop: the step's own cost


def pct(xs: list[float], q: float) -> float | None:
    if not xs:
        return None
    xs = sorted(xs)
    return round(xs[min(len(xs) - 1, int(round(q * (len(xs) - 1))))], 4)


def kill_from_outside(sb) -> None:
    if sb.backend == "docker":
        from agentrl.sandboxes.docker import docker_client

        docker_client().api.kill(sb.container_id)
        return
    for pid in (sb.cgroup.pids() if sb.cgroup is not None else [p.pid for p in sb._procs]):
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def leftovers(run: str) -> dict[str, int]:
    """What of this run is still on the host: containers, bwrap state dirs, cgroups."""
    from agentrl.sandboxes.bwrap_state import safe_name
    from agentrl.sandboxes.cgroups import CGROUP_ROOT, V1_CONTROLLERS

    out = {"containers": 0, "state_dirs": 0, "cgroups": 0}
    try:
        from agentrl.sandboxes import docker_available

        if docker_available()[0]:
            from agentrl.sandboxes.docker import docker_client

            out["containers"] = len(docker_client().api.containers(all=True, filters={"label": f"{LABEL_RUN}={run}"}))
    except Exception:
        out["containers"] = -1  # could not ask the engine
    state = state_root() / safe_name(run)
    out["state_dirs"] = sum(1 for _ in state.iterdir()) if state.is_dir() else 0
    for base in [CGROUP_ROOT / "agentrl"] + [CGROUP_ROOT / c / "agentrl" for c in V1_CONTROLLERS]:
        d = base / safe_name(run)
        if d.is_dir():
            out["cgroups"] += sum(1 for p in d.iterdir() if p.is_dir())
    return out


async def fleet(args, spec: SandboxSpec) -> dict:
    pool = SandboxPool(max_alive=args.count, create_rate=args.create_rate, create_burst=args.create_burst,
                       max_warm=0, guard=HostGuard(overcommit=args.overcommit))
    out: dict = {}
    if args.warm:
        t0 = time.monotonic()
        await pool.keep_warm(spec, args.warm, wait=True)
        out["warm_fill_s"] = round(time.monotonic() - t0, 3)
        await pool.keep_warm(spec, 0)  # what the fleet takes beyond the warm pool is made on demand
    starts: list[float] = []
    steps: list[float] = []
    failures: list[str] = []
    completed: dict[int, int] = {}
    sandbox_mem: list[int] = []
    victims = set(range(0, args.count, max(1, round(1 / args.kill_frac)))) if args.kill_frac > 0 else set()
    ready = 0
    all_up = asyncio.Event()
    t_first = time.monotonic()
    t_up: list[float] = []
    stepping: list[float] = []

    async def attempt(i: int, try_no: int) -> None:
        t0 = time.monotonic()
        async with pool.acquire(spec) as sb:
            starts.append(time.monotonic() - t0)
            if try_no == 0:
                ready_bump()
                await all_up.wait()
                stepping.append(time.monotonic())
            for k in range(args.steps):
                cmd = STEP.format(n=args.step_loop, k=k)
                if try_no == 0 and k == 0 and i in victims:
                    cmd = f"sleep 30 # victim-{i}"
                    task = asyncio.create_task(sb.exec(cmd, timeout=60))
                    await asyncio.sleep(0.2)  # the command is starting; the kill lands during it
                    kill_from_outside(sb)
                    await task  # raises SandboxError: the kill is the cause
                s0 = time.monotonic()
                res = await sb.exec(cmd, timeout=60)
                steps.append(time.monotonic() - s0)
                if res.oom_killed or res.disk_full:  # the sandbox's limit, not the step: an infrastructure failure
                    cause = "memory limit (OOM kill)" if res.oom_killed else "disk limit (work dir or /tmp full)"
                    raise SandboxError(f"step {k} hit the sandbox's {cause}", sandbox_id=sb.id)
                if not res.ok:
                    raise SandboxError(f"step {k} failed: exit {res.exit_code}", sandbox_id=sb.id)
            if hasattr(sb, "memory_bytes") and (m := sb.memory_bytes()) is not None:
                sandbox_mem.append(m)
        completed[i] = completed.get(i, 0) + 1

    async def episode(i: int) -> None:
        for try_no in range(args.retries + 1):
            try:
                return await attempt(i, try_no)
            except SandboxError as e:
                failures.append(f"episode {i} try {try_no}: {e}")
                if try_no == 0 and ready < args.count and i not in completed:
                    # a failure before the fleet was up still counts this episode as up, so the others go on
                    ready_bump()

    def ready_bump() -> None:
        nonlocal ready
        ready += 1
        if ready == args.count:
            t_up.append(time.monotonic())
            all_up.set()

    await asyncio.gather(*(episode(i) for i in range(args.count)))
    t_end = time.monotonic()
    await pool.close()
    t_step0 = min(stepping) if stepping else t_end
    out.update({
        "bring_up_s": round((t_up[0] if t_up else t_end) - t_first, 3),
        "start_p50_s": pct(starts, 0.5), "start_p99_s": pct(starts, 0.99),
        "step_p50_s": pct(steps, 0.5), "step_p99_s": pct(steps, 0.99),
        "steps_per_s": round(len(steps) / max(1e-9, t_end - t_step0), 2),
        "episodes_completed": len(completed), "episodes_lost": args.count - len(completed),
        "episodes_twice": sum(1 for v in completed.values() if v > 1),
        "killed": len(victims), "infra_failures": len(failures), "failures_sample": failures[:3],
        "warm_hits": pool.stats.warm_hits, "created": pool.stats.created, "stopped": pool.stats.stopped,
        "sandbox_mem_mean_mb": round(sum(sandbox_mem) / len(sandbox_mem) / 2**20, 2) if sandbox_mem else None,
        "driver_peak_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
        "leftovers": leftovers(RUN),
    })
    return out


async def snapshot_vs_create(spec: SandboxSpec, iters: int) -> dict:
    """A rebuild (a fresh sandbox made and prepared) vs a snapshot restore of the prepared state."""
    creates, restores = [], []
    for _ in range(iters):
        t0 = time.monotonic()
        sb = await create_sandbox(spec).start()
        await sb.exec(PREPARE, timeout=60)
        creates.append(time.monotonic() - t0)
        await sb.stop()
    async with create_sandbox(spec) as sb:
        await sb.exec(PREPARE, timeout=60)
        snap = await take_snapshot(sb)
        for _ in range(iters):
            await sb.exec("echo dirty > src/f1 && echo x > new", timeout=60)
            t0 = time.monotonic()
            await restore_snapshot(sb, snap)
            restores.append(time.monotonic() - t0)
    c, r = pct(creates, 0.5), pct(restores, 0.5)
    return {"rebuild_p50_s": c, "restore_p50_s": r, "restore_speedup": round(c / r, 2) if c and r else None}


async def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--backend", choices=("bwrap", "docker"), default="bwrap")
    ap.add_argument("--image", default="agentrl-busybox:latest")
    ap.add_argument("--count", type=int, default=8, help="sandboxes alive at once (episodes)")
    ap.add_argument("--steps", type=int, default=5, help="commands per episode")
    ap.add_argument("--step-loop", type=int, default=1000, help="iterations of the step's shell loop")
    ap.add_argument("--warm", type=int, default=0, help="warm pool size filled before the episodes start")
    ap.add_argument("--create-rate", type=float, default=100.0)
    ap.add_argument("--create-burst", type=int, default=8)
    ap.add_argument("--memory-mb", type=int, default=64)
    ap.add_argument("--pids", type=int, default=32)
    ap.add_argument("--overcommit", type=float, default=4.0)
    ap.add_argument("--kill-frac", type=float, default=0.0, help="share of sandboxes killed from outside mid-step")
    ap.add_argument("--retries", type=int, default=1, help="fresh-sandbox retries of an episode after a failure")
    ap.add_argument("--snapshot-iters", type=int, default=0)
    args = ap.parse_args()
    if args.count < 1 or args.steps < 1 or not (0 <= args.kill_frac <= 1):
        ap.error("--count and --steps must be >= 1, --kill-frac within [0, 1]")
    spec = SandboxSpec(backend=args.backend, image=args.image, memory_mb=args.memory_mb, pids=args.pids,
                       ttl_s=3600, workdir_size_mb=64, tmp_size_mb=16)
    out = {"backend": args.backend, "count": args.count, "steps": args.steps, "run": RUN,
           "loadavg_before": os.getloadavg()}
    try:
        out["fleet"] = await fleet(args, spec)
        if args.snapshot_iters:
            out["snapshot"] = await snapshot_vs_create(spec, args.snapshot_iters)
    finally:
        sweep(RUN)
    out["loadavg_after"] = os.getloadavg()
    print(json.dumps(out, indent=2))
    bad = out["fleet"]["episodes_lost"] or out["fleet"]["episodes_twice"] or any(out["fleet"]["leftovers"].values())
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    asyncio.run(main())
