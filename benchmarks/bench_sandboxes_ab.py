"""Sandbox cost before and after a change: ``bench_sandboxes.py`` run on two source trees, interleaved, same machine.

    .venv/bin/python benchmarks/bench_sandboxes_ab.py --old /tmp/agentrl-main [--rounds 3] [--alive 64]

``--old`` is a checkout of the baseline (e.g. ``git worktree add --detach /tmp/agentrl-main main``); "new" is this
tree. Both run the same benchmark script (this tree's ``bench_sandboxes.py``) as separate processes, alternating
old/new (the order flips every round), so that load drifting over the run hits both alike. Each phase's p50/p99 is
the median over rounds; the ratio is new/old. Prints a markdown table, the load average before and after every run,
and writes all raw results as JSON (``--out``).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent

# Runs a script with ``agentrl`` imported from the tree in AGENTRL_AB_TREE, not from the editable install.
BOOT = """
import os, runpy, sys
sys.meta_path[:] = [f for f in sys.meta_path if "editable" not in getattr(f, "__module__", "") + repr(f)]
sys.path.insert(0, os.environ["AGENTRL_AB_TREE"])
import agentrl.sandboxes
assert agentrl.sandboxes.__file__.startswith(os.environ["AGENTRL_AB_TREE"]), agentrl.sandboxes.__file__
sys.argv = sys.argv[1:]
runpy.run_path(sys.argv[0], run_name="__main__")
"""


def package_tree(src: Path, dest: Path) -> Path:
    """The importable layout of a checkout: ``agentrl/`` with ``sandboxes/`` and ``envs/`` inside it (what the
    editable install maps)."""
    shutil.copytree(src / "agentrl", dest / "agentrl")
    for sub in ("sandboxes", "envs"):
        if (src / sub).is_dir():
            shutil.copytree(src / sub, dest / "agentrl" / sub)
    return dest


def loadavg() -> str:
    return " ".join(Path("/proc/loadavg").read_text().split()[:3])


def run_once(tree: Path, args: argparse.Namespace) -> dict:
    cmd = [sys.executable, "-c", BOOT, str(HERE / "bench_sandboxes.py"), "--backends", args.backends,
           "--latency-iters", str(args.latency_iters), "--alive", args.alive, "--warm-execs", str(args.warm_execs)]
    before = loadavg()
    t0 = time.monotonic()
    p = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, "AGENTRL_AB_TREE": str(tree)})
    if p.returncode != 0:
        raise SystemExit(f"bench failed on {tree}:\n{p.stderr[-3000:]}")
    out = json.loads(p.stdout[p.stdout.index("{"):])
    out["loadavg_before"], out["loadavg_after"], out["wall_s"] = before, loadavg(), round(time.monotonic() - t0, 1)
    return out


def med(xs: list[float]) -> float:
    return statistics.median(xs)


def table(results: dict[str, list[dict]], backends: list[str], alive: list[int]) -> str:
    rows = ["| backend | metric | old | new | new/old |", "| --- | --- | --- | --- | --- |"]
    for b in backends:
        for phase in ("create_ms", "exec_ms", "destroy_ms", "total_ms", "exec_warm_ms"):
            for q in ("p50", "p99"):
                o = med([r["backends"][b]["latency"][phase][q] for r in results["old"] if phase in r["backends"][b]["latency"]] or [float("nan")])
                n = med([r["backends"][b]["latency"][phase][q] for r in results["new"]])
                rows.append(f"| {b} | {phase[:-3]} {q} (ms) | {o:.1f} | {n:.1f} | {n / o:.2f} |")
        for k in alive:
            o = med([r["backends"][b][f"alive_{k}"]["creations_per_s"] for r in results["old"]])
            n = med([r["backends"][b][f"alive_{k}"]["creations_per_s"] for r in results["new"]])
            rows.append(f"| {b} | creations/s, {k} alive | {o:.1f} | {n:.1f} | {n / o:.2f} |")
            lo = max(r["backends"][b][f"alive_{k}"]["leftovers_after_release"] for r in results["old"] + results["new"])
            rows.append(f"| {b} | left after release, {k} alive (max) | | {lo} | |")
    return "\n".join(rows)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--old", required=True, help="checkout of the baseline")
    ap.add_argument("--new", default=str(REPO), help="checkout of the change (default: this tree)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--backends", default="docker,bwrap")
    ap.add_argument("--latency-iters", type=int, default=30)
    ap.add_argument("--warm-execs", type=int, default=30)
    ap.add_argument("--alive", default="64")
    ap.add_argument("--out", default="")
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="agentrl-ab-"))
    trees = {"old": package_tree(Path(args.old), work / "old"), "new": package_tree(Path(args.new), work / "new")}
    results: dict[str, list[dict]] = {"old": [], "new": []}
    try:
        for r in range(args.rounds):
            for which in (("old", "new") if r % 2 == 0 else ("new", "old")):
                res = run_once(trees[which], args)
                results[which].append(res)
                print(f"round {r + 1} {which}: {res['wall_s']} s, load {res['loadavg_before']} -> "
                      f"{res['loadavg_after']}", file=sys.stderr, flush=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    backends = args.backends.split(",")
    alive = [int(x) for x in args.alive.split(",") if x]
    print(table(results, backends, alive))
    print("\nload average (1/5/15 min) before -> after each run:")
    for which in ("old", "new"):
        print(f"- {which}: " + "; ".join(f"{r['loadavg_before']} -> {r['loadavg_after']}" for r in results[which]))
    if args.out:
        Path(args.out).write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
