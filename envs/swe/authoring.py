"""Making a suite instance from two trees of a small repository: the buggy one and the fixed one (with new tests).

    python -m agentrl.envs.swe.authoring NAME BASE_DIR FIXED_DIR --problem ISSUE.md [--owner agentrl-suite]
                                         [--install]     # copy BASE_DIR to suite/repos/NAME, append to instances.jsonl

The base commit is built from BASE_DIR with :func:`build_git_repo` (deterministic). Changes under ``tests/`` become
the test patch, all other changes the gold patch. FAIL_TO_PASS and PASS_TO_PASS are measured, not written by hand:
every test of the fixed tree is run at base + test patch and at the fixed tree; tests that pass only after the fix
are FAIL_TO_PASS, tests that pass in both are PASS_TO_PASS. A test that fails on the fixed tree, or no
FAIL_TO_PASS test at all, is an error. The tests run on this host, unsandboxed: only for in-house code.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from .grader import RUNNER_PATH
from .repos import SUITE_INSTANCES, SUITE_REPOS, build_git_repo, git, source_files


def _run(root: Path, args: list[str]) -> str:
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "PYTHONDONTWRITEBYTECODE": "1"}
    proc = subprocess.run([sys.executable, str(RUNNER_PATH), *args], cwd=root, capture_output=True, text=True, env=env, timeout=600)
    if proc.returncode != 0:
        raise RuntimeError(f"unittest_runner failed in {root}: {proc.stderr[-2000:]}")
    return proc.stdout


def _statuses(root: Path, ids: list[str]) -> dict[str, str]:
    out = root / ".agentrl-results.jsonl"
    _run(root, ["--out", str(out), "--per-test-timeout", "60", *ids])
    res = {r["id"]: r["status"] for r in map(json.loads, out.read_text().splitlines())}
    out.unlink()
    return res


def make_instance(name: str, base_dir: Path, fixed_dir: Path, problem: str, *, owner: str = "agentrl-suite",
                  number: int = 1) -> dict[str, Any]:
    """Returns the SWE-bench instance dict for the bug fixed between ``base_dir`` and ``fixed_dir``."""
    tmp = Path(tempfile.mkdtemp(prefix="agentrl-author-"))
    try:
        work = tmp / "work"
        base = build_git_repo(base_dir, work)
        for rel in source_files(work):
            (work / rel).unlink()
        for rel in source_files(fixed_dir):
            (work / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(fixed_dir / rel, work / rel)
        git("add", "-A", cwd=work)
        gold = git("diff", "--cached", base, "--", ".", ":(exclude)tests", cwd=work)
        test_patch = git("diff", "--cached", base, "--", "tests", cwd=work)
        if not gold.strip() or not test_patch.strip():
            raise ValueError(f"{name}: both a source change and a tests/ change are needed")
        ids = _run(work, ["--list"]).split()
        after = _statuses(work, ids)
        git("checkout", "-q", base, "--", ".", cwd=work)  # back to base, then only the test patch
        git("reset", "-q", cwd=work)
        git("clean", "-qfd", cwd=work)
        (tmp / "test.patch").write_text(test_patch)
        git("apply", str(tmp / "test.patch"), cwd=work)
        before = _statuses(work, ids)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    failing = [t for t in ids if after[t] != "pass"]
    if failing:
        raise ValueError(f"{name}: tests fail on the fixed tree: {failing}")
    f2p = [t for t in ids if before[t] != "pass"]
    if not f2p:
        raise ValueError(f"{name}: no test fails before the fix, so nothing would be graded")
    return {
        "instance_id": f"{owner}__{name}-{number}",
        "repo": f"{owner}/{name}",
        "base_commit": base,
        "patch": gold,
        "test_patch": test_patch,
        "problem_statement": problem,
        "FAIL_TO_PASS": f2p,
        "PASS_TO_PASS": [t for t in ids if before[t] == "pass"],
        "version": "1.0",
        "created_at": "2024-01-01T00:00:00Z",
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m agentrl.envs.swe.authoring", description=__doc__.splitlines()[0])
    ap.add_argument("name")
    ap.add_argument("base_dir", type=Path)
    ap.add_argument("fixed_dir", type=Path)
    ap.add_argument("--problem", type=Path, required=True, help="file with the issue text")
    ap.add_argument("--owner", default="agentrl-suite")
    ap.add_argument("--number", type=int, default=1)
    ap.add_argument("--install", action="store_true", help="copy BASE_DIR into the suite and append the instance")
    args = ap.parse_args(argv)
    inst = make_instance(args.name, args.base_dir, args.fixed_dir, args.problem.read_text(), owner=args.owner, number=args.number)
    line = json.dumps(inst)
    if args.install:
        dest = SUITE_REPOS / args.name
        if dest.exists():
            print(f"error: {dest} exists", file=sys.stderr)
            return 2
        shutil.copytree(args.base_dir, dest, ignore=shutil.ignore_patterns("__pycache__", "*.pyc", ".git"))
        with open(SUITE_INSTANCES, "a") as f:
            f.write(line + "\n")
        print(f"added {inst['instance_id']} (F2P {len(inst['FAIL_TO_PASS'])}, P2P {len(inst['PASS_TO_PASS'])})")
    else:
        print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
