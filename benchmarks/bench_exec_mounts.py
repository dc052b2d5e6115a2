"""A bwrap exec's cost against the number of mounts on the host (issue 31: at 2,048 live sandboxes the fleet's step
throughput fell to 38 % of ideal).

Each bwrap exec makes a new mount namespace, which copies the host's mount table; every live bwrap sandbox adds two
tmpfs mounts to it (its work dir and /tmp, the disk caps). This benchmark isolates that: one real bwrap sandbox, and
before each point, tmpfs mounts added under a scratch dir on the host until ``N`` extra are there (what N/2 live
sandboxes add); then ``--execs`` execs of ``true``, reporting the median wall time and the CPU (driver and children)
per exec. Every mount it made is unmounted at the end, also on an error. Needs root and the busybox rootfs
(``agentrl sandboxes build-image --busybox``).

``--live-sandboxes`` measures the fleet itself instead: before each point, real bwrap sandboxes (with their disk
caps) are created until ``N`` others are alive, and the host's mount count is reported beside the exec's cost.

    .venv/bin/python benchmarks/bench_exec_mounts.py                  # N = 0, 1,024, 4,096
    .venv/bin/python benchmarks/bench_exec_mounts.py --points 0 8 --execs 3
"""

from __future__ import annotations

import argparse
import asyncio
import os
import resource
import shutil
import statistics
import subprocess
import tempfile
import time
from pathlib import Path


def _cpu() -> float:
    return sum(getattr(resource.getrusage(who), f) for who in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN)
               for f in ("ru_utime", "ru_stime"))


def _host_mounts() -> int:
    with open("/proc/self/mounts") as f:
        return sum(1 for _ in f)


async def run(points: list[int], execs: int, image: str, live: bool = False) -> list[dict]:
    from agentrl.sandboxes import SandboxSpec, create_sandbox

    scratch = Path(tempfile.mkdtemp(prefix="agentrl-bench-mounts-"))
    made: list[Path] = []
    others = []
    rows = []
    spec = SandboxSpec(backend="bwrap", image=image, ttl_s=900, memory_mb=32, pids=32)
    try:
        async with create_sandbox(spec) as sb:
            await sb.exec("true")  # warm: the first exec loads what the rest reuse
            for n in points:
                while live and len(others) < n:
                    others.append(await create_sandbox(spec).start())
                while not live and len(made) < n:
                    d = scratch / str(len(made))
                    d.mkdir()
                    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(d)], check=True)
                    made.append(d)
                walls, c0 = [], _cpu()
                for _ in range(execs):
                    t0 = time.perf_counter()
                    res = await sb.exec("true")
                    walls.append(time.perf_counter() - t0)
                    if res.exit_code != 0:
                        raise RuntimeError(f"exec failed: {res}")
                row = {"extra_mounts": len(made), "live_sandboxes": len(others) + 1, "host_mounts": _host_mounts(),
                       "wall_ms": 1e3 * statistics.median(walls), "cpu_ms": 1e3 * (_cpu() - c0) / execs,
                       "load": os.getloadavg()[0]}
                rows.append(row)
                first = len(others) if live else row["extra_mounts"]
                print(f"| {first:,} | {row['host_mounts']:,} | {row['wall_ms']:.1f} | {row['cpu_ms']:.1f} "
                      f"| {row['load']:.2f} |", flush=True)
    finally:
        for o in others:
            await o.stop()
        for d in reversed(made):
            subprocess.run(["umount", str(d)], check=False)
        shutil.rmtree(scratch, ignore_errors=True)
    return rows


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--points", type=int, nargs="+", default=[0, 1024, 4096], help="extra host mounts per point")
    p.add_argument("--execs", type=int, default=40, help="execs of `true` per point")
    p.add_argument("--image", default="agentrl-busybox:latest")
    p.add_argument("--live-sandboxes", action="store_true",
                   help="points count other live bwrap sandboxes (with their disk caps), not bare host mounts")
    a = p.parse_args()
    if os.geteuid() != 0:
        raise SystemExit("bench_exec_mounts: needs root (it mounts tmpfs on the host)")
    first = "other live sandboxes" if a.live_sandboxes else "extra mounts"
    print(f"| {first} | host mounts | exec wall ms (median) | CPU ms per exec | load |")
    print("| ---: | ---: | ---: | ---: | ---: |")
    asyncio.run(run(sorted(a.points), a.execs, a.image, a.live_sandboxes))


if __name__ == "__main__":
    main()
