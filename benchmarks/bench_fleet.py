"""Fleet benchmark: N sandboxes alive at once under the env manager, each running an episode of real commands.

    PYTHONPATH=. .venv/bin/python benchmarks/bench_fleet.py --backend bwrap --count 8 [--steps 2] [--step-loop N]
        [--kill-frac 0.05 --oom-frac 0.01 --disk-frac 0.01] [--retries 3] [--no-warm] [--snapshot-iters 5]
        [--create-rate 100] [--memory-mb 32 --pids 32 --overcommit 4]

Flow: ``count`` episodes of ``agentrl.envs.shell:ShellEnv`` (one sandbox each, from one SandboxPool with
``max_alive=count``; its host guard refuses a count the host cannot hold, before anything starts) run through an
:class:`~agentrl.manager.EnvManager` (``max_concurrency=count``) with :class:`agentrl.testing.fleet.FleetPolicy`.
Unless ``--no-warm``, the manager sizes the pool's warm pool by its admission rule first
(``EnvManager.warm_sandboxes``: here all ``count``; timed: warm_fill_s). Each first attempt waits at its first
action until the whole fleet is alive (bring_up_s: from the run's start to that moment; start latency: each
sandbox's from asking the pool to holding it), then runs ``--steps`` commands (a busybox shell loop of
``--step-loop`` iterations each) and ``echo done``. Faults on first attempts (``--kill-frac``: the sandbox killed
from outside while its command runs; ``--oom-frac``: a command past the memory limit; ``--disk-frac``: one past the
work dir's size) end those episodes as infrastructure failures with their cause, retried by the manager in fresh
sandboxes (``--retries`` = ``infra_retries``). Reported: episodes completed / lost / run to the end twice (must be
count / 0 / 0), failures per cause, env steps/s over the stepping phase vs the ideal (the cores divided by the mean
CPU time of an episode's step commands, the loops and the ``echo``, run on the host with the image's busybox), step latency percentiles, driver peak
RSS and per-episode driver memory, mean per-sandbox memory (its memory cgroup, sampled when the fleet is up), the
driver's exit after the last result, and after the pool is closed the run's leftovers (containers, state dirs,
cgroups: must be 0). ``--restart-daemon`` (docker): the machine's dockerd is restarted once the fleet is up; every
episode in flight then fails as ``sandbox_engine``, and its retries wait in the pool for the engine to answer again.
``--snapshot-iters``: p50 of a rebuild (fresh create + prepare) vs a snapshot restore of the
prepared work dir, and their ratio. Prints one JSON object.

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
import subprocess
import sys
import time
from pathlib import Path

RUN = os.environ.setdefault("AGENTRL_RUN_ID", f"bench-fleet-{os.getpid()}-{secrets.token_hex(3)}")
os.environ.setdefault("AGENTRL_SANDBOX_THREADS", "2600")

from agentrl.manager import EnvManager, EpisodeSpec, ManagerConfig  # noqa: E402
from agentrl.sandboxes import (HostGuard, SandboxPool, SandboxSpec, create_sandbox, restore_snapshot,  # noqa: E402
                               rootfs_path, sweep, take_snapshot)
from agentrl.sandboxes.base import LABEL_RUN, state_root  # noqa: E402
from agentrl.testing.fleet import STEP, FleetPolicy  # noqa: E402

# The prepared state of the snapshot comparison (a stand-in for a repo checkout and its set-up).
PREPARE = "mkdir -p src && for i in $(seq 1 64); do echo $i > src/f$i; done"
SHELL = "agentrl.envs.shell:ShellEnv"


def _cpu_split() -> tuple[float, float]:
    """(this process's CPU, its reaped children's CPU) in seconds."""
    return tuple(sum(getattr(resource.getrusage(who), f) for f in ("ru_utime", "ru_stime"))
                 for who in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN))


def pct(xs: list[float], q: float) -> float | None:
    if not xs:
        return None
    xs = sorted(xs)
    return round(xs[min(len(xs) - 1, int(round(q * (len(xs) - 1))))], 4)


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


def step_cpu_s(image: str, loop: int, reps: int = 20, command: str | None = None) -> float:
    """CPU seconds of a step's own command (the shell loop, or ``command``), run on the host by the image's
    busybox."""
    sh = rootfs_path(image) / "bin" / "sh"
    argv = [str(sh) if sh.exists() else "/bin/sh", "-c", command or STEP.format(n=loop, k=0)]
    r0 = resource.getrusage(resource.RUSAGE_CHILDREN)
    for _ in range(reps):
        subprocess.run(argv, check=True, stdout=subprocess.DEVNULL)
    r1 = resource.getrusage(resource.RUSAGE_CHILDREN)
    return (r1.ru_utime + r1.ru_stime - r0.ru_utime - r0.ru_stime) / reps


def sandbox_memory(sb) -> int | None:
    if hasattr(sb, "memory_bytes"):
        return sb.memory_bytes()
    memcg = getattr(sb, "_memcg", None)
    if memcg is None and getattr(sb, "init_pid", None):
        from agentrl.sandboxes.cgroups import memory_cgroup_of

        memcg = memory_cgroup_of(sb.init_pid)
    for name in ("memory.current", "memory.usage_in_bytes"):
        try:
            return int((memcg / name).read_text()) if memcg is not None else None
        except (OSError, ValueError):
            continue
    return None


def restart_dockerd(log: str = "/var/log/agentrl-dockerd.log") -> dict:
    """The machine's dockerd restarted as ``systemctl restart docker`` would: SIGTERM (its containers die with it),
    wait for it to exit, start it again with the same command line. Seconds to its exit and to its first answer."""
    from agentrl.sandboxes.docker_engine import engine_answers

    pids = subprocess.run(["pgrep", "-x", "dockerd"], capture_output=True, text=True).stdout.split()
    if len(pids) != 1:
        raise SystemExit(f"--restart-daemon needs exactly one dockerd running, found pids {pids}")
    pid = int(pids[0])
    argv = [a.decode() for a in Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0") if a]
    nice = os.getpriority(os.PRIO_PROCESS, pid)  # not this process's (often niced) priority
    t0 = time.monotonic()
    os.kill(pid, signal.SIGTERM)

    def gone() -> bool:  # a zombie counts as gone (its parent may reap late)
        try:
            return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
        except OSError:
            return True

    while not gone():
        time.sleep(0.1)
    stopped = time.monotonic() - t0
    for _ in range(4):  # dockerd exits when its containerd is not up within 15 s (.ci/start-dockerd.sh): again
        proc = subprocess.Popen(argv, stdout=open(log, "ab"), stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                start_new_session=True, preexec_fn=lambda: os.setpriority(os.PRIO_PROCESS, 0, nice))
        while proc.poll() is None and not engine_answers():
            time.sleep(0.2)
        if proc.poll() is None:
            break
    else:
        raise SystemExit(f"dockerd exited 4 times before it answered after the restart; see {log}")
    return {"daemon_stop_s": round(stopped, 2), "daemon_down_s": round(time.monotonic() - t0, 2)}


def faults_for(count: int, args) -> dict[int, str]:
    """Spread each fault's share over the fleet (by index, interleaved)."""
    out: dict[int, str] = {}
    for name, frac, offset in (("kill", args.kill_frac, 0), ("oom", args.oom_frac, 1), ("disk", args.disk_frac, 2)):
        if frac > 0:
            k = round(count * frac)
            for j in range(k):
                i = (int(j * count / k) + offset) % count
                while i in out:
                    i = (i + 3) % count
                out[i] = name
    return out


