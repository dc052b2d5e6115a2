"""Out-of-process envs: an env run by another interpreter behind agentrl's Env API. The protocol's faults with a plain
env under the system Python (no gymnasium, no agentrl there), and GEM for real in its own venv, offline."""

from __future__ import annotations

import gc
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

import agentrl
from agentrl.envs.bridges.outproc_env import HostedEnv, HostError
from agentrl.manager import EnvManager, EpisodeSpec, ManagerConfig
from agentrl.policy import ScriptedPolicy
from agentrl.testing.procs import running_descendants

pytestmark = pytest.mark.timeout(600)

SYSTEM_PYTHON = "/usr/bin/python3.11" if os.path.exists("/usr/bin/python3.11") else shutil.which("python3.11")
HERE = str(Path(__file__).parent)
OUTPROC = "outproc/Env-v0"
FIXTURE = {"python": SYSTEM_PYTHON, "factory": "outproc_fixture_env:make", "pythonpath": [HERE]}
NO_NET = ["unshare", "--user", "--map-root-user", "--net"]


def _hosts() -> list[str]:
    return running_descendants("outproc_host.py")


def test_the_other_interpreter_has_neither_agentrl_nor_gymnasium():
    """The point of the host: the env's interpreter is not agentrl's (here: the system Python, bare)."""
    out = subprocess.run([SYSTEM_PYTHON, "-c", "import gymnasium"], capture_output=True, text=True)
    assert out.returncode != 0 and "No module named 'gymnasium'" in out.stderr


def test_an_episode_through_the_host_and_a_chatty_env():
    env = agentrl.make(OUTPROC, **FIXTURE, kwargs={"start_bias": 10})
    try:
        obs, info = env.reset(seed=1)
        host = env.unwrapped.host
        assert env.unwrapped.hello["executable"] != sys.executable and info["pid"] == host.proc.pid
        start = info["start"]
        assert obs == [{"role": "user", "content": f"Count down from {start}: say down."}] and start >= 13
        assert env.reset(seed=1)[1]["start"] == start  # same seed, same task: the global random is the host's own
        for i in range(start - 1):
            assert env.step("down")[:4] == ([{"role": "user", "content": f"now {start - 1 - i}"}], 0.0, False, False)
        obs, reward, term, trunc, info = env.step("down")
        assert (reward, term, info["n"]) == (1.0, True, 0)
        assert "chatty env: step down" in host.stderr_tail()  # the env's prints went to stderr, not the protocol
    finally:
        env.close()
    assert not _hosts()


def test_faults_become_clear_errors_and_the_host_never_lingers():
    env = agentrl.make(OUTPROC, **FIXTURE, call_timeout_s=2)
    try:
        env.reset(seed=0)
        with pytest.raises(HostError, match="step failed in the env: ValueError: the env refused this action"):
            env.step("raise")
        assert env.step("wait")[0][0]["content"].startswith("now ")  # an env exception leaves the host usable
        with pytest.raises(HostError, match="step failed in the env: LookupError: Resource words not found.$"):
            env.step("banner")  # told on one line, without the terminal's decoration
        # terminated and truncated at once (GEM's single-turn tasks): it terminated; a cut is only one that did not
        assert env.step("stop")[1:4] == (0.5, True, False)
        env.reset(seed=0)
        with pytest.raises(HostError, match="reward nan, not a finite number|reward 'nan', not a finite number"):
            env.step("nan")
        t0 = time.monotonic()
        with pytest.raises(HostError, match=r"did not answer step within 2 s \(killed\)"):
            env.step("hang")
        assert time.monotonic() - t0 < 20 and not _hosts()
        env.reset(seed=0)  # a new host
        with pytest.raises(HostError, match=r"(?s)exited \(code 3\) during step; its stderr ends: .*crashing on purpose"):
            env.step("crash")
        assert not _hosts()
        with pytest.raises(HostError, match=r"no longer usable \(step\): .* exited"):  # at once, not after a wait
            env.step("down")
    finally:
        env.close()
    bad = agentrl.make(OUTPROC, **{**FIXTURE, "factory": "outproc_fixture_env:nope"})
    with pytest.raises(HostError, match="make failed in the env: AttributeError"):
        bad.reset(seed=0)
    assert not _hosts()  # a host whose env cannot be made is ended at once
    with pytest.raises(HostError, match="cannot start"):
        agentrl.make(OUTPROC, python="/nonexistent/python", factory="m:f").reset(seed=0)
    with pytest.raises(ValueError, match="factory must be 'module:callable'"):
        HostedEnv(python=SYSTEM_PYTHON, factory="no_colon")
    with pytest.raises(ValueError, match="kwargs must be JSON"):
        HostedEnv(python=SYSTEM_PYTHON, factory="m:f", kwargs={"x": object()})


