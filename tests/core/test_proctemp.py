"""Temp paths that belong to a process (agentrl.proctemp): removed when it exits, not when a forked child does, and
swept once their process is gone. Users: tests/inference/test_rpc_dir.py, tests/envs/bridges/test_mcp_sandbox.py."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import textwrap
from pathlib import Path

from agentrl import proctemp

ROOT = Path(__file__).resolve().parents[2]


def run(tmp: Path, body: str) -> list[str]:
    """Runs ``body`` in a fresh interpreter whose temp directory is ``tmp``; returns its stdout's words."""
    out = subprocess.run([sys.executable, "-c", textwrap.dedent(body)], cwd=ROOT, env=dict(os.environ, TMPDIR=str(tmp)),
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    return out.stdout.split()


MAKE = """
    import os, sys
    from agentrl import proctemp
    d = proctemp.make("agentrl-t-", directory=True)
    f = proctemp.make("agentrl-t-", directory=False)
    open(os.path.join(d, "inside"), "w").close()
    print(d, f, os.path.isdir(d), os.path.isfile(f))
"""


def test_a_processs_paths_go_with_it(tmp_path):
    d, f, is_dir, is_file = run(tmp_path, MAKE)
    assert (is_dir, is_file) == ("True", "True")
    assert Path(d).parent == tmp_path == Path(f).parent
    assert Path(d).name.startswith("agentrl-t-") and Path(f).name.startswith("agentrl-t-")
    assert list(tmp_path.iterdir()) == []


def test_a_forked_child_exiting_leaves_its_parents_paths(tmp_path):
    out = run(tmp_path, MAKE + """
    pid = os.fork()
    if pid == 0:
        sys.exit(0)  # runs the exit hooks the child inherited
    os.waitpid(pid, 0)
    print(os.path.isdir(d), os.path.isfile(f))
    """)
    assert out[4:] == ["True", "True"]
    assert list(tmp_path.iterdir()) == []


def test_sweep_removes_only_the_paths_of_processes_that_are_gone(tmp_path):
    gone = subprocess.Popen(["true"])
    gone.wait()
    dead_dir, dead_file = tmp_path / f"agentrl-t-{gone.pid}-abc", tmp_path / f"agentrl-t-{gone.pid}-def"
    live = tmp_path / f"agentrl-t-{os.getppid()}-ghi"
    mine = tmp_path / f"agentrl-t-{os.getpid()}-jkl"
    others = [tmp_path / "agentrl-t-x-mno", tmp_path / f"agentrl-u-{gone.pid}-pqr"]
    for d in (dead_dir, live, mine, *others):
        d.mkdir()
    dead_file.write_text("x")
    with socket.socket(socket.AF_UNIX) as s:
        s.bind(str(dead_dir / "sock"))
    assert sorted(proctemp.sweep("agentrl-t-", str(tmp_path))) == sorted([str(dead_dir), str(dead_file)])
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(p.name for p in (live, mine, *others))
