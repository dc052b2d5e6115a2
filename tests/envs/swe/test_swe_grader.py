"""The SWE grader against real docker sandboxes, on crafted patches for suite instances."""

import asyncio
import shutil

import pytest

from agentrl.envs.swe.grader import grade
from agentrl.envs.swe.instances import load_instances
from agentrl.envs.swe.repos import SUITE_INSTANCES, RepoStore, git, patch_paths

pytestmark = pytest.mark.docker

BY_ID = {i.instance_id: i for i in load_instances(SUITE_INSTANCES)}
STATS = BY_ID["agentrl-suite__statsmini-1"]
LEDGER = BY_ID["agentrl-suite__ledger-1"]
INTERVALS = BY_ID["agentrl-suite__intervals-1"]


@pytest.fixture(scope="module", autouse=True)
def docker_ready():
    """Fails (never skips) without a docker engine and the base image: these tests exist to run for real."""
    from agentrl.sandboxes.docker import docker_available, docker_client

    ok, why = docker_available()
    assert ok, f"docker is required for the SWE grader tests: {why}"
    try:
        docker_client().images.get("agentrl-base:latest")
    except Exception as e:
        pytest.fail(f"image agentrl-base:latest missing (run `agentrl sandboxes build-image`): {e}")


def make_patch(tmp_path, inst, *, gold=True, edits=None, deletes=()):
    """A diff against the instance's base commit: the gold patch (optionally), then whole-file edits and deletions."""
    work = tmp_path / "work"
    shutil.copytree(RepoStore().checkout(inst.repo, inst.base_commit), work)
    if gold:
        (tmp_path / "gold.patch").write_text(inst.patch)
        git("apply", str(tmp_path / "gold.patch"), cwd=work)
    for path, fn in (edits or {}).items():
        (work / path).write_text(fn((work / path).read_text()))
    for path in deletes:
        (work / path).unlink()
    git("add", "-A", cwd=work)
    return git("diff", "--cached", inst.base_commit, cwd=work)


async def test_gold_resolves_and_empty_does_not():
    gold, empty = await asyncio.gather(grade(STATS, STATS.patch), grade(STATS, ""))
    assert gold.resolved and gold.applied and gold.reason == "resolved"
    assert set(gold.fail_to_pass.values()) == {"pass"} and set(gold.pass_to_pass.values()) == {"pass"}
    assert gold.fail_to_pass_fraction == 1.0 and gold.duration > 0
    assert not empty.resolved and empty.applied
    assert set(empty.fail_to_pass.values()) == {"fail"} and set(empty.pass_to_pass.values()) == {"pass"}, (empty.reason, empty.log)
    assert empty.reason.startswith("FAIL_TO_PASS not passing") and "test_median_even (fail)" in empty.reason
    assert "AssertionError" in empty.details[STATS.FAIL_TO_PASS[0]]


async def test_patch_that_does_not_apply():
    drifted = STATS.patch.replace("    values = sorted(_check(values))", "    values = sorted(_check(values)) ")
    garbage = "this is not a patch\n"
    a, b = await asyncio.gather(grade(STATS, drifted), grade(STATS, garbage))
    for r in (a, b):
        assert not r.resolved and not r.applied
        assert r.reason.startswith("patch does not apply")
        assert r.fail_to_pass == {} and r.pass_to_pass == {}
    assert "describe.py" in a.reason


async def test_tests_time_out(tmp_path):
    hang = make_patch(tmp_path, STATS, edits={
        "statsmini/describe.py": lambda s: s.replace("    mid = len(values) // 2\n", "    mid = len(values) // 2\n    while len(values) % 2 == 0:\n        pass\n"),
    })
    per_test, overall = await asyncio.gather(
        grade(STATS, hang, per_test_timeout_s=1.5),
        grade(STATS, hang, per_test_timeout_s=120, timeout_s=4),
    )
    assert not per_test.resolved and not per_test.timed_out
    assert per_test.fail_to_pass["tests.test_describe.TestDescribe.test_median_even"] == "timeout"
    assert set(per_test.pass_to_pass.values()) == {"pass"}  # the other tests still ran
    assert not overall.resolved and overall.timed_out
    assert "timed out after 4s" in overall.reason
    assert "timeout" in overall.fail_to_pass.values()
    assert overall.duration < 60


async def test_test_files_deleted_or_edited_by_the_patch_are_restored(tmp_path):
    # tests/test_account.py holds PASS_TO_PASS tests and the test patch does not touch it: restored all the same,
    # as is tests/test_bank.py (touched by the test patch); the gold fix still resolves, the edits are reported.
    gone = make_patch(tmp_path / "a", LEDGER, deletes=["tests/test_account.py"])
    restored = make_patch(tmp_path / "b", LEDGER, deletes=["tests/test_bank.py"])
    # without the fix, making the graded tests trivial does not help: they are restored
    trivial = make_patch(tmp_path / "c", LEDGER, gold=False, edits={
        "tests/test_bank.py": lambda s: s.replace("def test_", "def _off_").replace("class ", "class _Off") + "\n",
    })
    a, b, c = await asyncio.gather(grade(LEDGER, gone), grade(LEDGER, restored), grade(LEDGER, trivial))
    assert a.resolved and a.protected_touched == ["tests/test_account.py"], a.reason
    assert b.resolved and b.protected_touched == ["tests/test_bank.py"], b.reason
    assert not c.resolved and c.protected_touched == ["tests/test_bank.py"]
    assert set(c.fail_to_pass.values()) == {"fail"}, c.reason


