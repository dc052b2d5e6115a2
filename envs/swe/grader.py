"""Grading a patch against an SWE instance, in a fresh sandbox, from the patch alone.

Steps (SWE-bench's harness, offline, hardened against reward hacking):

1. a fresh sandbox of the instance's image (:mod:`agentrl.envs.swe.images`); the repository at ``base_commit`` is
   copied into its work dir from the image (a single-commit repository: no later history exists in it);
2. the model patch is applied with ``git apply`` (an unresolved result with git's message if it does not apply);
3. *protected* paths are restored to ``base_commit`` (deleted when they did not exist there): the files the test
   patch touches, the files of the graded tests, and whatever the model patch touched among test files
   (``tests/``-style directories, ``test_*.py``), pytest/Python start-up hooks (``conftest.py``,
   ``sitecustomize.py``, ``usercustomize.py``, ``*.pth``) and test configuration (``pytest.ini``, ``tox.ini``,
   ``setup.cfg``, ``pyproject.toml``). Symlinked parents are removed first. The model's changes to them are
   listed in :attr:`GradeResult.protected_touched`;
4. the test patch is applied, and every ``FAIL_TO_PASS`` and ``PASS_TO_PASS`` id runs with the instance's runner
   (:mod:`agentrl.envs.swe.runners`; nonce-framed output, graded files hashed and re-checked) under a per-test and
   an overall timeout.

Resolved iff every ``FAIL_TO_PASS`` and every ``PASS_TO_PASS`` test passes (``xfail`` counts as a pass only when
the test itself declares it, as in swebench). Infrastructure failures (the sandbox cannot start, the engine dies,
an image cannot be built) raise; a bad patch never raises, it gives ``resolved=False`` with the reason.
"""

from __future__ import annotations

import asyncio
import shlex
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any, Callable

from .images import ImageBuilder, Runtime, materialize
from .instances import SWEInstance
from .repos import RepoStore, patch_paths
from . import runners

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
PROTECTED_NAMES = {"conftest.py", "sitecustomize.py", "usercustomize.py", "pytest.ini", ".pytest.ini", "tox.ini",
                   "setup.cfg", "pyproject.toml"}
TEST_DIRS = {"tests", "test", "testing"}

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
    from agentrl.sandboxes.bwrap import BwrapSandbox

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
    ``fail_to_pass`` / ``pass_to_pass``: test id -> status (``pass``, ``xfail``, ``fail``, ``error``, ``skip``,
    ``timeout``, ``missing``, ``not_run``); empty when the tests never ran. ``details``: test id -> the failure text
    of the tests that did not pass. ``protected_touched``: paths the model patch changed that grading restored
    (test files, start-up hooks, test configuration). ``conflicts``: ids whose test log contradicted the runner.
    ``duration``: seconds from the call to the verdict. ``log``: the tail of git's and the runner's output.
    """

    instance_id: str
    resolved: bool
    applied: bool
    reason: str
    fail_to_pass: dict[str, str] = field(default_factory=dict)
    pass_to_pass: dict[str, str] = field(default_factory=dict)
    details: dict[str, str] = field(default_factory=dict)
    protected_touched: list[str] = field(default_factory=list)
    conflicts: list[str] = field(default_factory=list)
    runner: str = ""
    duration: float = 0.0
    timed_out: bool = False
    log: str = ""

    @property
    def fail_to_pass_fraction(self) -> float:
        """Fraction of FAIL_TO_PASS tests that passed (0.0 when the tests did not run)."""
        if not self.fail_to_pass:
            return 0.0
        return sum(s in runners.PASSING for s in self.fail_to_pass.values()) / len(self.fail_to_pass)

    @property
    def pass_to_pass_ok(self) -> bool:
        return bool(self.fail_to_pass) and all(s in runners.PASSING for s in self.pass_to_pass.values())

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["fail_to_pass_fraction"] = self.fail_to_pass_fraction
        return d


def _tail(text: str, n: int = 2000) -> str:
    return text if len(text) <= n else "..." + text[-n:]


def _summarise(statuses: dict[str, str], limit: int = 5) -> str:
    bad = [f"{t} ({s})" for t, s in statuses.items() if s not in runners.PASSING]
    more = f" and {len(bad) - limit} more" if len(bad) > limit else ""
    return ", ".join(bad[:limit]) + more


APPLIED = "@@agentrl:applied"


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


def is_protected(path: str) -> bool:
    """Whether a model patch's change to ``path`` is reverted before grading (see the module doc)."""
    p = PurePosixPath(path)
    name = p.name
    if name in PROTECTED_NAMES or name.endswith(".pth"):
        return True
    if any(part in TEST_DIRS for part in p.parts[:-1]):
        return True
    return name.endswith(".py") and (name.startswith("test_") or name.endswith("_test.py"))


