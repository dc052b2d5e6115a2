"""Temp files and directories that belong to one process: removed when it exits, swept once it is gone.

Some paths must outlive any one object and live as long as the process: the directory vLLM's sockets go to
(:mod:`agentrl.inference.rpc_dir`), the seccomp program a stdio MCP server's sandbox reads
(``agentrl.envs.bridges.mcp_sandbox``). :func:`make` names them ``<prefix><pid>-<random>`` and removes them at
interpreter exit; a process killed outright cannot, so :func:`make` first sweeps the paths of its prefix whose
process no longer runs.

Invariant: a path is removed only by the process that made it (not by a forked child, which inherits the exit
hook) or by a sweep once that PID runs no process.
"""

from __future__ import annotations

import atexit
import os
import re
import shutil
import tempfile


SOCKET_PATH_MAX = 107  # bytes of a Unix socket's path (sockaddr_un.sun_path, less its NUL)


def socket_parent(room: int) -> str:
    """The temp directory, or ``/tmp`` when the temp directory's path leaves less than ``room`` bytes of a socket's
    path for what goes under it."""
    tmp = tempfile.gettempdir()
    return tmp if len(tmp.encode()) + room <= SOCKET_PATH_MAX else "/tmp"


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _remove(path: str, owner: int) -> None:
    if os.getpid() != owner:
        return
    if os.path.isdir(path) and not os.path.islink(path):
        shutil.rmtree(path, ignore_errors=True)
    else:
        try:
            os.unlink(path)
        except OSError:
            pass


def sweep(prefix: str, parent: str | None = None) -> list[str]:
    """Removes the paths ``<prefix><pid>-*`` under ``parent`` (the temp directory) whose process no longer runs;
    returns them."""
    parent = parent or tempfile.gettempdir()
    pattern = re.compile(re.escape(prefix) + r"(\d+)-[^/]+$")
    try:
        names = os.listdir(parent)
    except OSError:
        return []
    removed = []
    for name in names:
        m = pattern.match(name)
        if m and int(m.group(1)) != os.getpid() and not _alive(int(m.group(1))):
            path = os.path.join(parent, name)
            _remove(path, os.getpid())
            removed.append(path)
    return removed


def make(prefix: str, *, directory: bool, parent: str | None = None) -> str:
    """A new private (0700 / 0600) directory or empty file ``<parent>/<prefix><pid>-<random>``, removed at this
    process's exit; sweeps the paths of ``prefix`` left by processes that are gone first."""
    sweep(prefix, parent)
    name = f"{prefix}{os.getpid()}-"
    if directory:
        path = tempfile.mkdtemp(prefix=name, dir=parent)
    else:
        fd, path = tempfile.mkstemp(prefix=name, dir=parent)
        os.close(fd)
    atexit.register(_remove, path, os.getpid())
    return path
