"""Grading a patch against an SWE instance, in a fresh sandbox.

Steps (SWE-bench's harness, offline): the repository at ``base_commit`` is uploaded into a new sandbox's work dir;
the model patch is applied with ``git apply`` (an unresolved result with git's message if it does not apply); the
files the test patch touches are reset to ``base_commit`` (so a model cannot pre-empt or break the new tests by
editing them) and the test patch is applied; every ``FAIL_TO_PASS`` and ``PASS_TO_PASS`` test id is run with
:mod:`agentrl.envs.swe.unittest_runner` under a per-test timeout and an overall timeout. The instance is resolved
iff every ``FAIL_TO_PASS`` test passes and every ``PASS_TO_PASS`` test still passes.

Infrastructure failures (the sandbox cannot start, the engine dies) raise ``SandboxError``; a bad patch never
raises, it gives ``resolved=False`` with the reason.
"""

from __future__ import annotations

import asyncio
import json
import shlex
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable

from .instances import SWEInstance
from .repos import RepoStore, patch_paths

RUNNER_PATH = Path(__file__).resolve().parent / "unittest_runner.py"
#: Scratch directory inside the sandbox (its private /tmp), outside the repository.
GRADE_DIR = "/tmp/agentrl-grade"
#: Environment of every command the SWE env and the grader run: no bytecode files in diffs, git trusts the repo.
SANDBOX_ENV = {
    "PYTHONDONTWRITEBYTECODE": "1",
    "PYTHONUNBUFFERED": "1",
    "HOME": "/tmp",
    "GIT_CONFIG_COUNT": "1",
    "GIT_CONFIG_KEY_0": "safe.directory",
    "GIT_CONFIG_VALUE_0": "*",
    "GIT_PAGER": "cat",
    "PAGER": "cat",
}
PASS = "pass"

SandboxFactory = Callable[[Any], Any]
"""``factory(spec)`` returns an async context manager that yields a started sandbox and releases it on exit.
The default, :func:`make_sandbox`, creates a new one (a ``Sandbox`` is such a context manager); to go through a
``SandboxPool`` pass ``pool.acquire``."""


def make_sandbox(spec: Any) -> Any:
    """Returns an unstarted sandbox for ``spec`` (an ``agentrl.sandboxes.SandboxSpec``) on its backend; ``async
    with`` starts and stops it."""
    from agentrl import sandboxes

    create = getattr(sandboxes, "create_sandbox", None)
    if create is not None:
        return create(spec)
    if spec.backend == "docker":
        from agentrl.sandboxes.docker import DockerSandbox

        return DockerSandbox(spec)
    from agentrl.sandboxes.bwrap import BwrapSandbox  # type: ignore[import-not-found]

    return BwrapSandbox(spec)


def default_spec(**overrides: Any) -> Any:
    """Returns the ``SandboxSpec`` used when none is given: the base image (python3, git), docker, no network."""
    from agentrl.sandboxes.base import SandboxSpec

    return SandboxSpec(**overrides)


@dataclass
class GradeResult:
    """The outcome of grading one patch.

    ``resolved``: every FAIL_TO_PASS test passed and every PASS_TO_PASS test passed.
    ``applied``: the model patch applied (an empty patch counts as applied).
    ``reason``: ``"resolved"`` or why not (the first problem found, then the failing test ids).
    ``fail_to_pass`` / ``pass_to_pass``: test id -> status (``pass``, ``fail``, ``error``, ``skip``, ``timeout``,
    ``missing``, ``not_run``); empty when the tests never ran. ``details``: test id -> the failure text of the tests
    that did not pass. ``duration``: seconds from the call to the verdict. ``log``: the tail of git's and the
    runner's output.
    """

    instance_id: str
    resolved: bool
    applied: bool
    reason: str
    fail_to_pass: dict[str, str] = field(default_factory=dict)
    pass_to_pass: dict[str, str] = field(default_factory=dict)
    details: dict[str, str] = field(default_factory=dict)
    duration: float = 0.0
    timed_out: bool = False
    log: str = ""

    @property
    def fail_to_pass_fraction(self) -> float:
        """Fraction of FAIL_TO_PASS tests that passed (0.0 when the tests did not run)."""
        if not self.fail_to_pass:
            return 0.0
        return sum(s == PASS for s in self.fail_to_pass.values()) / len(self.fail_to_pass)

    @property
    def pass_to_pass_ok(self) -> bool:
        return bool(self.fail_to_pass) and all(s == PASS for s in self.pass_to_pass.values())

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["fail_to_pass_fraction"] = self.fail_to_pass_fraction
        return d


