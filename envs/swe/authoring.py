"""Making an SWE instance from a real fix: two commits of a repository, the tests measured in the instance's image.

    python -m agentrl.envs.swe.authoring --repos-dir D --repo OWNER/NAME --base REV --fixed REV --problem ISSUE.md
        [--env-specs FILE] [--version V] [--id ID] [--backend docker|bwrap] [--append FILE]

``--base`` is the commit the agent starts from (``base_commit``: the real commit of the repository, resolved to its
full id) and ``--fixed`` a later commit with the fix and its tests. Changes to test files (``tests/``-style
directories, ``test_*.py``, ``*_test.py``, ``conftest.py``) between them become the ``test_patch``, all other
changes the gold ``patch``. FAIL_TO_PASS and PASS_TO_PASS are measured, not written by hand: the tests of the
test files the test patch touches are listed and run in the instance's own image (:mod:`agentrl.envs.swe.images`,
the env spec of ``--env-specs`` for ``(repo, version)``), by the grader itself, once with the gold patch and once
without: tests that pass only with it are FAIL_TO_PASS, tests that pass with both are PASS_TO_PASS, tests that fail
even with the fix are left out (and listed). No FAIL_TO_PASS test is an error.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import shlex
import sys
from dataclasses import replace
from pathlib import Path, PurePosixPath
from typing import Any

from .envspec import EnvSpecs
from .grader import GRADE_DIR, SANDBOX_ENV, grade, make_sandbox, stage_files, apply_patch
from .images import ImageBuilder, materialize
from .instances import SWEInstance
from .repos import RepoError, RepoStore, git, patch_paths
from .runners import RUNNER_FILES

TEST_DIRS = {"tests", "test", "testing"}


def is_test_path(path: str) -> bool:
    p = PurePosixPath(path)
    return (any(part in TEST_DIRS for part in p.parts[:-1]) or p.name == "conftest.py"
            or (p.name.endswith(".py") and (p.name.startswith("test_") or p.name.endswith("_test.py"))))


def split_diff(objects: Path, base: str, fixed: str) -> tuple[str, str]:
    """``(gold patch, test patch)`` of ``base..fixed`` in the git directory ``objects``."""
    changed = [p for p in git("diff", "--name-only", "-z", base, fixed, cwd=objects).split("\0") if p]
    tests = [p for p in changed if is_test_path(p)]
    gold = [p for p in changed if not is_test_path(p)]
    diff = lambda paths: git("diff", "--binary", base, fixed, "--", *paths, cwd=objects) if paths else ""  # noqa: E731
    return diff(gold), diff(tests)


async def list_tests(images: ImageBuilder, inst: SWEInstance) -> list[str]:
    """The ids of the tests in the files the test patch touches, listed in the instance's image at base + test patch."""
    rt = await asyncio.to_thread(images.prepare, inst)
    files = [p for p in patch_paths(inst.test_patch) if p.endswith(".py") and PurePosixPath(p).name != "conftest.py"]
    async with make_sandbox(rt.sandbox) as sb:
        await materialize(sb, rt)
        await stage_files(sb, {"test.patch": inst.test_patch, "unittest_runner.py": RUNNER_FILES["unittest"].read_bytes()})
        ok, out = await apply_patch(sb, f"{GRADE_DIR}/test.patch")
        if not ok:
            raise ValueError(f"{inst.instance_id}: the test patch does not apply at base: {out[-800:]}")
        env = {**SANDBOX_ENV, **rt.env}
        quoted = " ".join(shlex.quote(f) for f in files)
        if rt.runner == "pytest":  # only the files that still exist (a test patch may delete some)
            existing = f'set --; for f in {quoted}; do [ -f "$f" ] && set -- "$@" "$f"; done; '
            res = await sb.exec(f'{existing}{rt.python} -m pytest --collect-only -q -p no:cacheprovider "$@"',
                                timeout=600, env=env)
            return [line.strip() for line in res.output.splitlines() if "::" in line and not line.startswith(("ERROR", "="))]
        paths = " ".join(f"--path {shlex.quote(p)}" for p in rt.env_spec.pythonpath)
        res = await sb.exec(f"{rt.python} {GRADE_DIR}/unittest_runner.py --list --start . {paths}", timeout=600, env=env)
        modules = {f[:-3].replace("/", ".") for f in files}
        return [t for t in res.output.split() if any(t.startswith(m + ".") for m in modules)]


