"""SWE env figures: per-instance image build time (cold, then cached), grading time per instance, and the cost of
getting the repository into a sandbox (the old per-sandbox upload from the driver vs the in-sandbox copy from the
image).

    .venv/bin/python benchmarks/bench_swe.py [--backends docker bwrap] [--repeats 3] [--upload-mb 22]

Uses the real upstream instances (agentrl.envs.swe.upstream, built into the user cache) and two instances of the
shipped suite. Cold builds go into a fresh image cache (``AGENTRL_SWE_IMAGE_CACHE``) and fresh docker tags, which
are removed afterwards. Prints markdown tables; the load average is printed before and after.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import statistics
import tempfile
import time
from pathlib import Path


def _load() -> str:
    return open("/proc/loadavg").read().split()[0]


def _fmt(xs: list[float]) -> str:
    return f"{statistics.median(xs):.2f} (min {min(xs):.2f}, max {max(xs):.2f})"


def bench_builds(backends: list[str], up: Path) -> list[str]:
    """Cold build of every upstream instance's layers (+ docker image), then a warm prepare."""
    from agentrl.envs.swe import images as im
    from agentrl.envs.swe.envspec import EnvSpecs
    from agentrl.envs.swe.instances import load_instances
    from agentrl.envs.swe.repos import RepoStore
    from agentrl.sandboxes import SandboxSpec

    rows = ["| backend | instance | cold build s (what was built) | cached prepare s |", "|---|---|---|---|"]
    insts = load_instances(up / "instances.jsonl")
    for backend in backends:
        cache = Path(tempfile.mkdtemp(prefix="agentrl-swe-bench-", dir="/var/cache/agentrl" if os.geteuid() == 0 else None))
        os.chmod(cache, 0o755)
        os.environ["AGENTRL_SWE_IMAGE_CACHE"] = str(cache)
        old_repo = im.DOCKER_REPO
        im.DOCKER_REPO = f"agentrl-swe-bench{os.getpid()}"
        try:
            for inst in insts:
                logs: list[str] = []
                b = im.ImageBuilder(SandboxSpec(backend=backend), RepoStore(up / "repos"),
                                    EnvSpecs.load(up / "env_specs.yaml"), log=logs.append)
                t0 = time.monotonic()
                b.prepare(inst)
                cold = time.monotonic() - t0
                warm_b = im.ImageBuilder(SandboxSpec(backend=backend), RepoStore(up / "repos"), EnvSpecs.load(up / "env_specs.yaml"))
                t0 = time.monotonic()
                warm_b.prepare(inst)
                warm = time.monotonic() - t0
                what = "; ".join(logs)
                rows.append(f"| {backend} | {inst.instance_id} | {cold:.1f} ({what}) | {warm:.2f} |")
        finally:
            if backend == "docker":
                from agentrl.sandboxes.docker import docker_client

                for img in docker_client().images.list(name=im.DOCKER_REPO):
                    docker_client().images.remove(img.id, force=True)
            im.DOCKER_REPO = old_repo
            os.environ.pop("AGENTRL_SWE_IMAGE_CACHE", None)
            shutil.rmtree(cache, ignore_errors=True)
    return rows


async def bench_grades(backends: list[str], up: Path, repeats: int) -> list[str]:
    """Grading time of the gold and the empty patch, one grade at a time, warm images."""
    from agentrl.envs.swe.envspec import EnvSpecs
    from agentrl.envs.swe.grader import grade
    from agentrl.envs.swe.images import ImageBuilder
    from agentrl.envs.swe.instances import load_instances
    from agentrl.envs.swe.repos import SUITE_INSTANCES, RepoStore
    from agentrl.sandboxes import SandboxSpec

    rows = ["| backend | instance | runner | tests | gold s, median of N | empty s, median of N |", "|---|---|---|---|---|---|"]
    sets = [(load_instances(up / "instances.jsonl"), RepoStore(up / "repos"), EnvSpecs.load(up / "env_specs.yaml")),
            (load_instances(SUITE_INSTANCES, ["agentrl-suite__statsmini-1", "agentrl-suite__ledger-1"]), RepoStore(), None)]
    for backend in backends:
        for insts, store, specs in sets:
            images = ImageBuilder(SandboxSpec(backend=backend), store, specs)
            for inst in insts:
                images.prepare(inst)
                times: dict[str, list[float]] = {"gold": [], "empty": []}
                for _ in range(repeats):
                    for name, patch in (("gold", inst.patch), ("empty", "")):
                        r = await grade(inst, patch, images=images)
                        assert r.resolved == (name == "gold"), r.reason
                        times[name].append(r.duration)
                n = len(inst.FAIL_TO_PASS) + len(inst.PASS_TO_PASS)
                rows.append(f"| {backend} | {inst.instance_id} | {r.runner} | {n} | {_fmt(times['gold'])} | "
                            f"{_fmt(times['empty'])} |")
    return rows


