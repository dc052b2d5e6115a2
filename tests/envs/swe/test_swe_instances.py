"""SWE instances, the shipped suite's files and the repository store's single-commit exports (no sandbox needed)."""

import json
import subprocess
import tarfile

import pytest

from agentrl.envs.swe.instances import InstanceError, load_instances, parse_lines
from agentrl.envs.swe.repos import SUITE_INSTANCES, SUITE_REPOS, RepoError, RepoStore, build_git_repo, git, patch_paths

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
        ("[" * 100_000, ["x.jsonl:2", "invalid JSON"]),  # json.loads: RecursionError, not JSONDecodeError
        ('{"n": ' + "9" * 5000 + "}", ["x.jsonl:2", "invalid JSON"]),  # ValueError: too many digits
        (json.dumps([1, 2]), ["x.jsonl:2", "JSON object"]),
        (json.dumps({k: v for k, v in GOOD.items() if k != "test_patch"}), ["x.jsonl:2", "'test_patch'"]),
        (json.dumps(dict(GOOD, instance_id="b", patch=3)), ["x.jsonl:2", "'patch'", "string"]),
        (json.dumps(dict(GOOD, instance_id="b", FAIL_TO_PASS=5)), ["x.jsonl:2", "'FAIL_TO_PASS'", "list"]),
        (json.dumps(dict(GOOD, instance_id="b", FAIL_TO_PASS="[oops")), ["x.jsonl:2", "'FAIL_TO_PASS'", "JSON"]),
        (json.dumps(dict(GOOD, instance_id="b", FAIL_TO_PASS="[" * 100_000)), ["x.jsonl:2", "'FAIL_TO_PASS'", "JSON"]),
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


MARKER = "FUTURE_FIX_MARKER_6d1f"


def _history_repo(path):
    """A clone-like repository: the base commit, then a later commit holding the fix (with a unique marker), a
    branch, a tag, a stash-like dangling commit and packed refs."""
    path.mkdir(parents=True)
    git("init", "-q", cwd=path)
    (path / "m.py").write_text("def f():\n    return 1\n")
    env = ["-c", "user.name=t", "-c", "user.email=t@t"]
    git(*env, "add", "-A", cwd=path)
    git(*env, "commit", "-qm", "base", cwd=path)
    base = git("rev-parse", "HEAD", cwd=path).strip()
    (path / "m.py").write_text(f"def f():\n    return 2  # {MARKER}\n")
    git(*env, "commit", "-qam", f"fix {MARKER}", cwd=path)
    future = git("rev-parse", "HEAD", cwd=path).strip()
    git("branch", "fix-branch", cwd=path)
    git("tag", "v2", cwd=path)
    (path / "m.py").write_text(f"# dangling {MARKER}\n")
    git(*env, "commit", "-qam", "dangling", cwd=path)
    git("reset", "-q", "--hard", "HEAD~1", cwd=path)  # the dangling commit stays in objects and the reflog
    git("pack-refs", "--all", cwd=path)
    return base, future


def _assert_only_base(work, base, future):
    """Nothing after ``base`` is reachable or even present in the export."""
    assert git("rev-parse", "HEAD", cwd=work).strip() == base
    assert git("log", "--all", "--format=%H", cwd=work).split() == [base]
    assert git("reflog", "--all", cwd=work).strip() in ("", f"{base[:7]} refs/heads/main@{{0}}: ")
    assert not (work / ".git" / "packed-refs").exists() and not (work / ".git" / "logs").exists()
    assert git("for-each-ref", cwd=work).split() == [base, "commit", "refs/heads/main"]
    fsck = subprocess.run(["git", "fsck", "--lost-found", "--no-progress"], cwd=work, capture_output=True, text=True)
    assert "dangling" not in fsck.stdout + fsck.stderr and not (work / ".git" / "lost-found").exists()
    objects = git("cat-file", "--batch-all-objects", "--batch-check", cwd=work).split("\n")
    assert len([o for o in objects if o.strip()]) == 3  # the commit, its tree, one blob
    everything = subprocess.run(["git", "cat-file", "--batch-all-objects", "--batch"], cwd=work, capture_output=True)
    assert MARKER.encode() not in everything.stdout and future.encode() not in everything.stdout
    assert subprocess.run(["git", "cat-file", "-e", future], cwd=work).returncode != 0
    assert "return 1" in (work / "m.py").read_text()


