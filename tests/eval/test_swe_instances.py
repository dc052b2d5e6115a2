"""SWE instances, the shipped suite's files and the test runner (no sandbox needed)."""

import json
import shutil
import subprocess
import sys

import pytest

from agentrl.envs.swe.instances import InstanceError, load_instances, parse_lines
from agentrl.envs.swe.repos import SUITE_INSTANCES, SUITE_REPOS, RepoError, RepoStore, build_git_repo, git, patch_paths
from agentrl.envs.swe.grader import RUNNER_PATH

GOOD = {
    "instance_id": "o__r-1", "repo": "o/r", "base_commit": "abc", "patch": "", "test_patch": "",
    "problem_statement": "p", "FAIL_TO_PASS": ["tests.test_a.T.test_x"], "PASS_TO_PASS": [],
}


def _lines(*objs):
    return [json.dumps(o) if isinstance(o, dict) else o for o in objs]


def test_suite_loads_and_has_twelve_repos():
    insts = load_instances(SUITE_INSTANCES)
    assert len(insts) >= 12
    assert len({i.repo for i in insts}) >= 12
    for i in insts:
        assert i.FAIL_TO_PASS and i.patch.startswith("diff --git") and i.test_patch.startswith("diff --git")
        assert not set(i.FAIL_TO_PASS) & set(i.PASS_TO_PASS)
        # gold patches never touch tests, test patches only touch tests
        assert all(not p.startswith("tests/") for p in patch_paths(i.patch))
        assert all(p.startswith("tests/") for p in patch_paths(i.test_patch))


def test_json_string_test_lists_and_extra_fields():
    obj = dict(GOOD, FAIL_TO_PASS=json.dumps(["a.b"]), PASS_TO_PASS="[]", version="1.0")
    (i,) = parse_lines(_lines(obj), "x.jsonl")
    assert i.FAIL_TO_PASS == ("a.b",) and i.PASS_TO_PASS == () and i.extra == {"version": "1.0"}
    assert i.to_dict()["FAIL_TO_PASS"] == ["a.b"] and i.to_dict()["version"] == "1.0"


@pytest.mark.parametrize(
    "bad, words",
    [
        ("{not json", ["x.jsonl:2", "invalid JSON"]),
        (json.dumps([1, 2]), ["x.jsonl:2", "JSON object"]),
        (json.dumps({k: v for k, v in GOOD.items() if k != "test_patch"}), ["x.jsonl:2", "'test_patch'"]),
        (json.dumps(dict(GOOD, instance_id="b", patch=3)), ["x.jsonl:2", "'patch'", "string"]),
        (json.dumps(dict(GOOD, instance_id="b", FAIL_TO_PASS=5)), ["x.jsonl:2", "'FAIL_TO_PASS'", "list"]),
        (json.dumps(dict(GOOD, instance_id="b", FAIL_TO_PASS="[oops")), ["x.jsonl:2", "'FAIL_TO_PASS'", "JSON"]),
        (json.dumps(dict(GOOD, instance_id="b", PASS_TO_PASS=["ok", ""])), ["x.jsonl:2", "'PASS_TO_PASS'[1]"]),
        (json.dumps(dict(GOOD, instance_id="b", FAIL_TO_PASS=[])), ["x.jsonl:2", "'FAIL_TO_PASS'", "at least one"]),
        (json.dumps(dict(GOOD, instance_id="b", repo=" ")), ["x.jsonl:2", "'repo'", "empty"]),
        (json.dumps(GOOD), ["x.jsonl:2", "duplicate", "line 1"]),
    ],
)
def test_malformed_line_names_line_and_field(bad, words):
    with pytest.raises(InstanceError) as e:
        parse_lines(_lines(GOOD, bad), "x.jsonl")
    for w in words:
        assert w in str(e.value)


def test_load_selects_ids_and_rejects_unknown(tmp_path):
    f = tmp_path / "i.jsonl"
    f.write_text("\n".join(_lines(GOOD, dict(GOOD, instance_id="two"))) + "\n\n")
    assert [i.instance_id for i in load_instances(f, ["two"])] == ["two"]
    with pytest.raises(InstanceError, match="unknown instance id"):
        load_instances(f, ["nope"])
    with pytest.raises(InstanceError, match="cannot read"):
        load_instances(tmp_path / "missing.jsonl")


def test_suite_repos_build_their_base_commits(tmp_path):
    """The plain-file repos build exactly the commits the instances name, whatever the file modes on disk."""
    for i, inst in enumerate(load_instances(SUITE_INSTANCES)):
        name = inst.repo.split("/")[-1]
        assert build_git_repo(SUITE_REPOS / name, tmp_path / f"r{i}") == inst.base_commit


def test_build_is_deterministic_and_mode_independent(tmp_path):
    src = tmp_path / "src"
    (src / "pkg").mkdir(parents=True)
    (src / "pkg" / "a.py").write_text("x = 1\n")
    a = build_git_repo(src, tmp_path / "a")
    (src / "pkg" / "a.py").chmod(0o755)
    (src / "pkg" / "__pycache__").mkdir()
    (src / "pkg" / "__pycache__" / "a.cpython-311.pyc").write_bytes(b"junk")
    assert build_git_repo(src, tmp_path / "b") == a
    (src / "pkg" / "a.py").write_text("x = 2\n")
    assert build_git_repo(src, tmp_path / "c") != a