def protected_paths(instance: SWEInstance, model_patch: str, graded_files: list[str]) -> tuple[list[str], list[str]]:
    """Returns ``(paths to restore, the model patch's paths among them)``."""
    touched = [p for p in patch_paths(model_patch) if is_protected(p)]
    restore = list(dict.fromkeys([*patch_paths(instance.test_patch), *graded_files, *touched]))
    return restore, touched


def reset_script(base_commit: str, paths: list[str]) -> str:
    """Shell lines that restore every path of ``paths`` to its ``base_commit`` state (or delete it if it did not
    exist then). A symlink standing where a parent directory of the path should be is removed first (git refuses
    to write beyond a symbolic link, and it would point the restored file elsewhere)."""
    lines = []
    c = shlex.quote(base_commit)
    for p in paths:
        q = shlex.quote(p)
        parts = PurePosixPath(p).parts
        for i in range(1, len(parts)):
            a = shlex.quote("/".join(parts[:i]))
            lines.append(f"if [ -L {a} ]; then rm -f -- {a}; fi")
        lines.append(f"rm -rf -- {q}")
        lines.append(f"if git cat-file -e {shlex.quote(base_commit + ':' + p)} 2>/dev/null; "
                     f"then git checkout -q {c} -- {q} || exit 3; fi")
    return "\n".join(lines)


async def restore_and_apply_tests(sb: Any, base_commit: str, paths: list[str], test_patch_file: str, *,
                                  timeout: float = 60.0) -> tuple[bool, str]:
    """Restores ``paths`` (:func:`reset_script`) and applies the test patch file, in one exec. Returns
    ``(ok, output)``."""
    script = f"( {reset_script(base_commit, paths) or 'true'}\n) || {{ echo 'cannot restore the test files'; exit 3; }}\n"
    res = await sb.exec(script + _apply_script(test_patch_file), timeout=timeout, env=SANDBOX_ENV)
    return (not res.timed_out and APPLIED in res.output), res.output.replace(APPLIED, "").strip()


async def run_tests(sb: Any, runtime: Runtime, test_ids: list[str], nonce: str, *, timeout: float,
                    per_test_timeout: float) -> tuple[dict[str, tuple[str, str]], bool, str, list[str]]:
    """Runs ``test_ids`` with the instance's runner (staged in :data:`GRADE_DIR` with ``nonce`` by
    :func:`agentrl.envs.swe.runners.stage`) from the repository root. Returns ``({id: (status, detail)}, timed_out,
    output, conflicts)``. Ids without a result get ``timeout`` when the overall timeout fired, else ``not_run``
    (the runner died)."""
    spec = runtime.env_spec
    cmd = runners.command(runtime.runner, GRADE_DIR, runtime.python, per_test_timeout=per_test_timeout,
                          pythonpath=spec.pythonpath, pytest_args=spec.pytest_args)
    env = {**SANDBOX_ENV, **runtime.env}
    res = await sb.exec(cmd, timeout=timeout, env=env, output_limit=64 << 20)
    run = runners.parse(runtime.runner, res.output, test_ids, nonce, log_parser=spec.log_parser)
    results = dict(run.statuses)
    missing = "timeout" if res.timed_out else "not_run"
    for t in test_ids:
        if t not in results:
            why = "the overall test timeout fired first" if res.timed_out else f"the runner stopped: {_tail(res.output, 500)}"
            results[t] = (missing, why)
    return results, res.timed_out, res.output, run.conflicts


