"""Which processes did *this* process start: its descendants, read from ``/proc``, for tests that assert a server
they started has ended. A machine-wide ``ps`` grep is wrong on a shared machine (another session's server of the
same name shows up), so these look only down the tree rooted at one pid (default: this process).

A descendant that was re-parented away (its parent exited and init adopted it) is no longer seen; the servers these
tests check are started as direct children of the test process, which stays alive, so they stay in its tree."""

from __future__ import annotations

import contextlib
import os
from pathlib import Path
from typing import Any, Iterator


def _parents() -> dict[int, tuple[int, str]]:
    """pid -> (parent pid, command line) for every process readable now."""
    out: dict[int, tuple[int, str]] = {}
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            stat = (d / "stat").read_text()
            cmdline = (d / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
        except OSError:  # it ended while we looked
            continue
        # the command name (field 2) is in parentheses and may hold spaces or ')': split after the last ')'
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        out[int(d.name)] = (ppid, cmdline)
    return out


def descendants(root: int | None = None) -> dict[int, str]:
    """pid -> command line of every live descendant of ``root`` (default: this process); zombies included only
    while they have a command line (the kernel empties it at exit)."""
    root = os.getpid() if root is None else root
    table = _parents()
    children: dict[int, list[int]] = {}
    for pid, (ppid, _) in table.items():
        children.setdefault(ppid, []).append(pid)
    found: dict[int, str] = {}
    todo = list(children.get(root, ()))
    while todo:
        pid = todo.pop()
        found[pid] = table[pid][1]
        todo.extend(children.get(pid, ()))
    return found


def running_descendants(marker: str, root: int | None = None) -> list[str]:
    """``"PID ARGS"`` of this process's live descendants whose command line contains ``marker``."""
    return [f"{pid} {args}" for pid, args in sorted(descendants(root).items()) if args and marker in args]


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago (for a server a test starts)."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_listening(argv: list[str], port: int, what: str, timeout_s: float = 60.0) -> "subprocess.Popen":
    """Starts ``argv`` (output discarded) and returns it once 127.0.0.1:``port`` accepts a connection; fails naming
    ``what`` if it exits first or ``timeout_s`` passes. The caller kills and waits for it."""
    import socket
    import subprocess
    import time

    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + timeout_s
    while True:  # until it listens (bounded)
        try:
            socket.create_connection(("127.0.0.1", port), 0.5).close()
            return proc
        except OSError:
            if proc.poll() is not None or time.monotonic() > deadline:
                proc.kill()
                proc.wait()
                raise AssertionError(f"{what} did not start listening on port {port}")
            time.sleep(0.05)


@contextlib.contextmanager
def serve_script(script: "str | os.PathLike") -> Iterator[tuple[Any, str]]:
    """Runs ``python SCRIPT PORT`` on a free port; yields (process, base URL) once it listens; kills it after."""
    import sys

    port = free_port()
    proc = start_listening([sys.executable, str(script), str(port)], port, f"{Path(script).name}")
    try:
        yield proc, f"http://127.0.0.1:{port}"
    finally:
        proc.kill()
        proc.wait()
