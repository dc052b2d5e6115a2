"""Stdio MCP servers inside a bubblewrap sandbox: the episode talks to the server over stdio as before, and a
server whose tools do what hostile tool calls would (``mcp_hostile_server.py``) reaches nothing of the host that it
reaches when run bare: files, network, processes, privileges; and what it leaves running ends with the episode."""

from __future__ import annotations

import json
import os
import socket
import sys
import threading
from pathlib import Path

import pytest

import agentrl
from agentrl.envs.bridges.mcp_tools import DEMO_SERVER
from agentrl.sandboxes.bwrap import bwrap_available
from agentrl.testing.procs import descendants, running_descendants
from agentrl.tools import format_tool_call

pytestmark = pytest.mark.timeout(300)

MCP = "mcp/Tools-v0"
HOSTILE = [sys.executable, str(Path(__file__).with_name("mcp_hostile_server.py"))]


@pytest.fixture(scope="module", autouse=True)
def _bwrap():
    ok, why = bwrap_available()
    assert ok, f"these tests need bubblewrap (apt-get install bubblewrap): {why}"


def _call(env, tool: str, **args) -> str:
    out, *_ = env.step(format_tool_call(tool, args))
    return out[0]["content"]


@pytest.fixture
def listener():
    """A TCP server on the host's loopback that greets whoever connects."""
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    s.listen()
    stop = threading.Event()

    def serve():
        s.settimeout(0.2)
        while not stop.is_set():
            try:
                c, _ = s.accept()
            except OSError:
                continue
            c.sendall(b"hello from the host\n")
            c.close()

    t = threading.Thread(target=serve, daemon=True)
    t.start()
    yield s.getsockname()[1]
    stop.set()
    t.join()
    s.close()


def test_the_demo_server_in_the_sandbox_solves_its_tasks(capsys):
    env = agentrl.make(MCP, sandbox="bwrap", checker="mcp:check_answer")
    try:
        _, info = env.reset(seed=2)
        assert [t["function"]["name"] for t in info["tools"]] == ["lookup", "calculator"]
        assert env.unwrapped.conn.command[0:1] != [sys.executable]  # it runs through the sandbox's launcher
        result = None
        while result is None or not result[2]:
            result = env.step(env.unwrapped.solve(env.unwrapped.history))
        assert result[1] == 1.0
    finally:
        env.close()
    assert not running_descendants(DEMO_SERVER.name)
    from agentrl.cli import main

    assert main(["envs", "check", MCP, "sandbox=bwrap"]) == 0
    assert f"PASS  {MCP}" in capsys.readouterr().out


@pytest.mark.parametrize("sandbox", [None, "bwrap"])
def test_hostile_tool_calls_cannot_escape(sandbox, tmp_path, listener):
    secret = tmp_path / "secret.txt"
    secret.write_text("host secret")
    planted = tmp_path / "planted.txt"
    marker = f"agentrl-detached-{sandbox}-{os.getpid()}"
    env = agentrl.make(MCP, server=HOSTILE, sandbox=sandbox)
    try:
        env.reset(seed=0)
        read = _call(env, "read", path=str(secret))
        wrote = _call(env, "write", path=str(planted), text="x")
        home = _call(env, "write", path=str(Path(__file__).parent / "planted-by-mcp.txt"), text="x")
        net = _call(env, "connect", host="127.0.0.1", port=listener)
        pids = _call(env, "pids")
        killed = _call(env, "kill", pid=os.getpid() if sandbox else 1 << 22)  # bare: a pid that does not exist
        who = _call(env, "whoami")
        _call(env, "detach", marker=marker)
        if sandbox is None:  # the probes work: bare, the server reaches all of it
            assert read == "host secret" and wrote == "written" and net == "hello from the host\n"
            assert str(os.getpid()) in pids.split()
            (Path(__file__).parent / "planted-by-mcp.txt").unlink()
        else:
            assert read.startswith("refused: FileNotFoundError")  # tmp_path is not in the sandbox
            assert wrote.startswith("refused: FileNotFoundError") and not planted.exists()
            assert home.startswith("refused: OSError: [Errno 30] Read-only file system")  # bound read-only
            assert net.startswith("refused: ConnectionRefusedError")  # its own loopback, not the host's
            assert len(pids.split()) <= 4 and str(os.getpid()) not in pids.split()  # its own PID namespace
            assert killed.startswith("refused: ProcessLookupError")  # the test process is not there
            assert who.endswith("caps=0000000000000000")
        assert running_descendants(marker)  # the detached process runs, for now
    finally:
        env.close()
    leftovers = running_descendants(marker)
    if sandbox == "bwrap":
        assert not leftovers  # the sandbox ended with the episode, taking what the server detached
    else:
        for line in leftovers:  # bare, a detached process outlives the server: that is why the sandbox exists
            os.kill(int(line.split()[0]), 9)
    assert not running_descendants("mcp_hostile_server.py")


def test_a_sandboxed_server_that_exits_fails_reset_naming_the_server():
    from agentrl.envs.bridges.mcp_client import MCPServerError

    env = agentrl.make(MCP, server=[sys.executable, "-c", "raise SystemExit(3)"], sandbox="bwrap", start_timeout_s=60)
    with pytest.raises(MCPServerError, match=r"MCP server '.*raise SystemExit\(3\) \(in bwrap\)' failed"):
        env.reset(seed=0)
    env.close()
    assert not running_descendants("bwrap")


def test_bad_sandbox_kwargs_fail_with_clear_errors():
    with pytest.raises(ValueError, match="sandbox must be 'bwrap' or None"):
        agentrl.make(MCP, sandbox="docker-please")
    with pytest.raises(ValueError, match="sandbox applies to a stdio server"):
        agentrl.make(MCP, url="http://127.0.0.1:1/mcp", sandbox="bwrap")


def test_a_script_under_tmp_is_still_there_inside_the_sandbox(tmp_path):
    """The sandbox's private /tmp is mounted before the binds: a command under /tmp (a clone in /tmp, as in CI)
    is bound on top of it, not hidden by it."""
    import subprocess

    from agentrl.envs.bridges.mcp_sandbox import bwrap_command

    assert str(tmp_path).startswith("/tmp/")
    script = tmp_path / "hello.py"
    script.write_text("print('inside')\n")
    script.chmod(0o755)
    tmp_path.chmod(0o755)
    out = subprocess.run(bwrap_command([sys.executable, str(script)]), capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and out.stdout.strip() == "inside", out.stderr


def test_the_seccomp_program_file_goes_with_the_process_that_wrote_it(tmp_path):
    """It was written once per process to the temp directory and never removed (one file per test run or job)."""
    import subprocess

    code = ("from agentrl.envs.bridges import mcp_sandbox\n"
            "path = mcp_sandbox._seccomp_file()\n"
            "print(path, open(path, 'rb').read() != b'')")
    out = subprocess.run([sys.executable, "-c", code], env=dict(os.environ, TMPDIR=str(tmp_path)), capture_output=True,
                         text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    path, nonempty = out.stdout.split()
    assert nonempty == "True" and os.path.dirname(path) == str(tmp_path)
    assert list(tmp_path.iterdir()) == []