def _tail(text: str, n: int = 2000) -> str:
    return text if len(text) <= n else "..." + text[-n:]


def _summarise(statuses: dict[str, str], limit: int = 5) -> str:
    bad = [f"{t} ({s})" for t, s in statuses.items() if s != PASS]
    more = f" and {len(bad) - limit} more" if len(bad) > limit else ""
    return ", ".join(bad[:limit]) + more


APPLIED = "@@agentrl:applied"
RESULTS = "@@agentrl:results"


async def stage_files(sb: Any, files: dict[str, bytes | str]) -> None:
    """Copies ``files`` (name -> content) into :data:`GRADE_DIR` in one upload (one exec, not one per file)."""
    with tempfile.TemporaryDirectory(prefix="agentrl-grade-") as tmp:
        for name, data in files.items():
            (Path(tmp) / name).write_bytes(data.encode() if isinstance(data, str) else data)
        await sb.upload(tmp, GRADE_DIR)


def _apply_script(path: str) -> str:
    # git apply, then a lenient retry (wrong hunk line counts, drifted context); the first attempt's messages are
    # the ones reported. The marker says whether either attempt applied.
    q = shlex.quote(path)
    return (
        f"git apply -v --whitespace=nowarn {q} 2>&1 && echo {APPLIED} || "
        f"{{ git apply --whitespace=nowarn --recount -C1 --ignore-whitespace {q} >/dev/null 2>&1 "
        f"&& echo '(applied with --recount -C1 --ignore-whitespace)' && echo {APPLIED}; }}"
    )


def _patch_text(patch: str) -> str:
    return patch if patch.endswith("\n") else patch + "\n"


async def apply_patch(sb: Any, path: str, *, timeout: float = 60.0) -> tuple[bool, str]:
    """Applies the patch file ``path`` (in the sandbox) to the repository in the work dir (see
    :func:`_apply_script`). Returns ``(applied, git_output)``."""
    res = await sb.exec(_apply_script(path), timeout=timeout, env=SANDBOX_ENV)
    return (not res.timed_out and APPLIED in res.output), res.output.replace(APPLIED, "").strip()


def reset_script(base_commit: str, test_patch: str) -> str:
    """Shell lines that restore every path ``test_patch`` touches to its ``base_commit`` state (or delete it if it
    did not exist then), so that a model patch cannot pre-empt or break the new tests by editing them."""
    return "\n".join(
        f"if git cat-file -e {shlex.quote(base_commit + ':' + p)} 2>/dev/null; "
        f"then git checkout -q {shlex.quote(base_commit)} -- {shlex.quote(p)} || exit 3; else rm -rf -- {shlex.quote(p)}; fi"
        for p in patch_paths(test_patch)
    )


async def apply_test_patch(sb: Any, instance: SWEInstance, path: str, *, timeout: float = 60.0) -> tuple[bool, str]:
    """Resets the test files (:func:`reset_script`) and applies the test patch file ``path``, in one exec.
    Returns ``(ok, output)``."""
    script = f"( {reset_script(instance.base_commit, instance.test_patch) or 'true'}\n) || {{ echo 'cannot reset the test files'; exit 3; }}\n"
    res = await sb.exec(script + _apply_script(path), timeout=timeout, env=SANDBOX_ENV)
    return (not res.timed_out and APPLIED in res.output), res.output.replace(APPLIED, "").strip()


async def run_tests(
    sb: Any, test_ids: list[str], *, timeout: float, per_test_timeout: float
) -> tuple[dict[str, tuple[str, str]], bool, str]:
    """Runs ``test_ids`` (staged in ``GRADE_DIR/ids.txt``, with the runner) from the repository root. Returns
    ``({id: (status, detail)}, timed_out, output)``. Ids without a result line get ``timeout`` when the overall
    timeout fired, else ``not_run`` (the runner died)."""
    out_file = f"{GRADE_DIR}/results.jsonl"
    cmd = (
        f"python3 {GRADE_DIR}/unittest_runner.py --out {out_file} --per-test-timeout {per_test_timeout:g} "
        f"--ids-file {GRADE_DIR}/ids.txt; rc=$?; echo {RESULTS}; cat {out_file} 2>/dev/null; exit $rc"
    )
    res = await sb.exec(cmd, timeout=timeout, env=SANDBOX_ENV, output_limit=64 << 20)
    runner_out, _, lines = res.output.partition(RESULTS)
    if res.timed_out:  # the command was killed before its cat: read what the runner had written
        lines = (await sb.exec(f"cat {out_file} 2>/dev/null; true", timeout=60, env=SANDBOX_ENV, output_limit=64 << 20)).output
    results: dict[str, tuple[str, str]] = {}
    for line in lines.splitlines():
        try:
            rec = json.loads(line)
            results[rec["id"]] = (rec["status"], rec.get("detail", ""))
        except (json.JSONDecodeError, KeyError, TypeError):
            continue  # a line cut by a kill mid-write
    missing = "timeout" if res.timed_out else "not_run"
    for t in test_ids:
        if t not in results:
            why = "the overall test timeout fired first" if res.timed_out else f"the runner stopped: {_tail(runner_out, 500)}"
            results[t] = (missing, why)
    return results, res.timed_out, runner_out


