"""Test runners, host side: what the grader stages and runs in the sandbox, and how it reads the verdicts.

Three runners (chosen per instance by :func:`agentrl.envs.swe.envspec.runner_for`):

- ``unittest``: :mod:`agentrl.envs.swe.unittest_runner` runs dotted ids one at a time;
- ``pytest``: :mod:`agentrl.envs.swe.pytest_runner` runs node ids (parametrised ones included) in one session. The
  statuses come from the official ``swebench`` parser (``parse_log_pytest``) over pytest's ``-rA`` log, checked
  against the runner's per-item records, which also carry what that log format cannot (ids with whitespace,
  timeouts, an imperative ``pytest.xfail()``). A log line that contradicts the record makes the id ``error``;
- ``command``: the env spec's ``test_cmd`` with the ids as arguments, parsed by the named ``swebench`` parser.

Every runner's output is framed by a random nonce that only the runner (never the code under test) knows: lines
without it are ignored, so tests that print fake results, or files written where a results file might be, change
nothing. Interpreters run with ``-I -B`` (no user site, no ``PYTHON*`` variables, no bytecode writes); the env
spec's ``pythonpath`` is put on ``sys.path`` by the runner.
"""

from __future__ import annotations

import json
import re
import secrets
import shlex
from dataclasses import dataclass, field
from pathlib import Path

from agentrl.tools import JSON_ERRORS

from .swebench_compat import STATUS_MAP, parse_log

HERE = Path(__file__).resolve().parent
RUNNER_FILES = {"unittest": HERE / "unittest_runner.py", "pytest": HERE / "pytest_runner.py"}
PASSING = ("pass", "xfail")


@dataclass
class RunResult:
    """Statuses per id (``(status, detail)``), ids whose log line and runner record disagree, and whether the
    runner reached its end marker."""

    statuses: dict[str, tuple[str, str]]
    conflicts: list[str] = field(default_factory=list)
    complete: bool = False


def new_nonce() -> str:
    return secrets.token_hex(16)


def stage(runner: str, ids: list[str], guard: list[str], nonce: str, test_cmd: str = "") -> dict[str, bytes | str]:
    """The files the run needs in the grading scratch dir (name -> content)."""
    files: dict[str, bytes | str] = {"ids.txt": "".join(i + "\n" for i in ids), "nonce": nonce + "\n",
                                     "guard.txt": "".join(g + "\n" for g in guard)}
    if runner in RUNNER_FILES:
        files[f"{runner}_runner.py"] = RUNNER_FILES[runner].read_bytes()
    elif runner == "command":
        files["run_command.sh"] = (
            'n=$(cat "$1/nonce"); rm -f "$1/nonce"\n'
            'set --; while IFS= read -r line; do set -- "$@" "$line"; done < "$GRADE_IDS"\n'
            'echo "@@agentrl:$n:log-begin"\n'
            f"{test_cmd} \"$@\"\n"
            'rc=$?\necho "\n@@agentrl:$n:log-end $rc"\necho "@@agentrl:$n:end"\n'
        )
    else:
        raise ValueError(f"unknown runner {runner!r}")
    return files


def command(runner: str, grade_dir: str, python: str, *, per_test_timeout: float, pythonpath: list[str],
            pytest_args: list[str]) -> str:
    """The shell command that runs the staged runner from the repository root."""
    d = shlex.quote(grade_dir)
    paths = " ".join(f"--path {shlex.quote(p)}" for p in pythonpath)
    common = f"--nonce-file {d}/nonce --ids-file {d}/ids.txt --guard-file {d}/guard.txt --per-test-timeout {per_test_timeout:g} {paths}"
    if runner == "unittest":
        return f"{shlex.quote(python)} -I -B {d}/unittest_runner.py {common}"
    if runner == "pytest":
        extra = " ".join(shlex.quote(a) for a in pytest_args)
        return f"{shlex.quote(python)} -I -B {d}/pytest_runner.py {common} -- {extra}"
    pp = ":".join(f"$PWD/{p}" for p in pythonpath)
    env = f"PYTHONPATH={shlex.quote(pp)} " if pp else ""
    return f"{env}GRADE_IDS={d}/ids.txt sh {d}/run_command.sh {d}"


