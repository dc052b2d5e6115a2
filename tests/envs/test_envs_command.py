"""``agentrl envs list|check``, in process and through the installed console script."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import gymnasium
import pytest

import agentrl
from agentrl import registration
from agentrl.cli import main

BUILTIN_IDS = ["agentrl/Arithmetic-v0", "agentrl/FrozenLake-v0", "agentrl/GuessNumber-v0", "agentrl/ToolUse-v0"]
AGENTRL_SCRIPT = Path(sys.executable).parent / "agentrl"


class _OutOfSpaceEnv(agentrl.Env):
    """Returns an observation that is not a list of messages."""

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        return [{"role": "user", "content": "hi"}], {}

    def step(self, action):
        return 42, 0.0, False, False, {}


class _CrashingEnv(agentrl.Env):
    """Raises on text it does not expect, which an env must never do."""

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        return [{"role": "user", "content": "say ok"}], {}

    def step(self, action):
        if action != "ok":
            raise ValueError("unexpected action")
        return [{"role": "user", "content": "fine"}], 1.0, True, False, {}


@pytest.fixture
def broken_envs():
    ids = {"test-envs-cmd/OutOfSpace-v0": _OutOfSpaceEnv, "test-envs-cmd/Crashing-v0": _CrashingEnv}
    for env_id, cls in ids.items():
        agentrl.register(env_id, entry_point=cls, description=f"deliberately broken ({cls.__name__})")
    yield list(ids)
    for env_id in ids:  # leave the process-wide registry as it was
        del gymnasium.registry[env_id]
        registration._agentrl_ids.discard(env_id)
        registration._descriptions.pop(env_id, None)


def _lines(text: str) -> list[str]:
    return [line for line in text.splitlines() if line.strip()]


def test_list_prints_every_builtin_with_its_description(capsys):
    assert main(["envs", "list", "--namespace", "agentrl"]) == 0
    lines = _lines(capsys.readouterr().out)
    for env_id in BUILTIN_IDS:
        line = next(line for line in lines if line.startswith(env_id + " "))
        assert registration.description(env_id) in line
    assert all(line.startswith("agentrl/") for line in lines)


def test_check_builtins_pass(capsys):
    assert main(["envs", "check", *BUILTIN_IDS, "--seed", "3"]) == 0
    out = capsys.readouterr().out
    for env_id in BUILTIN_IDS:
        line = next(line for line in _lines(out) if env_id in line)
        assert line.startswith("PASS"), line
        assert "check_env ok" in line and "random episode" in line and "async ok" in line
        assert "solver: return 1 " in line
    assert "4 passed, 0 failed" in out


def test_check_reports_broken_envs_and_fails(capsys, broken_envs):
    assert main(["envs", "check", "agentrl/GuessNumber-v0", *broken_envs]) == 1
    lines = _lines(capsys.readouterr().out)
    status = {line.split()[1]: line for line in lines if line.startswith(("PASS", "FAIL"))}
    assert status["agentrl/GuessNumber-v0"].startswith("PASS")
    assert status["test-envs-cmd/OutOfSpace-v0"].startswith("FAIL")
    assert "check_env" in status["test-envs-cmd/OutOfSpace-v0"]
    assert "observation space" in status["test-envs-cmd/OutOfSpace-v0"]
    crash = status["test-envs-cmd/Crashing-v0"]
    assert crash.startswith("FAIL") and "ValueError: unexpected action" in crash
    assert lines[-1] == "1 passed, 2 failed"


def test_check_names_the_spaces_of_a_gymnasium_env_that_is_not_text(capsys):
    """FrozenLake-v1 (Discrete observations and actions) failed with "TypeError: 'int' object is not iterable",
    Blackjack-v1 with "AttributeError: ... no attribute 'areset'"."""
    assert main(["envs", "check", "FrozenLake-v1", "Blackjack-v1", "CartPole-v1"]) == 1
    lines = [line for line in _lines(capsys.readouterr().out) if line.startswith("FAIL")]
    assert len(lines) == 3
    for line in lines:
        assert "spaces: observations " in line and "take" in line and "text actions" in line, line
    assert "Discrete(16), actions Discrete(4)" in lines[0]


@pytest.fixture
def only_agentrl_namespace():
    """Hides, for one test, the ids earlier tests of this process registered outside the ``agentrl`` namespace
    (bridged family members, SWE instances: hundreds, checked in their own tests), so ``--all`` checks what this
    test is about whatever ran before it."""
    others = set(registration._agentrl_ids) - set(agentrl.registered_ids("agentrl"))
    registration._agentrl_ids.difference_update(others)
    try:
        yield
    finally:
        registration._agentrl_ids.update(others)


def test_check_all_includes_registered_envs(capsys, only_agentrl_namespace, broken_envs):
    assert main(["envs", "check", "--all"]) == 1
    out = capsys.readouterr().out
    for env_id in BUILTIN_IDS + broken_envs:
        assert env_id in out


def test_check_unknown_id_names_close_matches(capsys):
    assert main(["envs", "check", "agentrl/FrozenLak-v0"]) == 1
    out = capsys.readouterr().out
    assert out.startswith("FAIL") and "did you mean 'agentrl/FrozenLake-v0'" in out


def test_check_of_an_env_whose_constructor_needs_kwargs_says_which_and_how_to_give_them(capsys):
    """A named env that cannot be made without kwargs (a task file, a server) fails with what it needs and the
    command line that gives it, not with Python's bare TypeError; given them, it is checked."""
    assert main(["envs", "check", "skyrl_gym/gsm8k"]) == 1
    out = capsys.readouterr().out
    assert out.startswith("FAIL") and "needs env kwargs tasks=..." in out, out
    assert "agentrl envs check skyrl_gym/gsm8k tasks=VALUE" in out and "TypeError" not in out, out


def test_check_needs_ids_or_all(capsys):
    assert main(["envs", "check"]) == 2
    assert main(["envs", "check", "--all", "agentrl/FrozenLake-v0"]) == 2
    assert main(["envs"]) == 2


def _run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([str(AGENTRL_SCRIPT), *args], capture_output=True, text=True, timeout=120)


def test_console_script_list_and_check_all():
    listed = _run("envs", "list")
    assert listed.returncode == 0, listed.stderr
    for env_id in BUILTIN_IDS:
        assert env_id in listed.stdout
    checked = _run("envs", "check", "--all")
    assert checked.returncode == 0, checked.stdout + checked.stderr
    for env_id in BUILTIN_IDS:
        assert f"PASS  {env_id}" in checked.stdout
    assert " 0 failed" in checked.stdout


def test_console_script_exit_code_on_failure():
    result = _run("envs", "check", "agentrl/NoSuchEnv-v0")
    assert result.returncode == 1 and "FAIL" in result.stdout


def test_a_reader_that_leaves_gets_no_traceback():
    # The pipe's read end is closed before the command writes, so its first write fails, as under `| head -1`.
    read, write = os.pipe()
    os.close(read)
    try:
        p = subprocess.run([str(AGENTRL_SCRIPT), "envs", "list"], stdout=write, stderr=subprocess.PIPE, text=True,
                           timeout=120)
    finally:
        os.close(write)
    assert p.returncode == 1 and p.stderr == "", p.stderr[-2000:]
