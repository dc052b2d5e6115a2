"""The orphan guard (agentrl.inference.orphan_guard): a driver killed outright takes its engine's processes with it,
a released guard kills nothing, and a reused PID is never signalled. The last test runs the real vLLM engine."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

import pytest

from agentrl.inference import orphan_guard, rpc_dir

ROOT = Path(__file__).resolve().parents[2]


def alive(pid: int) -> bool:
    """Runs (a zombie nobody reaps, as under a container's PID 1, counts as dead)."""
    try:
        return Path(f"/proc/{pid}/stat").read_bytes().rsplit(b")", 1)[1].split()[0] != b"Z"
    except OSError:
        return False


def wait_dead(pids: list[int], timeout_s: float) -> list[int]:
    """Polls until every PID is dead or the deadline passes; returns those still alive."""
    deadline = time.monotonic() + timeout_s
    while (left := [p for p in pids if alive(p)]) and time.monotonic() < deadline:
        time.sleep(0.05)
    return left


def kill_all(pids: list[int]) -> None:
    for p in pids:
        try:
            os.kill(p, signal.SIGKILL)
        except ProcessLookupError:
            pass


def start_driver(tmp_path: Path, body: str, env: dict[str, str] | None = None) -> tuple[subprocess.Popen, dict]:
    """Runs ``body`` as a driver script (in ``env``, else this process's environment) that prints ``PIDS {json}``
    and then blocks until killed; returns it and the printed PIDs."""
    script = tmp_path / "driver.py"
    script.write_text(textwrap.dedent(body))
    proc = subprocess.Popen([sys.executable, str(script)], cwd=ROOT, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            text=True, start_new_session=True, env=env)
    for line in proc.stdout:
        if line.startswith("PIDS "):
            return proc, json.loads(line[5:])
    proc.wait()
    raise AssertionError(f"driver exited ({proc.returncode}) before printing its PIDs")


FAKE_TREE = """
    import json, subprocess, sys
    from agentrl.inference import orphan_guard

    root = subprocess.Popen(["sh", "-c", "sleep 600 & sleep 600 & wait"])
    while len(orphan_guard.descendants(root.pid)) < 2:  # both sleeps started
        pass
    g = orphan_guard.guard([root.pid])
    print("PIDS " + json.dumps({"tree": [root.pid, *orphan_guard.descendants(root.pid)], "watcher": g.proc.pid}),
          flush=True)
    sys.stdin.read()
"""


def test_a_driver_killed_outright_takes_the_guarded_tree_with_it(tmp_path):
    driver, pids = start_driver(tmp_path, FAKE_TREE)
    try:
        assert len(pids["tree"]) == 3 and all(alive(p) for p in pids["tree"])
        os.kill(driver.pid, signal.SIGKILL)  # the driver alone, not its session
        driver.wait()
        assert wait_dead([pids["watcher"]], 30) == []
        assert [p for p in pids["tree"] if alive(p)] == []
    finally:
        kill_all([driver.pid, pids["watcher"], *pids["tree"]])


def test_a_released_guard_kills_nothing_and_a_kill_release_kills_the_tree():
    kept = subprocess.Popen(["sh", "-c", "sleep 600 & wait"])
    doomed = subprocess.Popen(["sh", "-c", "sleep 600 & wait"])
    trees = []
    try:
        for proc in (kept, doomed):
            while not orphan_guard.descendants(proc.pid):
                pass
            trees.append([proc.pid, *orphan_guard.descendants(proc.pid)])
        g = orphan_guard.guard([kept.pid])
        g.release()
        assert g.proc.returncode == 0
        assert all(alive(p) for p in trees[0])
        g = orphan_guard.guard([doomed.pid])
        g.release(kill=True)
        doomed.wait()
        assert wait_dead(trees[1], 30) == []
        assert all(alive(p) for p in trees[0])
    finally:
        kill_all(trees[0] + trees[1])
        kept.wait()
        doomed.wait()


def test_a_pid_whose_start_time_differs_is_never_signalled():
    proc = subprocess.Popen(["sleep", "600"])
    try:
        started = orphan_guard.start_time(proc.pid)
        assert orphan_guard.kill_tree([(proc.pid, started + 1)]) == []
        assert proc.poll() is None
        assert orphan_guard.kill_tree([(proc.pid, started)]) == [proc.pid]
        assert proc.wait(timeout=30) == -signal.SIGKILL
    finally:
        proc.kill()
        proc.wait()


def test_guarding_only_dead_pids_starts_no_watcher():
    proc = subprocess.Popen(["true"])
    proc.wait()
    assert orphan_guard.guard([proc.pid]) is None


@pytest.mark.engine
def test_the_real_engine_dies_with_a_driver_killed_outright(tmp_path, tiny_model_dir):
    """vLLM's engine core (and its worker) outlived a SIGKILLed driver for 80 minutes before the guard. Its ZMQ
    sockets went to the temp directory and stayed there (three per engine start); they now go to the driver's own
    directory, which the next engine start on the host sweeps once the driver is gone."""
    tmp = Path(tempfile.mkdtemp(prefix="agentrl-test-", dir="/tmp"))  # short enough for a socket's path
    env = {k: v for k, v in os.environ.items() if k != "VLLM_RPC_BASE_PATH"} | {"TMPDIR": str(tmp)}
    driver, pids = start_driver(tmp_path, f"""
        import json, sys
        from agentrl.inference import EngineConfig, orphan_guard
        from agentrl.inference.vllm_engine import VLLMEngine

        if __name__ == "__main__":
            eng = VLLMEngine(EngineConfig(model={str(tiny_model_dir)!r}, max_model_len=512, seed=0))
            cores = orphan_guard.engine_core_pids(eng._llm)
            tree = cores + [d for c in cores for d in orphan_guard.descendants(c)]
            print("PIDS " + json.dumps({{"cores": cores, "tree": tree}}), flush=True)
            sys.stdin.read()
    """, env)
    try:
        assert len(pids["cores"]) == 1 and len(pids["tree"]) >= 2, pids  # EngineCore and at least one worker
        os.kill(driver.pid, signal.SIGKILL)
        driver.wait()
        assert wait_dead(pids["tree"], 60) == []
        # (torch's compile cache and vLLM's FileStore rendezvous file may be there too: not sockets)
        assert [p.name for p in tmp.iterdir() if p.is_socket()] == []
        mine = [p for p in tmp.iterdir() if p.name.startswith(f"{rpc_dir.PREFIX}{driver.pid}-")]
        assert len(mine) == 1 and any(p.is_socket() for p in mine[0].iterdir())
        assert rpc_dir.sweep(str(tmp)) == [str(mine[0])]
        assert not mine[0].exists()
    finally:
        kill_all([driver.pid, *pids["tree"]])
        shutil.rmtree(tmp, ignore_errors=True)