def _frames(output: str, nonce: str) -> tuple[list[str], str | None, bool]:
    """Returns (result payloads, the log between log-begin and log-end or None, end marker seen)."""
    tag = f"@@agentrl:{nonce}:"
    results, log_lines, in_log, log_seen, end = [], [], False, False, False
    for line in output.splitlines():
        if line.startswith(tag):
            kind, _, rest = line[len(tag):].partition(" ")
            if kind == "result":
                results.append(rest)
            elif kind == "log-begin":
                in_log, log_seen = True, True
            elif kind == "log-end":
                in_log = False
            elif kind == "end":
                end = True
        elif in_log:
            log_lines.append(line)
    return results, ("\n".join(log_lines) if log_seen else None), end


def parse(runner: str, output: str, ids: list[str], nonce: str, *, log_parser: str = "parse_log_pytest") -> RunResult:
    """Reads the statuses of ``ids`` from a run's output (see the module doc). Ids without a status are absent
    from the result (the caller decides between ``timeout`` and ``not_run``)."""
    payloads, log, end = _frames(output, nonce)
    statuses: dict[str, tuple[str, str]] = {}
    for p in payloads:
        try:
            rec = json.loads(p)
            statuses[str(rec["id"])] = (str(rec["status"]), str(rec.get("detail", "")))
        except (*JSON_ERRORS, KeyError, TypeError):  # ValueError, RecursionError: what the tested code wrote
            continue  # a line cut by a kill mid-write
    guard = statuses.pop("<guard>", None)
    if guard is not None:
        statuses = {t: guard for t in ids}
    res = RunResult(statuses, complete=end)
    if log is None:
        return res
    official = parse_log(log_parser, log)
    if runner == "command":
        for t in ids:
            if t in official:
                status = STATUS_MAP.get(official[t], "fail")
                res.statuses[t] = (status, "" if status in PASSING else f"{official[t]} (test log)")
            elif end:
                res.statuses[t] = ("missing", "no line for this test in the test log")
        return res
    # pytest: the official parse of the -rA log must agree with the runner's record of each item.
    for t in ids:
        if re.search(r"\s", t) or t not in official or t not in statuses:
            continue  # the log format cannot carry this id, or one side has no word on it
        log_pass = STATUS_MAP.get(official[t]) in PASSING
        rec_status = statuses[t][0]
        if log_pass != (rec_status in PASSING) and not (official[t] == "XFAIL" and rec_status == "fail"):
            res.conflicts.append(t)
            statuses[t] = ("error", f"the pytest log says {official[t]} but the runner recorded {rec_status}")
    return res


def test_files(ids: list[str], root: Path, runner: str) -> list[str]:
    """The repository-relative files that hold the tests ``ids`` (pytest: the path of the node id; unittest: the
    module of the dotted id, found in the tree at ``root``)."""
    out: list[str] = []
    for t in ids:
        path: str | None = None
        if runner == "pytest" or "::" in t or "/" in t:
            path = t.split("::", 1)[0]
        else:
            parts = t.split(".")
            for n in range(len(parts), 0, -1):
                base = "/".join(parts[:n])
                if (root / f"{base}.py").is_file():
                    path = f"{base}.py"
                    break
                if (root / base / "__init__.py").is_file():
                    path = f"{base}/__init__.py"
                    break
        if path and path not in out:
            out.append(path)
    return out


def describe(runner: str, python: str, pythonpath: list[str], any_id: str | None) -> str:
    """One sentence for the agent's system prompt: how to run a test of this instance."""
    env = f"PYTHONPATH={':'.join(pythonpath)} " if pythonpath else ""
    if runner == "pytest":
        example = any_id or "tests/test_module.py::test_name"
        return f"Tests use pytest: `{env}python -m pytest -q {shlex.quote(example)}`."
    if runner == "unittest":
        example = ".".join((any_id or "tests.test_module.TestClass.test_name").split(".")[:2])
        py = "python" if python != "python3" else "python3"
        return f"Tests use unittest: `{env}{py} -m unittest -v {example}` (pytest may not be installed)."
    return "Run the tests with the project's own test command."