async def test_pass_to_pass_broken(tmp_path):
    broken = make_patch(tmp_path, STATS, edits={
        "statsmini/describe.py": lambda s: s.replace("return sum(values) / len(values)", "return sum(values) // len(values)"),
    })
    r = await grade(STATS, broken)
    assert not r.resolved and r.applied
    assert set(r.fail_to_pass.values()) == {"pass"}
    assert r.pass_to_pass["tests.test_describe.TestDescribe.test_mean"] == "fail"
    assert r.reason.startswith("PASS_TO_PASS broken") and "test_mean (fail)" in r.reason


async def test_partial_fix_fraction(tmp_path):
    # sorting alone fixes 2 of the 4 FAIL_TO_PASS tests; touching intervals still are not merged
    partial = make_patch(tmp_path, INTERVALS, gold=False, edits={
        "intervals/core.py": lambda s: s.replace("for start, end in intervals:\n        if start > end", "for start, end in sorted(intervals):\n        if start > end"),
    })
    r = await grade(INTERVALS, partial)
    assert not r.resolved and r.fail_to_pass_fraction == 0.5 and r.pass_to_pass_ok


def test_no_grading_sandbox_left_behind():
    from agentrl.sandboxes.base import LABEL_RUN, run_id
    from agentrl.sandboxes.docker import docker_client

    left = docker_client().containers.list(all=True, filters={"label": f"{LABEL_RUN}={run_id()}"})
    assert left == []


@pytest.mark.bwrap
async def test_bwrap_backend_grades_the_same():
    """The fallback backend, chosen by config: same verdicts as docker."""
    from agentrl.sandboxes import SandboxSpec, bwrap_available

    ok, why = bwrap_available()
    assert ok, f"bubblewrap is required: {why}"
    spec = SandboxSpec(backend="bwrap")
    gold, empty = await asyncio.gather(grade(STATS, STATS.patch, spec=spec), grade(STATS, "", spec=spec))
    assert gold.resolved and gold.reason == "resolved"
    assert not empty.resolved and set(empty.fail_to_pass.values()) == {"fail"}


@pytest.mark.bwrap
@pytest.mark.parametrize("backend", ["docker", "bwrap"])
async def test_grades_as_another_unprivileged_user(backend):
    """The sandbox user may be any unprivileged uid (not the image's 1000): the work dir is the user's, the image's
    /agentrl is only read."""
    from agentrl.sandboxes import SandboxSpec

    spec = SandboxSpec(backend=backend, user="4242:4242")
    gold, empty = await asyncio.gather(grade(STATS, STATS.patch, spec=spec), grade(STATS, "", spec=spec))
    assert gold.resolved, gold.log[-2000:]
    assert not empty.resolved and set(empty.fail_to_pass.values()) == {"fail"}


async def test_authoring_uses_the_real_base_commit_and_measures_tests_in_the_image(tmp_path):
    """Two commits of a repository (the fix and its new tests in the second): the instance starts at the first
    commit's own id (given abbreviated), and FAIL_TO_PASS/PASS_TO_PASS come from the grader's runs in the image."""
    from agentrl.envs.swe.authoring import make_instance
    from agentrl.envs.swe.envspec import EnvSpecs
    from agentrl.envs.swe.instances import parse_instance
    from agentrl.sandboxes import SandboxSpec

    repo = tmp_path / "repos" / "acme__dbl"
    (repo / "m").mkdir(parents=True)
    (repo / "tests").mkdir()
    (repo / "m" / "__init__.py").write_text("def double(x):\n    return x + x if x > 0 else x\n")
    (repo / "tests" / "__init__.py").write_text("")
    (repo / "tests" / "test_m.py").write_text(
        "import unittest\nfrom m import double\n\nclass T(unittest.TestCase):\n"
        "    def test_pos(self):\n        self.assertEqual(double(2), 4)\n")
    env = ["-c", "user.name=t", "-c", "user.email=t@t"]
    git("init", "-q", cwd=repo)
    git(*env, "add", "-A", cwd=repo)
    git(*env, "commit", "-qm", "base", cwd=repo)
    base = git("rev-parse", "HEAD", cwd=repo).strip()
    (repo / "m" / "__init__.py").write_text("def double(x):\n    return x + x\n")
    (repo / "tests" / "test_neg.py").write_text(
        "import unittest\nfrom m import double\n\nclass N(unittest.TestCase):\n"
        "    def test_neg(self):\n        self.assertEqual(double(-2), -4)\n"
        "    def test_zero(self):\n        self.assertEqual(double(0), 0)\n")
    git(*env, "add", "-A", cwd=repo)
    git(*env, "commit", "-qm", "fix", cwd=repo)
    data, broken = await make_instance(RepoStore(tmp_path / "repos", tmp_path / "cache"), "acme/dbl", base[:8], "HEAD",
                                       "double() is wrong for negatives", env_specs=EnvSpecs(),
                                       sandbox=SandboxSpec(backend="docker"))
    inst = parse_instance(data)
    assert inst.base_commit == base and broken == []
    assert inst.FAIL_TO_PASS == ("tests.test_neg.N.test_neg",) and inst.PASS_TO_PASS == ("tests.test_neg.N.test_zero",)
    assert patch_paths(inst.patch) == ["m/__init__.py"] and patch_paths(inst.test_patch) == ["tests/test_neg.py"]
