"""Sandbox benchmark: create + exec + destroy latency per backend, and N sandboxes alive at once through the pool.

    .venv/bin/python benchmarks/bench_sandboxes.py [--backends docker,bwrap] [--latency-iters 30] [--alive 64,256]

Latency: sequential create -> exec("true") -> destroy of one sandbox (busybox image), p50/p99 of each phase and of
the whole; then ``--warm-execs`` execs of ``true`` in one sandbox (exec_warm: the per-command cost of an episode).
Alive: N tasks each acquire a sandbox from a SandboxPool (max_alive=N) and start ``sleep`` in it; once all N run,
we record creations per second (N / time until all were up), memory per sandbox (the mean of the sandboxes' cgroup
memory; for docker plus the PSS of its containerd shim and the growth of dockerd/containerd), then release
everything and check that no container, state dir or cgroup of the run is left. Prints a JSON summary.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import secrets
import statistics
import sys
import time
from pathlib import Path

os.environ.setdefault("AGENTRL_SANDBOX_THREADS", "600")

from agentrl.sandboxes import SandboxPool, SandboxSpec, create_sandbox, sweep  # noqa: E402
from agentrl.sandboxes.base import LABEL_RUN, state_root  # noqa: E402

IMAGE = "agentrl-busybox:latest"


def pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(q * (len(xs) - 1))))]


def mem_available() -> int:
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemAvailable:"):
            return int(line.split()[1]) * 1024
    return 0


def pss_bytes(pid: int) -> int:
    """Proportional set size of a process (shared pages split among their users), 0 if it is gone."""
    try:
        for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
            if line.startswith("Pss:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def engine_pss(container_ids: set[str] | None = None) -> int:
    """PSS of dockerd + containerd, plus the containerd shims of the given containers (their per-sandbox cost
    outside the containers' own cgroups)."""
    total = 0
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            cmd = (d / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        exe = os.path.basename(cmd[0].decode(errors="replace")) if cmd and cmd[0] else ""
        if exe in ("dockerd", "containerd"):
            total += pss_bytes(int(d.name))
        elif exe.startswith("containerd-shim") and container_ids:
            if any(arg.decode(errors="replace") in container_ids for arg in cmd):
                total += pss_bytes(int(d.name))
    return total


def docker_cgroup_memory(container_id: str) -> int | None:
    for p in (
        Path(f"/sys/fs/cgroup/memory/docker/{container_id}/memory.usage_in_bytes"),
        Path(f"/sys/fs/cgroup/system.slice/docker-{container_id}.scope/memory.current"),
        Path(f"/sys/fs/cgroup/docker/{container_id}/memory.current"),
    ):
        try:
            return int(p.read_text())
        except (OSError, ValueError):
            continue
    return None


def sandbox_memory(sb) -> int | None:
    if sb.backend == "docker":
        return docker_cgroup_memory(sb.container_id)
    return sb.memory_bytes()


async def bench_latency(backend: str, iters: int, run: str, warm_execs: int = 30) -> dict:
    spec = SandboxSpec(backend=backend, image=IMAGE, ttl_s=600)
    create, execs, destroy, total = [], [], [], []
    for i in range(iters + 1):
        t0 = time.perf_counter()
        sb = await create_sandbox(spec, run=run).start()
        t1 = time.perf_counter()
        res = await sb.exec("true", timeout=30)
        t2 = time.perf_counter()
        await sb.stop()
        t3 = time.perf_counter()
        assert res.ok, res
        if i == 0:
            continue  # warm-up (first engine connection, page cache)
        create.append(t1 - t0)
        execs.append(t2 - t1)
        destroy.append(t3 - t2)
        total.append(t3 - t0)
    warm = []
    async with create_sandbox(spec, run=run) as sb:
        for i in range(warm_execs + 1):
            t0 = time.perf_counter()
            res = await sb.exec("true", timeout=30)
            if i:
                warm.append(time.perf_counter() - t0)
            assert res.ok, res
    ms = lambda xs, q: round(1000 * pct(xs, q), 1)  # noqa: E731
    return {
        "iters": iters,
        "exec_warm_ms": {"p50": ms(warm, 0.5), "p99": ms(warm, 0.99)},
        "create_ms": {"p50": ms(create, 0.5), "p99": ms(create, 0.99)},
        "exec_ms": {"p50": ms(execs, 0.5), "p99": ms(execs, 0.99)},
        "destroy_ms": {"p50": ms(destroy, 0.5), "p99": ms(destroy, 0.99)},
        "total_ms": {"p50": ms(total, 0.5), "p99": ms(total, 0.99), "mean": round(1000 * statistics.mean(total), 1)},
    }


def leftovers(backend: str, run: str) -> int:
    if backend == "docker":
        from agentrl.sandboxes.docker import docker_client

        return len(docker_client().api.containers(all=True, filters={"label": f"{LABEL_RUN}={run}"}))
    d = state_root() / run
    n = len(list(d.iterdir())) if d.exists() else 0
    n += sum(1 for c in ("memory", "pids", "cpu") if Path(f"/sys/fs/cgroup/{c}/agentrl/{run}").exists())
    return n


async def bench_alive(backend: str, n: int, run: str, create_rate: float) -> dict:
    spec = SandboxSpec(backend=backend, image=IMAGE, ttl_s=900, memory_mb=64, pids=32)
    pool = SandboxPool(max_alive=n, create_rate=create_rate, create_burst=8, run=run)
    mem0 = mem_available()
    engine0 = engine_pss() if backend == "docker" else 0
    up = asyncio.Event()
    release = asyncio.Event()
    ready: list = []
    t0 = time.perf_counter()
    t_all = [0.0]

    async def one() -> None:
        async with pool.acquire(spec) as sb:
            task = asyncio.create_task(sb.exec("sleep 600", timeout=700))
            ready.append(sb)
            if len(ready) == n:
                t_all[0] = time.perf_counter() - t0
                up.set()
            await release.wait()
            task.cancel()
            try:
                await task
            except (asyncio.CancelledError, Exception):
                pass

    tasks = [asyncio.create_task(one()) for _ in range(n)]
    await asyncio.wait_for(up.wait(), 900)
    await asyncio.sleep(3.0)  # let the sleep commands start everywhere
    mem_drop = mem0 - mem_available()
    cg = [m for m in (sandbox_memory(sb) for sb in ready) if m is not None]
    engine = (engine_pss({sb.container_id for sb in ready}) - engine0) if backend == "docker" else 0
    t_rel = time.perf_counter()
    release.set()
    await asyncio.gather(*tasks)
    await pool.close()
    t_release = time.perf_counter() - t_rel
    await asyncio.sleep(1.0)
    left = leftovers(backend, run)
    return {
        "n": n,
        "seconds_to_all_alive": round(t_all[0], 2),
        "creations_per_s": round(n / t_all[0], 2),
        # inside the sandbox's cgroup (for bwrap this includes the bwrap process itself)
        "cgroup_mem_per_sandbox_mib": round(statistics.mean(cg) / 2**20, 2) if cg else None,
        # docker only: containerd shim + dockerd/containerd growth, per sandbox
        "engine_mem_per_sandbox_mib": round(engine / n / 2**20, 2) if backend == "docker" else 0.0,
        # MemAvailable drop / n: noisy on a shared machine, for reference only
        "host_memavailable_drop_per_sandbox_mib": round(mem_drop / n / 2**20, 2),
        "release_all_s": round(t_release, 2),
        "leftovers_after_release": left,
        "pool": pool.stats.__dict__,
    }


async def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--backends", default="docker,bwrap")
    ap.add_argument("--latency-iters", type=int, default=30)
    ap.add_argument("--alive", default="64,256")
    ap.add_argument("--create-rate", type=float, default=100.0)
    ap.add_argument("--warm-execs", type=int, default=30)
    args = ap.parse_args()
    run = f"bench-{secrets.token_hex(3)}"
    out: dict = {"run": run, "cpus": os.cpu_count(), "image": IMAGE, "backends": {}}
    try:
        for backend in args.backends.split(","):
            res: dict = {"latency": await bench_latency(backend, args.latency_iters, run, args.warm_execs)}
            print(backend, "latency", json.dumps(res["latency"]), file=sys.stderr, flush=True)
            for n in [int(x) for x in args.alive.split(",") if x]:
                res[f"alive_{n}"] = await bench_alive(backend, n, run, args.create_rate)
                print(backend, n, json.dumps(res[f"alive_{n}"]), file=sys.stderr, flush=True)
            out["backends"][backend] = res
    finally:
        sweep(run)
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    asyncio.run(main())