async def grade(
    instance: SWEInstance,
    model_patch: str,
    *,
    spec: Any = None,
    repo_store: RepoStore | None = None,
    images: ImageBuilder | None = None,
    sandbox_factory: SandboxFactory | None = None,
    timeout_s: float = 600.0,
    per_test_timeout_s: float = 60.0,
) -> GradeResult:
    """Grades ``model_patch`` for ``instance`` in a fresh sandbox (see the module doc); returns a GradeResult.

    ``images`` prepares the instance's image (default: one over ``spec``, ``repo_store`` and no env specs);
    ``spec`` is the base ``SandboxSpec`` (default :func:`default_spec`), ``repo_store`` finds the repository
    (default: the shipped suite), ``sandbox_factory`` gives the sandbox (see :data:`SandboxFactory`; e.g.
    ``pool.acquire``), ``timeout_s`` bounds the test run, ``per_test_timeout_s`` each test. The sandbox is always
    released. Raises ``SandboxError`` on infrastructure failures, ``RepoError``/``ImageError``/``EnvSpecError``
    when the instance's image cannot be prepared.
    """
    t0 = time.monotonic()
    if images is None:
        images = ImageBuilder(spec if spec is not None else default_spec(), repo_store or RepoStore())
    runtime = await asyncio.to_thread(images.prepare, instance)
    log: list[str] = []

    def result(**kw: Any) -> GradeResult:
        return GradeResult(instance_id=instance.instance_id, runner=runtime.runner, duration=time.monotonic() - t0,
                           log=_tail("\n".join(log), 4000), **kw)

    ids = list(dict.fromkeys(instance.FAIL_TO_PASS + instance.PASS_TO_PASS))
    graded = runners.test_files(ids, images.repo_store.checkout(instance.repo, instance.base_commit), runtime.runner)
    restore, touched = protected_paths(instance, model_patch, graded)
    guard = list(dict.fromkeys([*graded, *patch_paths(instance.test_patch)]))
    nonce = runners.new_nonce()
    files = runners.stage(runtime.runner, ids, guard, nonce, runtime.env_spec.test_cmd)
    files.update({"model.patch": _patch_text(model_patch), "test.patch": _patch_text(instance.test_patch)})
    async with (sandbox_factory or make_sandbox)(runtime.sandbox) as sb:
        await materialize(sb, runtime)
        await stage_files(sb, files)
        if model_patch.strip():
            applied, out = await apply_patch(sb, f"{GRADE_DIR}/model.patch")
            log.append(f"$ git apply model.patch\n{out}")
            if not applied:
                return result(resolved=False, applied=False, reason=f"patch does not apply: {_tail(out, 800)}",
                              protected_touched=touched)
        else:
            log.append("(empty model patch)")
        test_ok, out = await restore_and_apply_tests(sb, runtime.base_commit, restore, f"{GRADE_DIR}/test.patch")
        log.append(f"$ restore {len(restore)} protected path(s); git apply test.patch\n{out}")
        if not test_ok:
            return result(resolved=False, applied=True, reason=f"test patch does not apply: {_tail(out, 800)}",
                          protected_touched=touched)
        results, timed_out, out, conflicts = await run_tests(sb, runtime, ids, nonce, timeout=timeout_s,
                                                             per_test_timeout=per_test_timeout_s)
        log.append(f"$ {runtime.runner} runner ({len(ids)} tests)\n{out}")
    f2p = {t: results[t][0] for t in instance.FAIL_TO_PASS}
    p2p = {t: results[t][0] for t in instance.PASS_TO_PASS}
    details = {t: _tail(d, 1500) for t, (s, d) in results.items() if s not in runners.PASSING}
    problems = []
    if any(s not in runners.PASSING for s in f2p.values()):
        problems.append(f"FAIL_TO_PASS not passing: {_summarise(f2p)}")
    if any(s not in runners.PASSING for s in p2p.values()):
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
        protected_touched=touched,
        conflicts=conflicts,
        timed_out=timed_out,
    )