async def grade(
    instance: SWEInstance,
    model_patch: str,
    *,
    spec: Any = None,
    repo_store: RepoStore | None = None,
    sandbox_factory: SandboxFactory | None = None,
    timeout_s: float = 600.0,
    per_test_timeout_s: float = 60.0,
) -> GradeResult:
    """Grades ``model_patch`` for ``instance`` in a fresh sandbox (see the module doc); returns a GradeResult.

    ``spec`` is the ``SandboxSpec`` (default :func:`default_spec`), ``repo_store`` finds the repository (default:
    the shipped suite), ``sandbox_factory`` gives the sandbox (see :data:`SandboxFactory`; e.g. ``pool.acquire``),
    ``timeout_s`` bounds the test run, ``per_test_timeout_s`` each test. The sandbox is always released.
    Raises ``SandboxError`` on infrastructure failures and ``RepoError`` for a missing repo.
    """
    t0 = time.monotonic()
    store = repo_store or RepoStore()
    spec = spec if spec is not None else default_spec()
    local = await asyncio.to_thread(store.checkout, instance.repo, instance.base_commit)
    log: list[str] = []

    def result(**kw: Any) -> GradeResult:
        return GradeResult(instance_id=instance.instance_id, duration=time.monotonic() - t0, log=_tail("\n".join(log), 4000), **kw)

    ids = list(dict.fromkeys(instance.FAIL_TO_PASS + instance.PASS_TO_PASS))
    async with (sandbox_factory or make_sandbox)(spec) as sb:
        await sb.upload(local, spec.workdir)
        await stage_files(sb, {
            "model.patch": _patch_text(model_patch),
            "test.patch": _patch_text(instance.test_patch),
            "unittest_runner.py": RUNNER_PATH.read_bytes(),
            "ids.txt": "\n".join(ids) + "\n",
        })
        if model_patch.strip():
            applied, out = await apply_patch(sb, f"{GRADE_DIR}/model.patch")
            log.append(f"$ git apply model.patch\n{out}")
            if not applied:
                return result(resolved=False, applied=False, reason=f"patch does not apply: {_tail(out, 800)}")
        else:
            log.append("(empty model patch)")
        test_ok, out = await apply_test_patch(sb, instance, f"{GRADE_DIR}/test.patch")
        log.append(f"$ reset test files; git apply test.patch\n{out}")
        if not test_ok:
            return result(resolved=False, applied=True, reason=f"test patch does not apply: {_tail(out, 800)}")
        results, timed_out, out = await run_tests(sb, ids, timeout=timeout_s, per_test_timeout=per_test_timeout_s)
        log.append(f"$ unittest_runner ({len(ids)} tests)\n{out}")
    f2p = {t: results[t][0] for t in instance.FAIL_TO_PASS}
    p2p = {t: results[t][0] for t in instance.PASS_TO_PASS}
    details = {t: _tail(d, 1500) for t, (s, d) in results.items() if s != PASS}
    problems = []
    if any(s != PASS for s in f2p.values()):
        problems.append(f"FAIL_TO_PASS not passing: {_summarise(f2p)}")
    if any(s != PASS for s in p2p.values()):
        problems.append(f"PASS_TO_PASS broken: {_summarise(p2p)}")
    if timed_out:
        problems.append(f"the test run timed out after {timeout_s:g}s")
    return result(
        resolved=not problems,
        applied=True,
        reason="resolved" if not problems else "; ".join(problems),
        fail_to_pass=f2p,
        pass_to_pass=p2p,
        details=details,
        timed_out=timed_out,
    )
