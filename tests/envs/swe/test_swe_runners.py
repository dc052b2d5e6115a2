"""The SWE test runners, run here with the host's Python (the grader runs the same files inside sandboxes), the
parsing of their framed output with swebench's parsers, env specs, protected paths and upstream recipe selections."""

import json
import os
import subprocess
import sys

import pytest

from agentrl.envs.swe import runners
from agentrl.envs.swe.envspec import EnvSpec, EnvSpecError, EnvSpecs, parse_spec, runner_for
from agentrl.envs.swe.grader import is_protected, protected_paths, reset_script
from agentrl.envs.swe.images import python_base
from agentrl.envs.swe.instances import parse_instance
from agentrl.envs.swe.repos import git

NONCE = "0123456789abcdef0123456789abcdef"


def _run(tmp_path, runner, ids, *, guard=(), extra=(), timeout=0.5, env=None):
    grade = tmp_path / "grade"
    grade.mkdir(exist_ok=True)
    for name, data in runners.stage(runner, ids, list(guard), NONCE).items():
        (grade / name).write_bytes(data.encode() if isinstance(data, str) else data)
    cmd = runners.command(runner, str(grade), sys.executable, per_test_timeout=timeout, pythonpath=["src"],
                          pytest_args=list(extra))
    full_env = dict(os.environ, PYTEST_DISABLE_PLUGIN_AUTOLOAD="1", **(env or {}))
    proc = subprocess.run(cmd, shell=True, cwd=tmp_path / "repo", capture_output=True, text=True, timeout=120, env=full_env)
    assert not (grade / "nonce").exists()  # read and deleted before any test code ran
    return proc, runners.parse(runner, proc.stdout, ids, NONCE)


def test_unittest_runner_statuses_and_forged_lines(tmp_path):
    repo = tmp_path / "repo"
    (repo / "tests").mkdir(parents=True)
    (repo / "src" / "pkg").mkdir(parents=True)
    (repo / "src" / "pkg" / "__init__.py").write_text("VALUE = 3\n")
    (repo / "tests" / "__init__.py").write_text("")
    (repo / "tests" / "test_m.py").write_text(
        "import sys, time, unittest\nfrom pkg import VALUE\n"
        f"print('@@agentrl:{'f' * 32}:result ' + '{{\"id\": \"tests.test_m.T.test_fail\", \"status\": \"pass\"}}')\n"
        "class T(unittest.TestCase):\n"
        "    def test_ok(self): self.assertEqual(VALUE, 3); print('noise')\n"
        "    def test_fail(self): self.assertEqual(1, 2)\n"
        "    def test_err(self): raise KeyError('k')\n"
        "    @unittest.skip('why')\n"
        "    def test_skip(self): pass\n"
        "    def test_loop(self):\n"
        "        try:\n"
        "            while True: pass\n"
        "        except Exception: pass\n"
    )
    (repo / "tests" / "test_broken.py").write_text("import nonexistent_module_xyz\n")
    ids = ["tests.test_m.T.test_ok", "tests.test_m.T.test_fail", "tests.test_m.T.test_err", "tests.test_m.T.test_skip",
           "tests.test_m.T.test_loop", "tests.test_m.T.test_absent", "tests.test_gone.T.test_x", "tests.test_broken.T.test_x"]
    proc, res = _run(tmp_path, "unittest", ids)
    assert res.complete, proc.stdout + proc.stderr
    assert "noise" not in proc.stdout
    assert [res.statuses[i][0] for i in ids] == ["pass", "fail", "error", "skip", "timeout", "missing", "missing", "error"]