def test_repo_store_checkout_sources(tmp_path):
    src = tmp_path / "repos" / "owner__proj"
    (src).mkdir(parents=True)
    (src / "f.txt").write_text("v1\n")
    repos = tmp_path / "repos"
    store = RepoStore(repos, tmp_path / "cache")
    # plain files: only the commit they build is accepted
    commit = build_git_repo(src, tmp_path / "probe")
    work = store.checkout("owner/proj", commit)
    assert (work / "f.txt").read_text() == "v1\n" and git("rev-parse", "HEAD", cwd=work).strip() == commit
    assert store.checkout("owner/proj", commit) == work  # cached
    with pytest.raises(RepoError, match="build commit"):
        store.checkout("owner/proj", "0" * 40)
    # a git repo with history: an older commit is checked out
    g = repos / "other"
    build_git_repo(src, g)
    (g / "f.txt").write_text("v2\n")
    git("add", "-A", cwd=g)
    git("-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "two", cwd=g)
    old = git("rev-parse", "HEAD~1", cwd=g).strip()
    assert (store.checkout("x/other", old) / "f.txt").read_text() == "v1\n"
    shallow = store.checkout("x/other", git("rev-parse", "HEAD", cwd=g).strip())
    assert (shallow / "f.txt").read_text() == "v2\n"
    assert git("rev-list", "--count", "HEAD", cwd=shallow).strip() == "1"  # the history is not copied
    with pytest.raises(RepoError, match="cannot be checked out"):
        store.checkout("x/other", "f" * 40)
    # a bundle
    git("bundle", "create", str(repos / "bund.bundle"), "--all", cwd=g)
    assert (store.checkout("x/bund", old) / "f.txt").read_text() == "v1\n"
    with pytest.raises(RepoError, match="not found"):
        store.checkout("x/absent", old)


def test_patch_paths():
    p = "diff --git a/x/y.py b/x/y.py\n--- a/x/y.py\n+++ b/x/y.py\ndiff --git a/old.py b/new.py\n"
    assert patch_paths(p) == ["x/y.py", "old.py", "new.py"]


def test_runner_statuses(tmp_path):
    """The in-sandbox runner, run here with the host's python: every status it can give."""
    (tmp_path / "tests").mkdir()
    (tmp_path / "tests" / "__init__.py").write_text("")
    (tmp_path / "tests" / "test_m.py").write_text(
        "import time, unittest\n"
        "class T(unittest.TestCase):\n"
        "    def test_ok(self): print('noise')\n"
        "    def test_fail(self): self.assertEqual(1, 2)\n"
        "    def test_err(self): raise KeyError('k')\n"
        "    @unittest.skip('why')\n"
        "    def test_skip(self): pass\n"
        "    def test_loop(self):\n"
        "        try:\n"
        "            while True: pass\n"
        "        except Exception: pass\n"
        "    def test_sleep(self): time.sleep(30)\n"
    )
    (tmp_path / "tests" / "test_broken.py").write_text("import nonexistent_module_xyz\n")
    ids = ["tests.test_m.T.test_ok", "tests.test_m.T.test_fail", "tests.test_m.T.test_err", "tests.test_m.T.test_skip",
           "tests.test_m.T.test_loop", "tests.test_m.T.test_sleep", "tests.test_m.T.test_absent", "tests.test_gone.T.test_x",
           "tests.test_broken.T.test_x"]
    out = tmp_path / "r.jsonl"
    proc = subprocess.run([sys.executable, str(RUNNER_PATH), "--out", str(out), "--per-test-timeout", "0.5", *ids],
                          cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert "noise" not in proc.stdout
    got = [json.loads(line) for line in out.read_text().splitlines()]
    assert [r["id"] for r in got] == ids
    assert [r["status"] for r in got] == ["pass", "fail", "error", "skip", "timeout", "timeout", "missing", "missing", "error"]
    listed = subprocess.run([sys.executable, str(RUNNER_PATH), "--list"], cwd=tmp_path, capture_output=True, text=True)
    assert "tests.test_m.T.test_fail" in listed.stdout.split()


def test_authoring_measures_fail_to_pass_and_pass_to_pass(tmp_path):
    from agentrl.envs.swe.authoring import make_instance
    from agentrl.envs.swe.instances import parse_instance

    base = tmp_path / "base"
    (base / "m").mkdir(parents=True)
    (base / "tests").mkdir()
    (base / "m" / "__init__.py").write_text("def double(x):\n    return x + x if x > 0 else x\n")
    (base / "tests" / "__init__.py").write_text("")
    (base / "tests" / "test_m.py").write_text(
        "import unittest\nfrom m import double\n\nclass T(unittest.TestCase):\n"
        "    def test_pos(self):\n        self.assertEqual(double(2), 4)\n")
    fixed = tmp_path / "fixed"
    shutil.copytree(base, fixed)
    (fixed / "m" / "__init__.py").write_text("def double(x):\n    return x + x\n")
    (fixed / "tests" / "test_neg.py").write_text(
        "import unittest\nfrom m import double\n\nclass N(unittest.TestCase):\n"
        "    def test_neg(self):\n        self.assertEqual(double(-2), -4)\n"
        "    def test_zero(self):\n        self.assertEqual(double(0), 0)\n")
    inst = parse_instance(make_instance("dbl", base, fixed, "double() is wrong for negatives"))
    assert inst.FAIL_TO_PASS == ("tests.test_neg.N.test_neg",)
    assert set(inst.PASS_TO_PASS) == {"tests.test_m.T.test_pos", "tests.test_neg.N.test_zero"}
    assert inst.base_commit == build_git_repo(base, tmp_path / "probe")
    assert patch_paths(inst.patch) == ["m/__init__.py"] and patch_paths(inst.test_patch) == ["tests/test_neg.py"]