async def bench_upload(backends: list[str], up: Path, repeats: int, upload_mb: int) -> list[str]:
    """Repository into a fresh sandbox: ``sb.upload(working copy)`` (the old way: a tar built and streamed by the
    driver, per sandbox) vs ``materialize`` (a copy inside the sandbox from the image, nothing from the driver)."""
    from agentrl.envs.swe.envspec import EnvSpecs
    from agentrl.envs.swe.grader import make_sandbox
    from agentrl.envs.swe.images import ImageBuilder, materialize
    from agentrl.envs.swe.instances import load_instances, parse_instance
    from agentrl.envs.swe.repos import RepoStore, build_git_repo
    from agentrl.sandboxes import SandboxSpec
    from agentrl.sandboxes.docker import _tar_dir

    rows = ["| backend | repository | tree + .git MB | upload (before) s | bytes from the driver (before) | "
            "in-sandbox copy (after) s | bytes from the driver (after) |", "|---|---|---|---|---|---|---|"]
    tmp = Path(tempfile.mkdtemp(prefix="agentrl-swe-upload-"))
    try:
        # a synthetic repository of upload_mb MB of source-like text (the size the issue measured for pyparsing)
        big_src = tmp / "big" / "agentrl-bench__big"
        for i in range(upload_mb * 4):
            d = big_src / f"pkg{i // 50}"
            d.mkdir(parents=True, exist_ok=True)
            (d / f"m{i}.py").write_text("".join(f"def f_{i}_{j}(x):\n    return x * {j}  # {os.urandom(8).hex()}\n"
                                                for j in range(4600)))
        big_commit = build_git_repo(big_src, tmp / "probe")
        big = parse_instance({"instance_id": "agentrl-bench__big-1", "repo": "agentrl-bench/big", "base_commit": big_commit,
                              "patch": "", "test_patch": "", "problem_statement": "", "FAIL_TO_PASS": ["tests.t.T.t"],
                              "PASS_TO_PASS": []})
        (jinja,) = load_instances(up / "instances.jsonl", ["pallets__jinja-xmlattr-keys"])
        cases = [(jinja, RepoStore(up / "repos"), EnvSpecs.load(up / "env_specs.yaml")), (big, RepoStore(tmp / "big", tmp / "cache"), None)]
        for backend in backends:
            for inst, store, specs in cases:
                images = ImageBuilder(SandboxSpec(backend=backend), store, specs)
                rt = images.prepare(inst)
                local = store.checkout(inst.repo, inst.base_commit)
                size = sum(p.stat().st_size for p in local.rglob("*") if p.is_file()) / 1e6
                before, after, sent = [], [], 0
                for _ in range(repeats):
                    async with make_sandbox(rt.sandbox) as sb:
                        t0 = time.monotonic()
                        await sb.upload(local, rt.sandbox.workdir)
                        before.append(time.monotonic() - t0)
                    sent = len(_tar_dir(local))
                    async with make_sandbox(rt.sandbox) as sb:
                        t0 = time.monotonic()
                        await materialize(sb, rt)
                        after.append(time.monotonic() - t0)
                rows.append(f"| {backend} | {inst.repo} | {size:.1f} | {_fmt(before)} | {sent / 1e6:.1f} MB | "
                            f"{_fmt(after)} | 0 |")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--backends", nargs="*", default=["docker", "bwrap"])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--upload-mb", type=int, default=22)
    ap.add_argument("--skip", nargs="*", default=[], choices=["builds", "grades", "upload"])
    args = ap.parse_args()
    from agentrl.envs.swe.repos import default_cache_dir
    from agentrl.envs.swe.upstream import build

    up = build(default_cache_dir() / "upstream")
    print(f"load average before: {_load()}\n")
    if "builds" not in args.skip:
        print("## Per-instance image build (cold, fresh cache) and cached prepare\n")
        print("\n".join(bench_builds(args.backends, up)) + "\n")
    if "grades" not in args.skip:
        print(f"## Grading time per instance (one grade at a time, warm images, {args.repeats} repeats)\n")
        print("\n".join(asyncio.run(bench_grades(args.backends, up, args.repeats))) + "\n")
    if "upload" not in args.skip:
        print(f"## Repository into a fresh sandbox ({args.repeats} repeats)\n")
        print("\n".join(asyncio.run(bench_upload(args.backends, up, args.repeats, args.upload_mb))) + "\n")
    print(f"load average after: {_load()}")


if __name__ == "__main__":
    main()