@pytest.mark.bwrap
def test_a_sandboxed_host_sees_no_host_file_no_network_and_writes_nothing(tmp_path):
    """What model-written code could do from inside a library (SkyRL-Gym's lcb and searchcode run it in their own
    process): bare, the probe env reads the host's files and reaches its loopback; with ``sandbox="bwrap"`` it does
    neither, cannot write the bound source, and its PID 1 is not the host's."""
    import socket

    secret = tmp_path / "secret.txt"
    secret.write_text("host secret")
    server = socket.create_server(("127.0.0.1", 0))
    port = server.getsockname()[1]
    probe = {"python": SYSTEM_PYTHON, "factory": "outproc_probe_env:make", "pythonpath": [HERE]}
    actions = [f"read {secret}", f"connect {port}", f"write {HERE}/outproc_probe_env.py.bak", "init"]
    try:
        bare = agentrl.make(OUTPROC, **probe)
        bare.reset(seed=0)
        seen = [bare.step(a)[0][0]["content"] for a in actions[:2]]
        bare.close()
        assert seen == ["read: host secret", "connected"]  # the control: the probes work where nothing stops them
        boxed = agentrl.make(OUTPROC, **probe, sandbox="bwrap")
        assert boxed.reset(seed=0)[0][0]["content"] == "probe ready"
        read, connect, write, init = [boxed.step(a)[0][0]["content"] for a in actions]
        boxed.close()
    finally:
        server.close()
    assert read.startswith("refused: FileNotFoundError") and connect.startswith("refused:"), (read, connect)
    assert write.startswith("refused: OSError: [Errno 30] Read-only file system"), write
    assert not Path(f"{HERE}/outproc_probe_env.py.bak").exists()
    assert "outproc_host.py" in init or "bwrap" in init or "python" in init, init  # its own PID namespace
    assert not _hosts()
    with pytest.raises(ValueError, match="launcher or sandbox, not both"):
        HostedEnv(**probe, sandbox="bwrap", launcher=NO_NET)
    with pytest.raises(ValueError, match="sandbox must be 'bwrap'"):
        HostedEnv(**probe, sandbox="docker")


def test_an_env_dropped_without_close_ends_its_host():
    env = agentrl.make(OUTPROC, **FIXTURE)
    env.reset(seed=0)
    assert len(_hosts()) == 1
    del env
    gc.collect()
    assert not _hosts()


async def test_32_episodes_at_once_through_the_manager_are_reproducible():
    policy = ScriptedPolicy(lambda conversation, meta: "down")
    specs = [EpisodeSpec(OUTPROC, FIXTURE, seed=s) for s in range(32)]
    async with EnvManager(ManagerConfig(max_concurrency=32), policy) as m:
        first = await m.run_episodes(specs)
        again = await m.run_episodes(specs[:8])
    assert [t.error for t in first + again] == [None] * 40
    assert all(t.reward == 1.0 and t.termination == "terminated" for t in first + again)
    assert [t.messages for t in first[:8]] == [t.messages for t in again]
    assert len({t.num_turns for t in first}) > 1  # the seeds drew different starts: each host its own random
    assert not _hosts()


