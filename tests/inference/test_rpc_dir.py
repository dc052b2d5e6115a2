"""vLLM's socket directory (agentrl.inference.rpc_dir): one per process, under ``/tmp`` when the temp directory's
path is too long for a socket's, and a user's ``VLLM_RPC_BASE_PATH`` kept. Exit and sweep: tests/core/test_proctemp.py;
the real engine's sockets landing there: tests/inference/test_orphan_guard.py."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path
from typing import Iterator

import pytest

from agentrl.inference import rpc_dir

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def tmp() -> Iterator[Path]:
    """A temp directory short enough for a socket's path (pytest's ``tmp_path`` is not)."""
    path = Path(tempfile.mkdtemp(prefix="agentrl-test-", dir="/tmp"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


def run(tmp: Path, **env: str) -> str:
    """Makes the directory in a fresh interpreter whose temp directory is ``tmp``, binds a socket in it (what vLLM's
    ZMQ ipc:// listeners leave behind) and exits; returns the directory."""
    body = """
        import os, socket
        from agentrl.inference import rpc_dir
        d = rpc_dir.ensure()
        assert rpc_dir.ensure() == d == os.environ["VLLM_RPC_BASE_PATH"]
        socket.socket(socket.AF_UNIX).bind(os.path.join(d, "sock"))
        print(d)
    """
    full = {k: v for k, v in os.environ.items() if k != "VLLM_RPC_BASE_PATH"} | {"TMPDIR": str(tmp), **env}
    out = subprocess.run([sys.executable, "-c", textwrap.dedent(body)], cwd=ROOT, env=full, capture_output=True,
                         text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    return out.stdout.strip()


def test_the_sockets_go_to_a_directory_of_the_process_that_goes_with_it(tmp):
    made = run(tmp)
    assert Path(made).parent == tmp and Path(made).name.startswith(rpc_dir.PREFIX)
    assert list(tmp.iterdir()) == []


def test_a_temp_directory_too_long_for_a_socket_path_falls_back_to_tmp(tmp):
    long = tmp / ("x" * 60)
    long.mkdir()
    made = run(long)
    assert Path(made).parent == Path("/tmp") and Path(made).name.startswith(rpc_dir.PREFIX)
    assert not Path(made).exists() and list(long.iterdir()) == []


def test_a_users_vllm_rpc_base_path_is_kept(tmp):
    mine = tmp / "mine"
    mine.mkdir()
    assert run(tmp, VLLM_RPC_BASE_PATH=str(mine)) == str(mine)
    assert [p.name for p in tmp.iterdir()] == ["mine"]