async def make_instance(store: RepoStore, repo: str, base: str, fixed: str, problem: str, *, env_specs: EnvSpecs,
                        sandbox: Any, version: str = "", instance_id: str | None = None) -> tuple[dict[str, Any], list[str]]:
    """Returns ``(SWE-bench instance dict, ids left out because they fail even with the fix)``."""
    src = store.source(repo)
    if src.kind == "files":
        raise RepoError(f"repo {repo!r}: {src.path} holds plain files; authoring needs a git repository with both commits")
    export = store.export(repo, base)
    objects = store._git_source(repo, src)
    fixed_full = git("rev-parse", "--verify", f"{fixed}^{{commit}}", cwd=objects).strip()
    gold, test_patch = split_diff(objects, export.commit, fixed_full)
    if not gold.strip() or not test_patch.strip():
        raise ValueError(f"{repo}: {base}..{fixed} needs both a source change and a test change")
    iid = instance_id or f"{repo.replace('/', '__')}-{fixed_full[:8]}"
    extra = {"version": version} if version else {}
    images = ImageBuilder(sandbox, store, env_specs)
    spec = images.env_spec(SWEInstance(iid, repo, export.commit, gold, test_patch, problem, ("x",), (), extra))
    runner = spec.runner if spec.runner != "auto" else ("pytest" if spec.has_pytest else "unittest")
    placeholder = "tests/x.py::x" if runner == "pytest" else "tests.x.X.x"  # fixes the runner until ids are known
    draft = SWEInstance(iid, repo, export.commit, gold, test_patch, problem, (placeholder,), (), extra)
    ids = await list_tests(images, draft)
    if not ids:
        raise ValueError(f"{iid}: no tests found in the files of the test patch ({patch_paths(test_patch)})")
    probe = replace(draft, FAIL_TO_PASS=tuple(ids))
    with_fix, without = await asyncio.gather(grade(probe, gold, images=images), grade(probe, "", images=images))
    after, before = with_fix.fail_to_pass, without.fail_to_pass
    ok = ("pass", "xfail")
    f2p = [t for t in ids if after.get(t) in ok and before.get(t) not in ok]
    p2p = [t for t in ids if after.get(t) in ok and before.get(t) in ok]
    broken = [t for t in ids if after.get(t) not in ok]
    if not f2p:
        raise ValueError(f"{iid}: no test fails without the fix and passes with it (with the fix: {after})")
    inst = {"instance_id": iid, "repo": repo, "base_commit": export.commit, "patch": gold, "test_patch": test_patch,
            "problem_statement": problem, "FAIL_TO_PASS": f2p, "PASS_TO_PASS": p2p, "version": version,
            "environment_setup_commit": export.commit, "created_at": "", "hints_text": ""}
    return inst, broken


def main(argv: list[str] | None = None) -> int:
    from .env import _sandbox_spec

    ap = argparse.ArgumentParser(prog="python -m agentrl.envs.swe.authoring", description=__doc__.splitlines()[0])
    ap.add_argument("--repos-dir", required=True)
    ap.add_argument("--repo", required=True, help="owner/name")
    ap.add_argument("--base", required=True, help="the commit the agent starts from")
    ap.add_argument("--fixed", required=True, help="a later commit with the fix and its tests")
    ap.add_argument("--problem", type=Path, required=True, help="file with the issue text")
    ap.add_argument("--env-specs", default=None)
    ap.add_argument("--version", default="")
    ap.add_argument("--id", default=None)
    ap.add_argument("--backend", default="docker", choices=["docker", "bwrap", "auto"])
    ap.add_argument("--append", type=Path, default=None, help="append the instance to this JSONL file")
    args = ap.parse_args(argv)
    try:
        inst, broken = asyncio.run(make_instance(
            RepoStore(args.repos_dir), args.repo, args.base, args.fixed, args.problem.read_text(),
            env_specs=EnvSpecs.load(args.env_specs), sandbox=_sandbox_spec({"backend": args.backend}),
            version=args.version, instance_id=args.id))
    except (RepoError, ValueError, OSError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if broken:
        print(f"left out (fail even with the fix): {', '.join(broken)}", file=sys.stderr)
    line = json.dumps(inst)
    if args.append:
        with open(args.append, "a") as f:
            f.write(line + "\n")
        print(f"added {inst['instance_id']} (F2P {len(inst['FAIL_TO_PASS'])}, P2P {len(inst['PASS_TO_PASS'])})")
    else:
        print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
