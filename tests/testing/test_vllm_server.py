"""The test servers' launcher (``agentrl.testing.vllm_server.serve``) with a stand-in HTTP server: its log is removed
after a clean run and kept, named in the error, when the server dies before it is healthy or the test fails; the
server's process is gone either way."""

from __future__ import annotations

import os
import sys

import pytest

from agentrl.testing.vllm_server import free_port, serve

SERVER = """
import http.server, os, sys
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200 if self.path == "/health" else 404); self.end_headers()
    def log_message(self, *a):
        print("GET", *a, flush=True)
open(sys.argv[2], "w").write(str(os.getpid()))
http.server.HTTPServer(("127.0.0.1", int(sys.argv[1])), H).serve_forever()
"""


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    with open(f"/proc/{pid}/stat") as f:
        return f.read().split(")")[-1].split()[0] != "Z"


@pytest.fixture
def tmpdir_env(tmp_path, monkeypatch):
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    return tmp_path


def test_a_clean_run_leaves_no_log_and_no_process(tmpdir_env):
    port, pidfile = free_port(), tmpdir_env / "pid"
    with serve([sys.executable, "-c", SERVER, str(port), str(pidfile)], dict(os.environ), port, 60, "stand-in") as p:
        assert p == port and list(tmpdir_env.glob("agentrl-test-vllm-server-*.log"))
    assert not list(tmpdir_env.glob("agentrl-test-vllm-server-*.log"))
    assert not _alive(int(pidfile.read_text()))


def test_a_failed_test_keeps_the_log(tmpdir_env):
    port, pidfile = free_port(), tmpdir_env / "pid"
    with pytest.raises(AssertionError, match="the test's own failure"):
        with serve([sys.executable, "-c", SERVER, str(port), str(pidfile)], dict(os.environ), port, 60, "stand-in"):
            raise AssertionError("the test's own failure")
    (log,) = tmpdir_env.glob("agentrl-test-vllm-server-*.log")
    assert "GET" in log.read_text()  # the health check it answered
    assert not _alive(int(pidfile.read_text()))


def test_a_server_that_dies_before_it_is_healthy_is_reported_with_its_log(tmpdir_env):
    port = free_port()
    cmd = [sys.executable, "-c", "import sys; print('bad flag --nope', flush=True); sys.exit(3)"]
    with pytest.raises(RuntimeError, match="stand-in exited with 3; see .*agentrl-test-vllm-server") as e:
        with serve(cmd, dict(os.environ), port, 60, "stand-in"):
            pass
    log = str(e.value).split("see ")[-1]
    assert "bad flag --nope" in open(log).read()