async def fleet(args, spec: SandboxSpec) -> dict:
    made: dict = {}

    async def factory(s):
        sb = await create_sandbox(s, run=RUN).start()
        made[sb.id] = sb
        return sb

    pool = SandboxPool(max_alive=args.count, create_rate=args.create_rate, create_burst=args.create_burst,
                       max_warm=0, guard=HostGuard(overcommit=args.overcommit), factory=factory, run=RUN,
                       max_running_execs=args.max_execs, max_creating=args.max_creating)
    n = args.count
    faults = faults_for(n, args)
    policy = FleetPolicy(made, steps=args.steps, loop=args.step_loop, barrier=n)
    cfg = ManagerConfig(max_concurrency=n, num_groups=n, group_size=1, infra_retries=args.retries,
                        max_failures_per_group=0, step_timeout_s=600, reset_timeout_s=1800, latency_window=1 << 20)
    specs = [EpisodeSpec(SHELL, {"pool": pool, "spec": spec}, seed=i, task={"fault": faults.get(i), "expect": "done"})
             for i in range(n)]
    out: dict = {}
    rss0 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    async with EnvManager(cfg, policy) as m:
        if not args.no_warm:
            t0 = time.monotonic()
            out["warm_target"] = await m.warm_sandboxes(pool, spec, wait=True)
            out["warm_fill_s"] = round(time.monotonic() - t0, 3)
        t_start = time.monotonic()
        run = asyncio.ensure_future(m.run_episodes(specs))
        await asyncio.wait([run, asyncio.ensure_future(policy.all_up.wait())], return_when=asyncio.FIRST_COMPLETED)
        t_up = policy.all_up_at or time.monotonic()
        if args.restart_daemon:  # every episode's first step is running in its container
            out.update(await asyncio.to_thread(restart_dockerd))
        if not args.no_warm:  # the fleet is up and no new episode will start: retries are made on demand
            await pool.keep_warm(spec, 0, fleet=True)
        alive = [sb for sb in made.values() if sb.running]
        mem = [x for x in (sandbox_memory(sb) for sb in alive[:: max(1, len(alive) // 64)]) if x is not None]
        steps_at_up = m.counts["env_steps"]
        cpu_at_up = _cpu_split()
        trajs = await run
        t_last = time.monotonic()
        cpu_at_end = _cpu_split()
        met = m.metrics()
        failed = list(m.failed)
    await pool.close()
    t_exit = time.monotonic()
    ok = [t for t in trajs if t.termination == "terminated"]
    starts = [t.info["sandbox_start_s"] for t in trajs + failed
              if isinstance(t.info, dict) and t.info.get("sandbox_start_s") is not None]
    lat = list(m._runner.latencies)
    stepping_s = max(1e-9, t_last - t_up)
    n_stepped = max(1, met["env_steps"] - steps_at_up)
    sps = n_stepped / stepping_s
    cpu = step_cpu_s(args.image, args.step_loop)
    # An episode steps ``--steps`` loops and one ``echo done``: the ideal is the cores over the mean CPU of its
    # steps (counting only the loop's CPU per step overstated the ideal's complement 2x at --steps 1).
    per_step = (args.steps * cpu + step_cpu_s(args.image, 0, command="echo done")) / (args.steps + 1)
    ideal = (os.cpu_count() or 1) / per_step if per_step > 0 else None
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    out.update({
        "bring_up_s": round(t_up - t_start, 3), "alive_at_up": len(alive), "barrier_broken": policy.barrier_broken,
        "start_p50_s": pct(starts, 0.5), "start_p99_s": pct(starts, 0.99),
        "step_p50_s": pct(lat, 0.5), "step_p99_s": pct(lat, 0.99),
        "steps_per_s": round(sps, 2), "step_cmd_cpu_s": round(cpu, 5),
        # where the stepping phase's CPU went, per env step: the driver's own Python, and the execs (bwrap / docker
        # clients and the commands in them; the step commands' own CPU is ``per_step`` of it)
        "driver_cpu_ms_per_step": round(1e3 * (cpu_at_end[0] - cpu_at_up[0]) / n_stepped, 2),
        "exec_cpu_ms_per_step": round(1e3 * (cpu_at_end[1] - cpu_at_up[1]) / n_stepped, 2),
        "step_cmd_cpu_ms_per_step": round(1e3 * per_step, 2),
        "ideal_steps_per_s": round(ideal, 2) if ideal else None,
        "of_ideal": round(sps / ideal, 3) if ideal else None,
        "episodes_completed": len(ok), "episodes_lost": n - len(ok),
        "episodes_twice": met["finished"] - len(ok) + (len(ok) - len({t.id for t in ok})),
        "faults": {f: sum(1 for x in faults.values() if x == f) for f in ("kill", "oom", "disk")},
        "kills_landed": policy.kills, "infra_retried": met["infra_retried"],
        "failures": {k.split("/", 1)[1]: v for k, v in met.items() if k.startswith("failures/")},
        "failures_sample": sorted({(t.error or "")[:160] for t in failed})[:5],
        "warm_hits": pool.stats.warm_hits, "created": pool.stats.created, "stopped": pool.stats.stopped,
        "create_failures": pool.stats.create_failures, "create_retries": pool.stats.retries,
        "max_running_execs": args.max_execs,
        "peak_running_execs": pool.exec_gate.peak_running if pool.exec_gate is not None else None,
        "sandbox_mem_mean_mb": round(sum(mem) / len(mem) / 2**20, 2) if mem else None,
        "driver_peak_rss_mb": round(rss / 1024, 1),
        "driver_kb_per_episode": round((rss - rss0) / n, 1),
        "exit_after_last_result_s": round(t_exit - t_last, 3),
        "leftovers": leftovers(RUN),
    })
    return out


async def snapshot_vs_create(spec: SandboxSpec, iters: int, prepare: str = PREPARE) -> dict:
    """A rebuild (a fresh sandbox made and prepared by ``prepare``) vs a snapshot restore of the prepared state.
    The ratio is the prepare's cost over a reset's: the default prepare is nearly free, a repo's set-up is not."""
    creates, restores = [], []
    for _ in range(iters):
        t0 = time.monotonic()
        sb = await create_sandbox(spec).start()
        await sb.exec(prepare, timeout=600)
        creates.append(time.monotonic() - t0)
        await sb.stop()
    async with create_sandbox(spec) as sb:
        await sb.exec(prepare, timeout=600)
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
    ap.add_argument("--steps", type=int, default=2, help="shell-loop commands per episode (then `echo done`)")
    ap.add_argument("--step-loop", type=int, default=1000, help="iterations of the step's shell loop")
    ap.add_argument("--no-warm", action="store_true", help="no warm pool (sandboxes made as episodes ask)")
    ap.add_argument("--create-rate", type=float, default=100.0)
    ap.add_argument("--create-burst", type=int, default=8)
    ap.add_argument("--memory-mb", type=int, default=32)
    ap.add_argument("--pids", type=int, default=32)
    ap.add_argument("--overcommit", type=float, default=4.0)
    ap.add_argument("--kill-frac", type=float, default=0.0, help="share of sandboxes killed from outside mid-step")
    ap.add_argument("--oom-frac", type=float, default=0.0, help="share of episodes whose command passes the memory limit")
    ap.add_argument("--disk-frac", type=float, default=0.0, help="share of episodes whose command fills the work dir")
    ap.add_argument("--retries", type=int, default=3, help="infra_retries: fresh-sandbox retries after such a failure")
    ap.add_argument("--max-execs", type=int, default=None,
                    help="the pool's max_running_execs: commands running at once (others wait; default no limit)")
    ap.add_argument("--max-creating", type=int, default=8, help="the pool's max_creating: creations in flight")
    ap.add_argument("--restart-daemon", action="store_true",
                    help="docker: restart the machine's dockerd once the fleet is up (its containers die with it)")
    ap.add_argument("--snapshot-iters", type=int, default=0)
    ap.add_argument("--prepare", default=PREPARE, help="the prepared state's set-up command (snapshot comparison)")
    args = ap.parse_args()
    fr = (args.kill_frac, args.oom_frac, args.disk_frac)
    if args.count < 1 or args.steps < 0 or not all(0 <= f <= 1 for f in fr) or sum(fr) > 1:
        ap.error("--count must be >= 1, --steps >= 0, the fault shares within [0, 1] and at most 1 together")
    if args.restart_daemon and args.backend != "docker":
        ap.error("--restart-daemon restarts the docker daemon: it needs --backend docker")
    spec = SandboxSpec(backend=args.backend, image=args.image, memory_mb=args.memory_mb, pids=args.pids,
                       ttl_s=3600, workdir_size_mb=4, tmp_size_mb=4)
    out = {"backend": args.backend, "count": args.count, "steps": args.steps, "step_loop": args.step_loop,
           "run": RUN, "cpus": os.cpu_count(), "loadavg_before": os.getloadavg()}
    try:
        out["fleet"] = await fleet(args, spec)
        if args.snapshot_iters:
            out["snapshot"] = await snapshot_vs_create(spec, args.snapshot_iters, args.prepare)
    finally:
        sweep(RUN)
    out["loadavg_after"] = os.getloadavg()
    print(json.dumps(out, indent=2))
    f = out["fleet"]
    bad = f["episodes_lost"] or f["episodes_twice"] or any(f["leftovers"].values())
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    asyncio.run(main())