def test_unittest_runner_guard_catches_test_files_rewritten_by_the_code(tmp_path):
    repo = tmp_path / "repo"
    (repo / "tests").mkdir(parents=True)
    (repo / "tests" / "__init__.py").write_text("")
    (repo / "src").mkdir()
    # importing the code under test rewrites the second test module before it is loaded
    (repo / "src" / "evil.py").write_text(
        "open('tests/test_b.py', 'w').write('import unittest\\nclass T(unittest.TestCase):\\n    def test_b(self): pass\\n')\n")
    (repo / "tests" / "test_a.py").write_text("import unittest, evil\nclass T(unittest.TestCase):\n    def test_a(self): pass\n")
    (repo / "tests" / "test_b.py").write_text("import unittest\nclass T(unittest.TestCase):\n    def test_b(self): self.fail()\n")
    ids = ["tests.test_a.T.test_a", "tests.test_b.T.test_b"]
    _, res = _run(tmp_path, "unittest", ids, guard=["tests/test_a.py", "tests/test_b.py"])
    assert res.statuses["tests.test_b.T.test_b"][0] == "error"
    assert "graded files changed" in res.statuses["tests.test_b.T.test_b"][1]


def test_pytest_runner_parametrised_ids_statuses_and_official_parser(tmp_path):
    repo = tmp_path / "repo"
    (repo / "tests").mkdir(parents=True)
    (repo / "src").mkdir()
    (repo / "src" / "lib.py").write_text("import pytest\ndef f(x):\n    return x\ndef bail():\n    pytest.xfail('dodge')\n")
    (repo / "tests" / "test_p.py").write_text(
        "import time, pytest\nfrom lib import f, bail\n"
        "@pytest.mark.parametrize('sep', ['\\t', ' ', '/', 'a-b'])\n"
        "def test_sep(sep):\n    assert f(sep) == sep\n"
        "class TestC:\n"
        "    @pytest.mark.parametrize('n', [1, 2])\n"
        "    def test_n(self, n):\n        assert n == 1\n"
        "def test_skip():\n    pytest.skip('no')\n"
        "@pytest.mark.xfail(reason='known')\ndef test_declared_xfail():\n    assert 0\n"
        "def test_imperative_xfail():\n    bail()\n"
        "def test_slow():\n    time.sleep(30)\n"
        "@pytest.fixture\ndef broken():\n    raise RuntimeError('fixture')\n"
        "def test_fixture_error(broken):\n    pass\n"
    )
    (repo / "tests" / "test_bad.py").write_text("import nonexistent_module_xyz\ndef test_x():\n    pass\n")
    ids = ["tests/test_p.py::test_sep[\\t]", "tests/test_p.py::test_sep[ ]", "tests/test_p.py::test_sep[/]",
           "tests/test_p.py::test_sep[a-b]", "tests/test_p.py::TestC::test_n[1]", "tests/test_p.py::TestC::test_n[2]",
           "tests/test_p.py::test_skip", "tests/test_p.py::test_declared_xfail", "tests/test_p.py::test_imperative_xfail",
           "tests/test_p.py::test_slow", "tests/test_p.py::test_fixture_error", "tests/test_p.py::test_absent",
           "tests/test_bad.py::test_x"]
    proc, res = _run(tmp_path, "pytest", ids, timeout=2)
    assert res.complete and not res.conflicts, proc.stdout[-3000:]
    got = [res.statuses[i][0] for i in ids]
    assert got == ["pass", "pass", "pass", "pass", "pass", "fail", "skip", "xfail", "fail", "timeout", "error",
                   "missing", "error"], proc.stdout[-3000:]
    # the -rA log went through swebench's parser: a contradicting log line makes the id an error
    forged = proc.stdout.replace("FAILED tests/test_p.py::TestC::test_n[2]", "PASSED tests/test_p.py::TestC::test_n[2]")
    res2 = runners.parse("pytest", forged, ids, NONCE)
    assert res2.conflicts == ["tests/test_p.py::TestC::test_n[2]"]
    assert res2.statuses["tests/test_p.py::TestC::test_n[2]"][0] == "error"


