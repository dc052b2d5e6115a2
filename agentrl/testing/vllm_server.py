"""vLLM's own OpenAI-compatible server (``python -m vllm.entrypoints.openai.api_server``), started for a test with a
local model on 127.0.0.1: its log in ``$TMPDIR``, up once ``/health`` answers, its whole process group ended on exit,
and its log removed unless the server failed to start or the test failed (then the error names it).

The model runs in the engine-core process (vLLM's ``uni`` executor, which vLLM CPU keeps only with multiprocessing
off; the API server's engine core still runs in a process of its own): the server is up ~15 s sooner on the CPU.
``nobind``: on a 2-core host another engine's worker may already be pinned to core 0; the OS places this one.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from typing import Iterator

from agentrl import proctemp


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def vllm_server(model: str, args: list[str], env: dict[str, str] | None = None,
                ready_s: float = 300.0) -> Iterator[int]:
    """Serves ``model`` (float32, 2,048 positions, eager) with ``args`` added to the command line and ``env`` to the
    environment; yields the port once healthy. Raises RuntimeError, naming the log, if it exits or is not healthy
    within ``ready_s``."""
    port = free_port()
    # vLLM leaves its ZMQ sockets (/<uuid4>, 37 bytes) behind: they go with this directory
    sockets = tempfile.TemporaryDirectory(prefix="agentrl-vllm-server-", dir=proctemp.socket_parent(37 + 30))
    env = dict(os.environ, VLLM_RPC_BASE_PATH=sockets.name, VLLM_CPU_KVCACHE_SPACE="1", VLLM_LOGGING_LEVEL="WARNING",
               VLLM_CPU_OMP_THREADS_BIND="nobind", VLLM_ENABLE_V1_MULTIPROCESSING="0", **(env or {}))
    cmd = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", model, "--dtype", "float32",
           "--max-model-len", "2048", "--enforce-eager", "--host", "127.0.0.1", "--port", str(port),
           "--distributed-executor-backend", "uni", *args]
    with sockets, serve(cmd, env, port, ready_s, "vLLM server") as p:
        yield p


@contextlib.contextmanager
def serve(cmd: list[str], env: dict[str, str], port: int, ready_s: float, what: str) -> Iterator[int]:
    """Runs ``cmd`` in a process group of its own, logging to ``$TMPDIR``; yields ``port`` once
    ``http://127.0.0.1:PORT/health`` answers 200. The log is kept only when something went wrong."""
    log = open(os.path.join(os.environ.get("TMPDIR", "/tmp"), f"agentrl-test-vllm-server-{port}.log"), "wb")
    proc = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    ok = False
    try:
        deadline = time.monotonic() + ready_s
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"{what} exited with {proc.returncode}; see {log.name}")
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2) as r:
                    if r.status == 200:
                        break
            except OSError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError(f"{what} not healthy after {ready_s:.0f} s; see {log.name}")
            time.sleep(1)
        yield port
        ok = True
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)  # the server and its engine-core child
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(10)
        log.close()
        if ok:
            os.unlink(log.name)