# -- GEM, for real, in its own venv ------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def gem_venv():
    from agentrl.envs.bridges.gem_env import setup_gem_venv

    return setup_gem_venv()  # once per machine (pip install gem-llm into ~/.cache/agentrl/venvs/gem)


def _guess(conversation, meta) -> str:
    """Bisection on GEM's Guess The Number (1..10) from its higher/lower replies."""
    lo, hi = 1, 10
    for m in conversation:
        text = m["content"]
        if m["role"] == "user" and "you guessed" in text:
            g = int(text.split("you guessed ")[1].split(",")[0])
            if "higher" in text:
                lo = g + 1
            elif "lower" in text:
                hi = g - 1
    return f"\\boxed{{{(lo + hi) // 2}}}"


def test_gem_runs_unchanged_in_its_own_venv_offline(gem_venv):
    gem_id = "gem/game:GuessTheNumber-v0-easy"
    from agentrl.envs.bridges.gem_env import env_names

    assert "game:GuessTheNumber-v0-easy" in env_names()
    env = agentrl.make(gem_id, launcher=NO_NET)  # no network namespace: GEM's games need none
    try:
        obs, _ = env.reset(seed=3)
        assert obs[0]["role"] == "user" and obs[0]["content"].startswith("You are playing Guess The Number.")
        hello = env.unwrapped.hello
        assert hello["executable"].startswith(str(gem_venv.parent.parent)) and hello["python"].startswith("3.11")
        probe = subprocess.run([str(gem_venv), "-c", "import agentrl"], capture_output=True, text=True)
        assert probe.returncode != 0  # agentrl is not in GEM's venv: the pins never meet
        assert env.unwrapped.sample_random_action().startswith("\\boxed{")
        conversation, reward, done, turns = list(obs), 0.0, False, 0
        while not done:
            action = _guess(conversation, None)
            out, reward, term, trunc, _ = env.step(action)
            conversation += [{"role": "assistant", "content": action}, *out]
            done, turns = term or trunc, turns + 1
        assert reward == 1.0 and turns <= 4
    finally:
        env.close()
    assert not _hosts()


async def test_gem_episodes_through_the_manager_reproduce(gem_venv):
    specs = [EpisodeSpec("gem/game:GuessTheNumber-v0-easy", seed=s) for s in range(6)]
    async with EnvManager(ManagerConfig(max_concurrency=6), ScriptedPolicy(_guess)) as m:
        first = await m.run_episodes(specs)
        again = await m.run_episodes(specs)
    assert [t.error for t in first] == [None] * 6 and all(t.reward == 1.0 for t in first)
    assert [t.messages for t in first] == [t.messages for t in again]
    assert not _hosts()


def test_gem_without_its_venv_says_how_to_set_it_up(monkeypatch, tmp_path):
    from agentrl.envs.bridges import gem_env

    monkeypatch.setenv("AGENTRL_GEM_VENV", str(tmp_path / "none"))
    with pytest.raises(ImportError, match=r"python -m agentrl.envs.bridges.gem_env setup"):
        gem_env.GEMEnv("game:GuessTheNumber-v0-easy")
    assert os.environ["AGENTRL_GEM_VENV"].endswith("none")


def test_envs_check_passes_out_of_process(gem_venv, capsys):
    """``agentrl envs check`` (gymnasium's checker included: reset(seed) then reset() must reproduce) on a host env
    and on GEM, with the kwargs from the command line; no host is left running."""
    from agentrl.cli import main

    assert main(["envs", "check", OUTPROC, f"python={SYSTEM_PYTHON}", "factory=outproc_fixture_env:make",
                 f"pythonpath=[{HERE}]"]) == 0
    assert main(["envs", "check", "gem/game:GuessTheNumber-v0-easy"]) == 0
    out = capsys.readouterr().out
    assert f"PASS  {OUTPROC}" in out and "PASS  gem/game:GuessTheNumber-v0-easy" in out
    gc.collect()
    assert not _hosts()
