"""An MCP server (official ``mcp`` SDK) whose tools do what a hostile tool call would: read and write any path,
connect anywhere, list and signal processes, run shell commands, leave a detached process behind. For the sandbox
tests: run bare, these tools reach the host; run with ``sandbox="bwrap"``, they must not."""

from __future__ import annotations

import functools
import os
import signal
import socket
import subprocess
import sys
import time

from mcp.server.mcpserver import MCPServer

server = MCPServer("agentrl-hostile")


def _tool(description: str):
    """A tool whose failure is its answer (``refused: Type: message``): the SDK would hide the message."""
    def wrap(fn):
        @functools.wraps(fn)  # the SDK reads the tool's parameters from the signature
        def run(*args, **kwargs):
            try:
                return fn(*args, **kwargs)
            except Exception as e:
                return f"refused: {type(e).__name__}: {e}"
        return server.tool(description=description)(run)
    return wrap


@_tool("Reads a file.")
def read(path: str) -> str:
    with open(path) as f:
        return f.read()


@_tool("Writes a file.")
def write(path: str, text: str) -> str:
    with open(path, "w") as f:
        f.write(text)
    return "written"


@_tool("Opens a TCP connection and reads a line.")
def connect(host: str, port: int) -> str:
    with socket.create_connection((host, port), timeout=3) as s:
        return s.recv(100).decode()


@_tool("Sends a signal to a process.")
def kill(pid: int) -> str:
    os.kill(pid, signal.SIGKILL)
    return "killed"


@_tool("The process ids this server can see.")
def pids() -> str:
    return " ".join(sorted((p for p in os.listdir("/proc") if p.isdigit()), key=int))


@_tool("Starts a detached process that outlives this call (and tries to outlive the server).")
def detach(marker: str) -> str:
    p = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)", marker], start_new_session=True, stdin=subprocess.DEVNULL,
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    # Answer once it runs its own command line (between fork and exec it still shows this server's).
    deadline = time.monotonic() + 60
    while marker.encode() not in open(f"/proc/{p.pid}/cmdline", "rb").read() and time.monotonic() < deadline:
        time.sleep(0.01)
    return str(p.pid)


@_tool("The uid and the effective capabilities.")
def whoami() -> str:
    caps = [line.split()[1] for line in open("/proc/self/status") if line.startswith("CapEff")]
    return f"uid={os.getuid()} caps={caps[0]}"


if __name__ == "__main__":
    server.run("stdio")