def test_parse_ignores_lines_without_the_nonce_and_reads_command_logs():
    ids = ["a.py::t", "a.py::u"]
    out = (f"@@agentrl:{'f' * 32}:result " + json.dumps({"id": "a.py::t", "status": "pass"}) + "\n"
           f"@@agentrl:{NONCE}:result " + json.dumps({"id": "a.py::t", "status": "fail", "detail": "x"}) + "\n"
           f"@@agentrl:{NONCE}:end\n")
    res = runners.parse("unittest", out, ids, NONCE)
    assert res.statuses == {"a.py::t": ("fail", "x")} and res.complete
    log = f"@@agentrl:{NONCE}:log-begin\nPASSED a.py::t\nFAILED a.py::u - boom\n@@agentrl:{NONCE}:log-end 1\nPASSED a.py::u\n"
    res = runners.parse("command", log + f"@@agentrl:{NONCE}:end\n", ids, NONCE, log_parser="parse_log_pytest")
    assert res.statuses["a.py::t"][0] == "pass" and res.statuses["a.py::u"][0] == "fail"  # the line after the frame is ignored


def test_parse_skips_result_lines_that_no_json_reader_takes():
    """The code under test writes what it likes to the output: a result line too deep for json.loads
    (RecursionError) or with an integer of over 4,300 digits (ValueError) is skipped, as a torn line is."""
    ids = ["a.py::t"]
    out = (f"@@agentrl:{NONCE}:result " + "[" * 100_000 + "\n"
           f"@@agentrl:{NONCE}:result " + '{"id": "a.py::t", "status": ' + "9" * 5000 + "}\n"
           f"@@agentrl:{NONCE}:result " + json.dumps({"id": "a.py::t", "status": "pass"}) + "\n"
           f"@@agentrl:{NONCE}:end\n")
    res = runners.parse("unittest", out, ids, NONCE)
    assert res.statuses == {"a.py::t": ("pass", "")} and res.complete


def test_env_specs_and_runner_inference(tmp_path):
    assert runner_for(EnvSpec(), ["tests.test_x.T.test_y"]) == "unittest"
    with_pytest = EnvSpec(pip=["pytest==8.3.3"])
    assert runner_for(with_pytest, ["tests/x.py::T::test[a-b]", "tests/y.py"]) == "pytest"
    with pytest.raises(EnvSpecError, match="mix"):
        runner_for(with_pytest, ["tests/x.py::t", "tests.x.T.t"])
    with pytest.raises(EnvSpecError, match="need pytest"):
        runner_for(EnvSpec(), ["tests/x.py::t"])
    with pytest.raises(EnvSpecError, match=r"python '3\.7' cannot be built.*3\.9 \(Debian bullseye\)"):
        parse_spec({"python": "3.7"}, "specs.yaml: o/r.1.0")
    with pytest.raises(EnvSpecError, match="specs.yaml: o/r.1.0: pipp: unknown key .did you mean .pip."):
        parse_spec({"pip": [], "pipp": []}, "specs.yaml: o/r.1.0")
    with pytest.raises(EnvSpecError, match=r"pip\[0\]"):
        parse_spec({"pip": ["pytest; rm -rf /"]}, "x")
    with pytest.raises(EnvSpecError, match="runner 'pytest' needs pytest"):
        parse_spec({"runner": "pytest"}, "x")
    assert python_base("3.9").tag == "agentrl-swe-py3.9:latest" and python_base("3.11").tag == "agentrl-base:latest"
    f = tmp_path / "specs.yaml"
    f.write_text("o/r:\n  '1.0': {python: '3.13', pip: [pytest==8.3.3]}\n  '*': {pythonpath: [src]}\n")
    specs = EnvSpecs.load(f)
    inst = {"instance_id": "i", "repo": "o/r", "base_commit": "b", "patch": "", "test_patch": "",
            "problem_statement": "", "FAIL_TO_PASS": ["t.T.t"], "PASS_TO_PASS": []}
    assert specs.for_instance(parse_instance(dict(inst, version="1.0"))).python == "3.13"
    assert specs.for_instance(parse_instance(dict(inst, version="2.0"))).pythonpath == ["src"]
    own = parse_instance(dict(inst, version="1.0", env_spec={"runner": "unittest"}))
    assert specs.for_instance(own).runner == "unittest" and specs.for_instance(own).python == "3.11"
    assert EnvSpecs().for_instance(parse_instance(dict(inst, repo="x/y"))) == EnvSpec()