@pytest.mark.parametrize("form", ["clone", "bare", "bundle", "tarball"])
def test_export_holds_only_base_commit_whatever_the_source(tmp_path, form):
    """Full ids and abbreviated ids, from every source form: a fresh single-commit repository, no future commit."""
    repos = tmp_path / "repos"
    src = tmp_path / "src" / "clone"
    base, future = _history_repo(src)
    if form == "clone":
        repos.mkdir()
        git("clone", "-q", str(src), str(repos / "o__p"), cwd=tmp_path)  # origin refs, remote branches, tags
    elif form == "bare":
        repos.mkdir()
        git("clone", "-q", "--mirror", str(src), str(repos / "o__p"), cwd=tmp_path)
    elif form == "bundle":
        repos.mkdir()
        git("bundle", "create", str(repos / "o__p.bundle"), "--all", cwd=src)
    else:
        repos.mkdir()
        with tarfile.open(repos / "o__p.tar.gz", "w:gz") as tar:
            tar.add(str(src), arcname="p")
    store = RepoStore(repos, tmp_path / "cache")
    for commit in (base, base[:7]):
        exp = store.export("o/p", commit)
        assert exp.commit == base
        _assert_only_base(exp.path, base, future)
    assert store.checkout("o/p", base) == exp.path  # cached
    with pytest.raises(RepoError, match="not a commit"):
        store.export("o/p", "f" * 40)


def test_export_of_plain_files_and_errors(tmp_path):
    src = tmp_path / "repos" / "owner__proj"
    src.mkdir(parents=True)
    (src / "f.txt").write_text("v1\n")
    store = RepoStore(tmp_path / "repos", tmp_path / "cache")
    commit = build_git_repo(src, tmp_path / "probe")
    exp = store.export("owner/proj", commit[:10])
    assert exp.commit == commit and (exp.path / "f.txt").read_text() == "v1\n"
    assert git("rev-list", "--all", "--count", cwd=exp.path).strip() == "1"
    with pytest.raises(RepoError, match="build commit"):
        store.export("owner/proj", "0" * 40)
    with pytest.raises(RepoError, match="not found"):
        store.export("owner/absent", commit)
    with pytest.raises(RepoError, match="invalid base_commit"):
        store.export("owner/proj", "--upload-pack=evil")
    # a tarball of plain files (an sdist, say): built like a directory
    with tarfile.open(tmp_path / "repos" / "other__tar.tgz", "w:gz") as tar:
        tar.add(str(src), arcname="tar-1.0")
    assert store.export("other/tar", commit).commit == commit


def test_repos_are_keyed_by_full_name(tmp_path):
    """owner1/utils and owner2/utils never share one directory; the bare name serves one owner only."""
    repos = tmp_path / "repos"
    for owner, text in (("owner1", "one"), ("owner2", "two")):
        (repos / f"{owner}__utils").mkdir(parents=True)
        (repos / f"{owner}__utils" / "u.py").write_text(text)
    store = RepoStore(repos, tmp_path / "cache")
    c1 = build_git_repo(repos / "owner1__utils", tmp_path / "p1")
    c2 = build_git_repo(repos / "owner2__utils", tmp_path / "p2")
    assert (store.checkout("owner1/utils", c1) / "u.py").read_text() == "one"
    assert (store.checkout("owner2/utils", c2) / "u.py").read_text() == "two"
    (repos / "utils").mkdir()
    (repos / "utils" / "u.py").write_text("bare")
    c3 = build_git_repo(repos / "utils", tmp_path / "p3")
    assert (store.checkout("owner3/utils", c3) / "u.py").read_text() == "bare"
    with pytest.raises(RepoError, match="also used for 'owner3/utils'"):
        store.checkout("owner4/utils", c3)


def test_patch_paths():
    p = "diff --git a/x/y.py b/x/y.py\n--- a/x/y.py\n+++ b/x/y.py\ndiff --git a/old.py b/new.py\n"
    assert patch_paths(p) == ["x/y.py", "old.py", "new.py"]
