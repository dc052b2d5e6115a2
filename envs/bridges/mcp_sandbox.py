"""A stdio MCP server inside a bubblewrap sandbox: :func:`bwrap_command` turns the server's command into one that
runs it there, its stdin/stdout still the MCP session (``MCPToolEnv(..., sandbox="bwrap")``).

Why not :class:`agentrl.sandboxes.BwrapSandbox`: its execs are bounded commands whose output is collected; an MCP
server is one long-lived process whose pipes are the protocol. This reuses the same isolation, for that shape:

- namespaces: ``--unshare-all`` (no network unless ``network=True``: a server that needs none gets none; its own
  PID namespace, so it sees no host process and signals none), a user namespace in which no further one can be made
  where bwrap supports it, uid/gid 1000 inside, ``--cap-drop ALL``, ``--new-session`` (no terminal injection);
- filesystem: the host's system dirs (/usr, /bin, /lib*, /etc) read-only, and read-only binds of what the command
  needs (the interpreter's prefix and venv, every path named on the command line, ``binds``); a private /proc,
  /dev, and an empty tmpfs /tmp, the only writable place, gone with the sandbox; ``--clearenv``: the host's
  environment does not leak in (``env`` is set inside);
- the project's seccomp filter (:mod:`agentrl.sandboxes.seccomp`) when libseccomp is there, handed to bwrap as an fd
  that a ``sh`` opens from a private file before exec'ing bwrap;
- lifetime: ``--die-with-parent``; the MCP SDK ends the server process (bwrap) when the session closes, and the PID
  namespace dies with bwrap's child, taking every process the server started, detached or not;
- as root, bwrap runs as an unprivileged host uid (``setpriv``), with ``prlimit`` capping memory (``memory_mb``),
  when every bound path is readable by other users; a Python installed under /root (mode 700, as pyenv's here) is
  not, and then bwrap stays host root, which the user namespace maps to uid 1000 with no capabilities: the binds
  are still read-only and nothing else of the host is there, but a file's owner bits apply, not its "other" bits.

Invariants: the returned command holds no secret (environment values are ``--setenv`` arguments: pass secrets to
servers you trust outside the sandbox); a missing bwrap raises :class:`agentrl.sandboxes.SandboxError` naming it.
"""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

from agentrl import proctemp
from agentrl.sandboxes import SandboxError
from agentrl.sandboxes.bwrap import HOST_SYSTEM_DIRS, _bin, userns_flags

# The unprivileged host uid bwrap drops to when run by root (outside the exec sandboxes' range, which starts at
# 300000): no file of the host is its own.
SANDBOX_UID = 299_999
_SECCOMP_FILE: str | None = None


def _seccomp_file() -> str | None:
    """The seccomp program written once per process to a root-only file (None when libseccomp is missing)."""
    global _SECCOMP_FILE
    if _SECCOMP_FILE is None:
        from agentrl.sandboxes import seccomp

        program = seccomp.program()
        if program is None:
            return None
        path = proctemp.make("agentrl-mcp-seccomp-", directory=False)  # removed at exit, swept if killed
        with open(path, "wb") as f:
            f.write(program)
        _SECCOMP_FILE = path
    return _SECCOMP_FILE


def _needed_paths(command: list[str]) -> list[str]:
    """Host paths the command reads: its interpreter's install (a venv and the Python it was made from) and every
    existing absolute path among its arguments (a script: its directory)."""
    paths: list[str] = []
    exe = shutil.which(command[0]) or command[0]
    if os.path.isabs(exe) and os.path.exists(exe):
        for p in (exe, os.path.realpath(exe)):
            root = Path(p).parent.parent  # .../bin/python -> the prefix or the venv
            paths.append(str(root))
            cfg = root / "pyvenv.cfg"
            if cfg.exists():
                for line in cfg.read_text().splitlines():
                    key, _, value = line.partition("=")
                    if key.strip() == "home" and value.strip():
                        paths.append(str(Path(value.strip()).parent))
    if os.path.realpath(exe) == os.path.realpath(sys.executable):
        paths += [sys.prefix, sys.base_prefix]
    for arg in command[1:]:
        if os.path.isabs(arg) and os.path.exists(arg):
            paths.append(arg if os.path.isdir(arg) else str(Path(arg).parent))
    return paths


def _others_can_read(path: str) -> bool:
    """Whether a user with no relation to the owner can reach ``path``: x on every parent, r on the path."""
    p = Path(path)
    for parent in reversed(p.parents):
        if not os.stat(parent).st_mode & 0o001:
            return False
    return bool(os.stat(p).st_mode & 0o004)


def bwrap_command(command: list[str], *, binds: list[str] | None = None, env: dict[str, str] | None = None,
                  network: bool = False, memory_mb: int | None = 2048) -> list[str]:
    """``command`` wrapped to run in a bubblewrap sandbox (see the module docstring)."""
    if not command:
        raise ValueError("bwrap_command: empty command")
    bwrap = _bin("bwrap")  # raises SandboxError naming the package when it is missing
    system = {f"/{n}" for n in HOST_SYSTEM_DIRS}
    args = ["--unshare-all", *userns_flags()]
    if network:
        args.append("--share-net")
    args += ["--die-with-parent", "--new-session", "--uid", "1000", "--gid", "1000", "--hostname", "mcp-sandbox"]
    for n in HOST_SYSTEM_DIRS:
        p = f"/{n}"
        if os.path.islink(p):
            args += ["--symlink", os.readlink(p), p]
        elif os.path.isdir(p):
            args += ["--ro-bind", p, p]
    # Before the binds: a later mount hides what is under it, so a venv or script under /tmp (a clone in /tmp, as in
    # CI) bound first would vanish under the private /tmp.
    args += ["--proc", "/proc", "--dev", "/dev", "--tmpfs", "/tmp"]
    seen: list[str] = []
    for p in [*_needed_paths(command), *(binds or [])]:
        real = os.path.abspath(p)
        if not os.path.exists(real):
            raise SandboxError(f"bwrap_command: cannot bind {p!r}: it does not exist")
        if real in seen or any(real == s or real.startswith(s + "/") for s in system) or real == "/":
            continue
        seen.append(real)
        args += ["--ro-bind", real, real]
    args += ["--chdir", "/tmp", "--clearenv"]
    full_env = {"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": "/tmp", "LANG": "C.UTF-8", **(env or {})}
    for k, v in full_env.items():
        args += ["--setenv", k, v]
    args += ["--cap-drop", "ALL"]
    seccomp_file = _seccomp_file()
    if seccomp_file is not None:
        args += ["--seccomp", "9"]
    prefix: list[str] = []
    if os.geteuid() == 0 and all(_others_can_read(p) for p in seen):
        prefix = [_bin("setpriv"), f"--reuid={SANDBOX_UID}", f"--regid={SANDBOX_UID}", "--clear-groups"]
        if memory_mb:
            prefix += [_bin("prlimit"), f"--as={int(memory_mb) << 20}", "--"]
    inner = [*prefix, bwrap, *args, "--", *command]
    if seccomp_file is None:
        return inner
    # The filter reaches bwrap as fd 9, opened (as root, before dropping to the sandbox uid) by a shell that then
    # becomes the sandbox: the MCP SDK passes no descriptors to the processes it starts.
    return [_bin("sh"), "-c", 'exec 9<"$0"; exec "$@"', seccomp_file, *inner]