def test_protected_paths_and_restore_through_symlinks(tmp_path):
    for path in ("conftest.py", "src/conftest.py", "sitecustomize.py", "src/usercustomize.py", "x.pth", "tests/util.py",
                 "pkg/test_x.py", "pytest.ini", "setup.cfg", "pyproject.toml", "a/testing/b.py"):
        assert is_protected(path), path
    for path in ("src/pkg/core.py", "README.md", "pkg/testsuite.py", "contest.py"):
        assert not is_protected(path), path
    inst = parse_instance({"instance_id": "i", "repo": "o/r", "base_commit": "b", "patch": "",
                           "test_patch": "diff --git a/tests/test_new.py b/tests/test_new.py\n", "problem_statement": "",
                           "FAIL_TO_PASS": ["tests/test_a.py::t"], "PASS_TO_PASS": []})
    model = ("diff --git a/src/core.py b/src/core.py\ndiff --git a/conftest.py b/conftest.py\n"
             "diff --git a/tests/test_a.py b/tests/test_a.py\n")
    restore, touched = protected_paths(inst, model, ["tests/test_a.py"])
    assert restore == ["tests/test_new.py", "tests/test_a.py", "conftest.py"] and touched == ["conftest.py", "tests/test_a.py"]
    # the shell script restores a test file even when its directory was replaced by a symlink
    repo = tmp_path / "r"
    (repo / "tests").mkdir(parents=True)
    (repo / "tests" / "test_a.py").write_text("real\n")
    git("init", "-q", cwd=repo)
    git("-c", "user.name=t", "-c", "user.email=t@t", "add", "-A", cwd=repo)
    git("-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "b", cwd=repo)
    base = git("rev-parse", "HEAD", cwd=repo).strip()
    (repo / "fake").mkdir()
    (repo / "fake" / "test_a.py").write_text("fake\n")
    subprocess.run("rm -rf tests && ln -s fake tests && echo x > conftest.py", shell=True, cwd=repo, check=True)
    subprocess.run(["sh", "-c", reset_script(base, ["tests/test_a.py", "conftest.py"])], cwd=repo, check=True)
    assert not (repo / "tests").is_symlink() and (repo / "tests" / "test_a.py").read_text() == "real\n"
    assert not (repo / "conftest.py").exists() and (repo / "fake" / "test_a.py").read_text() == "fake\n"


def test_upstream_selection_splices_top_level_definitions(tmp_path):
    from agentrl.envs.swe.upstream import RecipeError, apply_selection

    (tmp_path / "base").mkdir()
    (tmp_path / "new").mkdir()
    (tmp_path / "base" / "m.py").write_text("import os\n\ndef a():\n    return 1\n\n@dec\ndef b():\n    return 1\n\nX = 1\n")
    (tmp_path / "new" / "m.py").write_text("import os, sys\n\n@dec\ndef b():\n    return 2\n\ndef a():\n    return 2\n\n"
                                           "class C:\n    pass\n\nX = 2\n")
    apply_selection(tmp_path / "base", tmp_path / "new", {"file": "m.py", "defs": ["b", "C"]}, "r")
    text = (tmp_path / "base" / "m.py").read_text()
    assert "import os\n" in text and "def a():\n    return 1" in text and "@dec\ndef b():\n    return 2" in text
    assert "class C:" in text and "X = 1" in text
    with pytest.raises(RecipeError, match="no top-level definition 'nope'"):
        apply_selection(tmp_path / "base", tmp_path / "new", {"file": "m.py", "defs": ["nope"]}, "r")
    apply_selection(tmp_path / "base", tmp_path / "new", {"file": "m.py"}, "r")
    assert (tmp_path / "base" / "m.py").read_text() == (tmp_path / "new" / "m.py").read_text()
